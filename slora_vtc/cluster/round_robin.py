"""Round robin: request k goes to replica k mod N, blind to load, prefixes and clients."""

from slora_vtc.cluster.router import Router
from slora_vtc.engine import Engine
from slora_vtc.request import Request


class RoundRobin(Router):
    """Each request to the next replica in turn."""

    stateless = True

    def __init__(self):
        self._next = 0

    def route(self, req: Request, engines: list[Engine]) -> int:
        i, self._next = self._next, (self._next + 1) % len(engines)
        return i
