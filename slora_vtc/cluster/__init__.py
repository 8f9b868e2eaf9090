"""A cluster of engines behind a router (docs/beyond.md, "A cluster"): the event loop, and the
routers on a registry like the schedulers'."""

from slora_vtc.cluster.cluster import Cluster
from slora_vtc.cluster.registry import ROUTERS, RouterEntry, build_router, register_router
from slora_vtc.cluster.router import Router, RouterOptions

__all__ = ["ROUTERS", "Cluster", "Router", "RouterEntry", "RouterOptions", "build_router", "register_router"]
