"""Seeded workload generators for every synthetic suite of the paper (DESIGN section 6).

They draw exactly as the artifact did: numpy's legacy generator seeded at the start of each
workload, rates in requests per second, the same draw order. The overload suite's arrival
times therefore match the artifact's measured runs to the bit.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from slora_vtc.config import DEFAULT_POOL_TOKENS
from slora_vtc.data import REAL_TRACE
from slora_vtc.errors import UserError
from slora_vtc.request import Request

ON_OFF_PERIOD_S = 60.0


@dataclass(frozen=True)
class RequestSpec:
    client: str
    prompt_len: int
    output_len: int
    arrival: float


@dataclass(frozen=True)
class Workload:
    name: str
    clients: tuple[str, ...]
    duration: float
    specs: tuple[RequestSpec, ...]

    def requests(self) -> list[Request]:
        """Fresh Request objects (each client has its own LoRA adapter, as in the paper)."""
        return [
            Request(s.client, s.prompt_len, s.output_len, s.arrival, rid=i, adapter=s.client)
            for i, s in enumerate(sorted(self.specs, key=lambda s: s.arrival))
        ]


def client_names(n: int) -> tuple[str, ...]:
    return tuple(f"client{i}" for i in range(n))


def _draw_lengths(rng: np.random.RandomState, n: int, lengths: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """n input lengths then n output lengths; exact values draw nothing (randint(L, L + 1))."""
    inputs = rng.randint(lengths[0], lengths[0] + 1, n)
    outputs = rng.randint(lengths[1], lengths[1] + 1, n)
    return inputs, outputs


def _uniform_client(rng, client: str, rate: float, duration: float, lengths, start=0.0, on_off=False):
    n = int(rate * duration)
    inputs, outputs = _draw_lengths(rng, n, lengths)
    # accumulated one gap at a time, as the artifact did, so times match its runs bit for bit
    times = np.add.accumulate(np.concatenate([[start + rng.rand() / rate], np.full(n, 1.0 / rate)]))[1:]
    keep = (times // ON_OFF_PERIOD_S).astype(int) % 2 == 0 if on_off else np.ones(n, bool)
    return [RequestSpec(client, int(i), int(o), float(t)) for i, o, t, k in zip(inputs, outputs, times, keep) if k]


def uniform(rates: list[float], lengths=(256, 256), on_off_first=False) -> Callable:
    """Every client sends every 1/rate s after a random phase; client 0 optionally on/off."""

    def generate(duration: float, seed: int) -> list[RequestSpec]:
        rng = np.random.RandomState(seed)
        names = client_names(len(rates))
        return [
            spec
            for i, rate in enumerate(rates)
            for spec in _uniform_client(rng, names[i], rate, duration, lengths, on_off=on_off_first and i == 0)
        ]

    return generate


def poisson_short_long(rates: tuple[float, float], drawn: tuple[int, int], client0: Callable) -> Callable:
    """One merged Poisson stream (gamma gaps, cv = 1); client 0's lengths come from `client0`."""

    def generate(duration: float, seed: int) -> list[RequestSpec]:
        rng = np.random.RandomState(seed)
        total = rates[0] + rates[1]
        n = int(total * duration)
        is_client1 = rng.rand(n) > rates[0] / total
        inputs, outputs = _draw_lengths(rng, n, drawn)
        times = np.cumsum(rng.gamma(1.0, 1.0 / total, n))
        names = client_names(2)
        specs = []
        for c1, i, o, t in zip(is_client1, inputs, outputs, times):
            i, o = (int(i), int(o)) if c1 else client0(int(i), int(o))
            specs.append(RequestSpec(names[int(c1)], i, o, float(t)))
        return specs

    return generate


def increase(duration: float, seed: int) -> list[RequestSpec]:
    """Client 0 steady at 0.5 req/s; client 1 ramps linearly from 0.2 to 2 req/s."""
    rng = np.random.RandomState(seed)
    names = client_names(2)
    n0, n1 = int(0.5 * duration), int(0.5 * (0.2 + 2) * duration)
    in0, out0 = _draw_lengths(rng, n0, (256, 256))
    in1, out1 = _draw_lengths(rng, n1, (256, 256))
    specs = [RequestSpec(names[0], int(i), int(o), (k + 1) / 0.5) for k, (i, o) in enumerate(zip(in0, out0))]
    t = 0.0
    for i, o in zip(in1, out1):
        t += 1.0 / (0.2 + 1.8 * t / duration)
        specs.append(RequestSpec(names[1], int(i), int(o), t))
    return specs


DIST_SHIFT_PHASES = ((0.5, 2.0, True), (1.0, 1.0, False), (0.5, 1.5, False))  # (rate0, rate1, client 0 on/off)


def dist_shift(duration: float, seed: int) -> list[RequestSpec]:
    """Three equal phases, each a uniform workload over its own span."""
    rng = np.random.RandomState(seed)
    names = client_names(2)
    span = duration / len(DIST_SHIFT_PHASES)
    specs = []
    for p, (r0, r1, on_off) in enumerate(DIST_SHIFT_PHASES):
        specs += _uniform_client(rng, names[0], r0, span, (256, 256), start=p * span, on_off=on_off)
        specs += _uniform_client(rng, names[1], r1, span, (256, 256), start=p * span)
    return specs


MISSING_TRACE = (
    "the '{suite}' suite replays the LMSYS Chatbot Arena trace, and {path} is missing. Either put "
    "the trace there (or point $SLORA_VTC_DATA at its folder), pass --trace FILE (JSONL "
    "or CSV with client, prompt_len, output_len, req_time), or build a trace from Chatbot Arena "
    "logs: slora-vtc trace build RAW.jsonl --rate 2.5 --duration 600 --out trace.jsonl"
)


@dataclass(frozen=True)
class Suite:
    """A workload of the paper: generated (seeded), or replayed from a trace file (`trace`)."""

    name: str
    figure: str
    description: str
    num_clients: int  # for a trace suite, the clients come from the trace
    duration: float
    generate: Callable[[float, int], list[RequestSpec]] | None = None
    pool_tokens: int = DEFAULT_POOL_TOKENS
    schedulers: tuple[str, ...] = ("vtc",)
    trace: str | None = None  # the shared data file a trace suite replays by default

    def workload(self, duration: float | None = None, seed: int = 42, trace_path: str | None = None) -> Workload:
        duration = self.duration if duration is None else duration
        if duration <= 0:
            raise UserError(f"duration must be positive, got {duration}")
        if self.trace is not None:
            return self._replay(duration, trace_path)
        specs = self.generate(duration, seed)
        return Workload(self.name, client_names(self.num_clients), duration, tuple(specs))

    def _replay(self, duration: float, trace_path: str | None) -> Workload:
        from slora_vtc.data import data_dir, data_file
        from slora_vtc.traces import read_trace, trace_workload

        path = trace_path or data_file(self.trace)
        if path is None:
            raise UserError(MISSING_TRACE.format(suite=self.name, path=data_dir() / self.trace))
        return trace_workload(self.name, read_trace(path), duration)


def _per_min(*rates: float) -> list[float]:
    return [r / 60.0 for r in rates]


def _ablation(pool_k: int, length: int, rates: tuple[int, int]) -> Suite:
    compared = ("vtc", "fcfs") if (pool_k, length) == (65, 256) else ("vtc",)
    return Suite(
        f"ablation_{pool_k}k_{length}", "15", f"2 clients {rates[0]}, {rates[1]} req/min, {length}/{length}, {pool_k}k pool",
        2, 600, uniform(_per_min(*rates), (length, length)), pool_tokens=pool_k * 1000, schedulers=compared,
    )


SUITES: dict[str, Suite] = {
    s.name: s
    for s in [
        Suite("overload", "3", "2 clients 90, 180 req/min, 256/256", 2, 600, uniform(_per_min(90, 180)), schedulers=("vtc", "fcfs")),
        Suite("proportional", "4", "3 clients 15, 30, 90 req/min, 256/256", 3, 600, uniform(_per_min(15, 30, 90))),
        Suite("on_off_less", "5", "client 0 at 30 req/min on/off, client 1 at 120", 2, 600, uniform(_per_min(30, 120), on_off_first=True)),
        Suite("on_off_overload", "6", "client 0 at 120 req/min on/off, client 1 at 180", 2, 600, uniform(_per_min(120, 180), on_off_first=True)),
        Suite("poisson_short_long", "7", "Poisson 480 req/min at 64/64 and 90 req/min at 256/256", 2, 600,
              poisson_short_long((8.0, 1.5), (256, 256), lambda i, o: (i // 4, o // 4)), schedulers=("vtc", "fcfs")),
        Suite("poisson_short_long_2", "8", "Poisson 480 req/min at 512/32 and 90 req/min at 32/512", 2, 600,
              poisson_short_long((8.0, 1.5), (32, 512), lambda i, o: (o, i)), schedulers=("vtc", "fcfs")),
        Suite("increase", "9", "client 0 at 30 req/min; client 1 ramps 12 -> 120 req/min", 2, 600, increase),
        Suite("dist_shift", "10", "3 phases: [30 on/off, 120] -> [60, 60] -> [30, 90] req/min", 2, 900, dist_shift, schedulers=("vtc", "lcf")),
        _ablation(35, 256, (180, 360)), _ablation(35, 512, (90, 180)), _ablation(35, 768, (60, 120)),
        _ablation(65, 256, (240, 480)), _ablation(65, 512, (120, 240)), _ablation(65, 768, (90, 180)),
        Suite("overload_weighted", "16", "4 clients 24, 48, 72, 96 req/min, 256/256", 4, 360,
              uniform(_per_min(24, 48, 72, 96)), schedulers=("vtc", "wvtc:1,2,3,4")),
        Suite("overload_multi", "19", "8 clients 24 x3, 36 x5 req/min, 256/256", 8, 360,
              uniform(_per_min(24, 24, 24, 36, 36, 36, 36, 36)), schedulers=("vtc", "vtc-pred:0.5", "vtc-oracle")),
        Suite("real", "11-14, 18, 20", "LMSYS Chatbot Arena trace: 27 clients, 1500 requests in 600 s", 27, 600,
              trace=REAL_TRACE, schedulers=("vtc", "fcfs", "lcf", "rpm:5", "rpm:10", "rpm:15", "rpm:20", "rpm:30")),
    ]
}


def get_suite(name: str) -> Suite:
    if name not in SUITES:
        raise UserError(f"unknown suite '{name}' (known: {', '.join(SUITES)})")
    return SUITES[name]


def workload_from_result(name: str, result) -> Workload:
    """The requests a result file records, replayable: client, lengths and send times."""
    specs = tuple(RequestSpec(r.client, r.prompt_len, r.output_len, r.req_time) for r in result.responses)
    duration = float(result.config.get("duration", max((s.arrival for s in specs), default=0.0)))
    return Workload(name, tuple(result.clients), duration, specs)
