"""The artifact's pickled trace, read without ever running its code.

The artifact pickled a list of its request records. A normal unpickler would import and call
whatever globals a pickle names, so a malicious file could run anything. This one accepts only
plain containers and a class named `Request` (from any module), which it replaces by an inert
record; any other global is refused before anything is called.
"""

import io
import pickle
from pathlib import Path

from slora_vtc.errors import UserError
from slora_vtc.traces.files import first_line


class ArtifactRequest:
    """Stand-in for the artifact's request record: it only stores attributes."""

    def __setstate__(self, state):
        if isinstance(state, tuple):  # (dict, slots dict) for classes with __slots__
            state = {k: v for part in state if isinstance(part, dict) for k, v in part.items()}
        if not isinstance(state, dict):
            raise pickle.UnpicklingError("a Request record's state must be a dict")
        self.__dict__.update(state)


ALLOWED = {
    ("builtins", "list"),
    ("builtins", "dict"),
    ("builtins", "tuple"),
    ("builtins", "set"),
    ("builtins", "object"),
    ("copyreg", "_reconstructor"),
    ("collections", "OrderedDict"),
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if name == "Request":
            return ArtifactRequest
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing global '{module}.{name}'")


def load_artifact_pickle(path: Path, pickled: bytes) -> list:
    try:
        data = _RestrictedUnpickler(io.BytesIO(pickled)).load()
    except Exception as e:  # a damaged pickle fails in many ways; find_class refused anything that could run code
        raise UserError(f"{path}: not a trace pickle this reader accepts ({first_line(e)})") from None
    if isinstance(data, dict) and "requests" in data:
        data = data["requests"]
    if not isinstance(data, (list, tuple)):
        raise UserError(f"{path}: expected a list of request records, got {type(data).__name__}")
    return list(data)
