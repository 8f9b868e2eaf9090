"""Least load: the replica with the fewest tokens waiting and running."""

from slora_vtc.cluster.router import Router
from slora_vtc.engine import Engine
from slora_vtc.request import Request


def request_tokens(req: Request) -> int:
    return req.prompt_len + req.max_new_tokens


class LeastLoad(Router):
    """Each request to the replica with the fewest outstanding tokens (the first of those).

    A replica's load is what the router sent it and has not ended: every waiting and running
    request counted at its prompt plus output tokens (what a router knows, without asking the
    engine how far each has got).
    """

    def __init__(self):
        self._load: list[int] = []

    def route(self, req: Request, engines: list[Engine]) -> int:
        if not self._load:
            self._load = [0] * len(engines)
        i = min(range(len(self._load)), key=self._load.__getitem__)
        self._load[i] += request_tokens(req)
        return i

    def on_end(self, req: Request, replica: int) -> None:
        if replica >= 0:
            self._load[replica] -= request_tokens(req)

    @property
    def loads(self) -> list[int]:
        return list(self._load)
