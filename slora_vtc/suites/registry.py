"""Every suite by name. A new suite: a generator in its own file, plus one entry here (or
`register_suite` from outside the package; see docs/extending.md)."""

from slora_vtc.data import REAL_TRACE
from slora_vtc.errors import UserError
from slora_vtc.suites.base import Suite
from slora_vtc.suites.paper import dist_shift, increase, per_min, poisson_short_long, uniform
from slora_vtc.suites.prefix import prefix_suites


def _ablation(pool_k: int, length: int, rates: tuple[int, int]) -> Suite:
    compared = ("vtc", "fcfs") if (pool_k, length) == (65, 256) else ("vtc",)
    return Suite(
        f"ablation_{pool_k}k_{length}",
        "15",
        f"2 clients {rates[0]}, {rates[1]} req/min, {length}/{length}, {pool_k}k pool",
        2,
        600,
        uniform(per_min(*rates), (length, length)),
        pool_tokens=pool_k * 1000,
        schedulers=compared,
    )


SUITES: dict[str, Suite] = {
    s.name: s
    for s in [
        Suite(
            "overload",
            "3",
            "2 clients 90, 180 req/min, 256/256",
            2,
            600,
            uniform(per_min(90, 180)),
            schedulers=("vtc", "fcfs"),
        ),
        Suite("proportional", "4", "3 clients 15, 30, 90 req/min, 256/256", 3, 600, uniform(per_min(15, 30, 90))),
        Suite(
            "on_off_less",
            "5",
            "client 0 at 30 req/min on/off, client 1 at 120",
            2,
            600,
            uniform(per_min(30, 120), on_off_first=True),
        ),
        Suite(
            "on_off_overload",
            "6",
            "client 0 at 120 req/min on/off, client 1 at 180",
            2,
            600,
            uniform(per_min(120, 180), on_off_first=True),
        ),
        Suite(
            "poisson_short_long",
            "7",
            "Poisson 480 req/min at 64/64 and 90 req/min at 256/256",
            2,
            600,
            poisson_short_long((8.0, 1.5), (256, 256), lambda i, o: (i // 4, o // 4)),
            schedulers=("vtc", "fcfs"),
        ),
        Suite(
            "poisson_short_long_2",
            "8",
            "Poisson 480 req/min at 512/32 and 90 req/min at 32/512",
            2,
            600,
            poisson_short_long((8.0, 1.5), (32, 512), lambda i, o: (o, i)),
            schedulers=("vtc", "fcfs"),
        ),
        Suite("increase", "9", "client 0 at 30 req/min; client 1 ramps 12 -> 120 req/min", 2, 600, increase),
        Suite(
            "dist_shift",
            "10",
            "3 phases: [30 on/off, 120] -> [60, 60] -> [30, 90] req/min",
            2,
            900,
            dist_shift,
            schedulers=("vtc", "lcf"),
        ),
        _ablation(35, 256, (180, 360)),
        _ablation(35, 512, (90, 180)),
        _ablation(35, 768, (60, 120)),
        _ablation(65, 256, (240, 480)),
        _ablation(65, 512, (120, 240)),
        _ablation(65, 768, (90, 180)),
        Suite(
            "overload_weighted",
            "16",
            "4 clients 24, 48, 72, 96 req/min, 256/256",
            4,
            360,
            uniform(per_min(24, 48, 72, 96)),
            schedulers=("vtc", "wvtc:1,2,3,4"),
        ),
        Suite(
            "overload_multi",
            "19",
            "8 clients 24 x3, 36 x5 req/min, 256/256",
            8,
            360,
            uniform(per_min(24, 24, 24, 36, 36, 36, 36, 36)),
            schedulers=("vtc", "vtc-pred:0.5", "vtc-oracle"),
        ),
        Suite(
            "real",
            "11-14, 18, 20",
            "LMSYS Chatbot Arena trace: 27 clients, 1500 requests in 600 s",
            27,
            600,
            trace=REAL_TRACE,
            schedulers=("vtc", "fcfs", "lcf", "rpm:5", "rpm:10", "rpm:15", "rpm:20", "rpm:30"),
        ),
        *prefix_suites(),  # beyond the paper: requests sharing prefixes, after the DLPM paper (suites/prefix.py)
    ]
}


def get_suite(name: str) -> Suite:
    if name not in SUITES:
        raise UserError(f"unknown suite '{name}' (known: {', '.join(SUITES)})")
    return SUITES[name]


def register_suite(suite: Suite) -> Suite:
    """Add a suite (from a plugin); a name that is taken is an error."""
    if suite.name in SUITES:
        raise UserError(f"suite '{suite.name}' is already registered")
    SUITES[suite.name] = suite
    return suite
