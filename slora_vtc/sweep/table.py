"""The sweep's parquet table: one row per cell. Every new row rewrites the file whole, to a
temporary file renamed over it, so an interrupted sweep keeps every row it had finished."""

import os
from pathlib import Path

from slora_vtc.errors import UserError
from slora_vtc.sweep.cell import OK


class SweepTable:
    """The rows of one table file (read when it exists); `add` replaces a cell's earlier row.
    One sweep writes a table at a time: two at once would each rename their own rows over the file."""

    def __init__(self, path: Path):
        import pandas as pd  # here: the CLI starts faster

        self.path = path
        self.frame = read_table(path) if path.exists() else pd.DataFrame()

    def finished(self) -> set[str]:
        """Ids of the cells whose row says ok: a rerun skips them."""
        if self.frame.empty:
            return set()
        return set(self.frame.loc[self.frame["status"] == OK, "cell"])

    def add(self, row: dict) -> None:
        import pandas as pd

        new = pd.DataFrame([row])
        kept = self.frame[self.frame["cell"] != row["cell"]] if not self.frame.empty else self.frame
        self.frame = new if kept.empty else pd.concat([kept, new], ignore_index=True)
        self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self.frame.to_parquet(tmp, index=False)
        os.replace(tmp, self.path)


def read_table(path: Path):
    """A sweep table as a DataFrame; a file that is not one is a one-line error."""
    import pandas as pd
    import pyarrow

    if path.is_dir():
        raise UserError(f"{path}: is a directory, not a sweep table (a .parquet file)")
    try:
        frame = pd.read_parquet(path)
    except OSError as e:
        raise UserError(f"{path}: cannot read sweep table ({e.strerror or e})") from None
    except (pyarrow.ArrowException, ValueError):
        raise UserError(f"{path}: not a sweep table (not a parquet file)") from None
    missing = [c for c in ("cell", "status") if c not in frame.columns]
    if missing:
        raise UserError(f"{path}: not a sweep table (no '{missing[0]}' column)")
    return frame
