"""Routers by name, built from a spec string such as `round-robin`, `prefix-affinity:32` or `d2lpm:20000`."""

from collections.abc import Callable
from dataclasses import dataclass

from slora_vtc.cluster.global_vtc import GlobalVTC
from slora_vtc.cluster.least_load import LeastLoad
from slora_vtc.cluster.prefix_affinity import PrefixAffinity
from slora_vtc.cluster.round_robin import RoundRobin
from slora_vtc.cluster.router import Router, RouterOptions
from slora_vtc.errors import UserError
from slora_vtc.specs import positive_arg, register_spec, resolve_spec

Factory = Callable[[str | None, RouterOptions], Router]


@dataclass(frozen=True)
class RouterEntry:
    factory: Factory
    help: str
    arg: str | None = None  # name of the argument, if any (required unless `optional`)
    optional: bool = False

    def usage(self, name: str) -> str:
        if not self.arg:
            return name
        return f"{name}:[{self.arg}]" if self.optional else f"{name}:{self.arg}"


def _prefix_affinity(arg: str | None, o: RouterOptions) -> PrefixAffinity:
    return (
        PrefixAffinity()
        if arg is None
        else PrefixAffinity(positive_arg("router", f"prefix-affinity:{arg}", arg, "the prefix length", int))
    )


def _d2lpm(quantum: float) -> Router:
    from slora_vtc.cluster.d2lpm import D2LPM  # (and numpy): only when it routes

    return D2LPM(quantum)


ROUTERS: dict[str, RouterEntry] = {
    "round-robin": RouterEntry(lambda a, o: RoundRobin(), "request k to replica k mod N"),
    "least-load": RouterEntry(lambda a, o: LeastLoad(), "the replica with the fewest waiting + running tokens"),
    "prefix-affinity": RouterEntry(
        _prefix_affinity,
        "consistent hashing of the first K prompt token ids (default 64; the client without ids)",
        "K",
        optional=True,
    ),
    "d2lpm": RouterEntry(
        lambda a, o: _d2lpm(positive_arg("router", f"d2lpm:{a}", a, "the quantum")),
        "D2LPM: per-(client, replica) deficits refilled by Q_w, longest prefix match, least outstanding "
        "(replicas run dlpm:Q_u)",
        "QW",
    ),
    "global-vtc": RouterEntry(
        lambda a, o: GlobalVTC(o),
        "replicas pull from one cluster-wide --scheduler (a VTC: least service first); "
        "--routers K: K routers synchronised every --router-sync s",
    ),
}


def register_router(name: str, entry: RouterEntry) -> RouterEntry:
    """Add a router (from a plugin); a name that is taken is an error."""
    return register_spec("router", name, entry, ROUTERS)


def build_router(spec: str, options: RouterOptions = RouterOptions()) -> Router:
    """Build a router from `name` or `name:ARG`; raise UserError naming what is wrong."""
    entry, arg = resolve_spec("router", spec, ROUTERS)
    router = entry.factory(arg, options)
    if options.routers > 1 and not router.instances:
        raise UserError(
            f"--routers {options.routers}: only global-vtc has router instances with their own counters, "
            f"not '{spec.partition(':')[0]}'"
        )
    return router
