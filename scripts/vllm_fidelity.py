"""Does the simulator predict real vLLM? Issue 20's check, run in one session on one machine.

1. Starts vLLM for CPUs with our plugin (`vtc`) and its step log, on a random Llama built here
   (hidden 512, 8 layers: on this machine its steps, not the HTTP path, bound the serving), and
   replays a calibration trace with `slora-vtc bench-http --api openai`: two tenants, Poisson
   arrivals at rising rates, prompts of 8-1,500 tokens and outputs of 8-256, both log-uniform, so
   that steps of every kind and size run, full batches over short contexts as over long ones (the
   model is fitted where the workloads will run, not extrapolated there). `slora-vtc calibrate
   --vllm-steps` fits a testbed to the steps of that run.
2. Scales the paper's workloads to this model's speed: time is stretched by the ratio of the
   simulated throughputs on the overload suite (the paper's A10G testbed over the calibrated one),
   so each workload loads vLLM as the paper's loaded the A10G; the first `--seconds` of each are
   replayed: `overload` (Fig 3), `poisson_short_long_2` (Fig 8) and `real` (the LMSYS trace's
   arrivals and lengths, Fig 11-14); of `on_off_overload` (Fig 6), its seconds 100 to 130, where
   client 0 comes back after 20 s off.
3. Replays each workload through vLLM with the plugin's `vtc` (the same server) and then `fcfs` (a
   second start), with bench-http, each run with prompts of its own (`--prompt-seed`: vLLM's prefix
   cache, on as by default, finds nothing of an earlier run's), until every request has finished.
   Then, under memory pressure, three of them again through `vtc` on a third start whose KV cache is
   cut to SMALL_KV_BLOCKS blocks (`--num-gpu-blocks-override`), so that vLLM preempts.
4. Simulates each run: `slora-vtc replay TRACE --batching chunked --testbed TESTBED` with vLLM's
   step settings, KV cache size (read from its log) and prefix cache (on, as vLLM's: a preempted
   request finds its own blocks again), and compares: throughput (prompt and output
   tokens over the time to the last finish) within 5%, each tenant's share of the service while
   requests arrive within 3 points, each tenant's mean time to first token within 10% or 0.5 s
   (tenants with at least 20 finished requests). Beside each prediction, how much it moves when the
   arrivals move a little: the same replay with each arrival up to 50 ms later (`--jitter-ms`, about
   how long a request of a burst took here to reach the engine through an HTTP server), over 8
   seeds. A miss far outside that band is the simulator's, not the arrivals' timing. And each run
   simulated again at the speed vLLM's steps ran at during it (the testbed's step times multiplied by
   that run's measured / calibrated ratio): what is left of an error then is not the machine's drift
   since the calibration. The runs under memory pressure also count preemptions (vLLM's from its step
   log, the simulator's from its result file), and are simulated once more without the prefix cache.
   Last, each run at its speed with the arrivals vLLM's engine saw: the step log counts the requests
   handed to vLLM's scheduler before each step (`arrived`), after its HTTP server took them in; each
   request arrives then at the start of the step that counted it (`{run}.intake.json`), the times
   moved together so that the earliest is no later than its send time.

Writes benchmarks/results/vllm_fidelity/ (traces, result files, the calibration's steps, the testbed) and
benchmarks/results/vllm_fidelity.json (what docs/vllm.md and paper_repro.md quote). Run it on a quiet
machine (nothing else running): the calibration holds only for the conditions it was measured in.

    .venv/bin/python scripts/vllm_fidelity.py --vllm-python .venv-vllm/bin/python
    .venv/bin/python scripts/vllm_fidelity.py --vllm-python .venv-vllm/bin/python --compare-only
"""

import argparse
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import machine_info  # noqa: E402
from benchmarks.vllm_compare import bench, server, vllm_command, warm_up  # noqa: E402
from slora_vtc import metrics  # noqa: E402
from slora_vtc.calibrate_steps import TERMS as STEP_TERMS  # noqa: E402
from slora_vtc.calibrate_steps import VllmStepModel  # noqa: E402
from slora_vtc.results import read_results  # noqa: E402
from slora_vtc.steplog import StepRecord, read_step_log  # noqa: E402
from slora_vtc.suites import get_suite  # noqa: E402
from slora_vtc.traces import read_trace, write_trace  # noqa: E402
from slora_vtc.workload import RequestSpec  # noqa: E402
from tests.vllm.server import CPU_ENV, plugin_args  # noqa: E402

OUT = REPO / "benchmarks" / "results" / "vllm_fidelity"
SUMMARY = REPO / "benchmarks" / "results" / "vllm_fidelity.json"
TABLE = REPO / "benchmarks" / "results" / "vllm_fidelity.md"  # included whole by docs/vllm.md and paper_repro.md
# where the replayed piece of each suite starts (s of the suite) and how long it lasts there (None: --seconds
# of wall time); the on/off piece holds client 0's return at 120 s, after 20 s off: the moment VTC's lift is for
WORKLOADS = {
    "overload": (0.0, None),
    "on_off_overload": (100.0, 30.0),
    "poisson_short_long_2": (0.0, None),
    "real": (0.0, None),
}
SCHEDULERS = ("vtc", "fcfs")  # the first also serves the calibration run
# one more server under memory pressure: the plugin's vtc with vLLM's KV cache cut to this many blocks, so that
# it preempts; the workloads it replays (the same traces)
SMALL_KV = "vtc-small-kv"
SMALL_KV_BLOCKS = 24
SMALL_KV_WORKLOADS = ("overload", "poisson_short_long_2", "real")
TARGETS = {"throughput": 0.05, "share_points": 3.0, "ttft_relative": 0.10, "ttft_absolute_s": 0.5}
MIN_REQUESTS = 20  # a tenant's mean TTFT is compared from this many finished requests
RATIO_WINDOW_S = 4.0  # each run's step-time ratio is also recorded over windows this long
JITTER_MS, JITTER_SEEDS = 50.0, 8  # the sensitivity band: each arrival up to this much later, over this many seeds
CALIBRATION_RATES = (1.0, 2.0, 4.0, 8.0)  # requests/s, one phase each
PROMPTS, OUTPUTS = (8, 1500), (8, 256)  # lengths drawn log-uniformly between these


@dataclass(frozen=True)
class Settings:
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512
    block_size: int = 128
    seconds: float = 30.0  # of each workload's arrivals
    deadline: float = 400.0  # a run still going then is cut (every request should have finished long before)
    calibration_phase_s: float = 20.0
    port: int = 8160

    def vllm_args(self) -> list[str]:
        return [
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
            "--block-size", str(self.block_size),
        ]  # fmt: skip

    def sim_args(self, prefix_cache: bool = True) -> list[str]:
        """vLLM's step settings, and its prefix cache (on by default): a preempted request's blocks stay
        cached, and its next prefill finds them."""
        return [
            "--batching", "chunked", "--max-num-seqs", str(self.max_num_seqs),
            "--max-num-batched-tokens", str(self.max_num_batched_tokens), "--block-size", str(self.block_size),
            "--prefix-cache", "on" if prefix_cache else "off",
        ]  # fmt: skip


# -- traces ---------------------------------------------------------------------------------------


def calibration_trace(s: Settings, seed: int = 7) -> list[RequestSpec]:
    """Two tenants, one Poisson phase per rate, log-uniform lengths."""
    rng, records, t = random.Random(seed), [], 0.0
    for phase, rate in enumerate(CALIBRATION_RATES):
        end = (phase + 1) * s.calibration_phase_s
        while (t := t + rng.expovariate(rate)) < end:
            records.append(RequestSpec(rng.choice("ab"), _log_uniform(rng, *PROMPTS), _log_uniform(rng, *OUTPUTS), t))
    return records


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return min(high, max(low, round(math.exp(rng.uniform(math.log(low), math.log(high))))))


def scaled_workload(suite: str, stretch: float, start: float, span: float) -> list[RequestSpec]:
    """The suite's requests arriving in [start, start + span), from 0 on and `stretch` times later."""
    specs = get_suite(suite).workload(start + span).specs
    kept = [r for r in specs if start <= r.arrival < start + span]
    moved = (RequestSpec(r.client, r.prompt_len, r.output_len, (r.arrival - start) * stretch) for r in kept)
    return sorted(moved, key=lambda r: r.arrival)


# -- the simulator --------------------------------------------------------------------------------


def simulate(
    trace: Path,
    scheduler: str,
    testbed: Path,
    pool: int,
    s: Settings,
    out: Path,
    duration: float,
    horizon=None,
    jitter: tuple[float, int] | None = None,
    prefix_cache: bool = True,
) -> Path:
    """`slora-vtc replay` of the trace, as vLLM served it: its step settings, pool, no adapters, no
    BOS added (bench-http sends token ids), cut at the deadline; `jitter`: (ms, seed) of `--jitter-ms`."""
    cmd = [sys.executable, "-m", "slora_vtc", "replay", str(trace), "--scheduler", scheduler]
    cmd += ["--testbed", str(testbed), "--pool-tokens", str(pool), "--added-tokens", "0", "--adapters", "0"]
    cmd += [*s.sim_args(prefix_cache), "--out", str(out)]
    cmd += ["--duration", str(duration), "--horizon", str(horizon or s.deadline)]
    if jitter is not None:
        cmd += ["--jitter-ms", str(jitter[0]), "--seed", str(jitter[1])]
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL)
    return out


def stretch_factor(testbed: Path, pool: int, s: Settings) -> float:
    """How much slower than the paper's A10G this model serves: the ratio of the two simulated
    throughputs (the A10G with the paper's engine, this model as calibrated and configured) on a
    burst of the overload suite's requests (its first minute, all sent at once)."""
    burst = [RequestSpec(r.client, r.prompt_len, r.output_len, 0.0) for r in scaled_workload("overload", 1, 0, 60)]
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "burst.jsonl"
        write_trace(burst, trace)
        paper = Path(folder) / "a10g.jsonl"
        cmd = [sys.executable, "-m", "slora_vtc", "replay", str(trace), "--scheduler", "fcfs", "--duration", "1"]
        subprocess.run([*cmd, "--out", str(paper)], check=True, stdout=subprocess.DEVNULL)
        here = simulate(trace, "fcfs", testbed, pool, s, Path(folder) / "here.jsonl", duration=1, horizon=1e9)
        return _throughput(paper) / _throughput(here)


def _throughput(path: Path) -> float:
    (result,) = read_results(path)
    return metrics.throughput(result)


# -- vLLM -----------------------------------------------------------------------------------------


def kv_cache_tokens(log: Path) -> int:
    """The KV cache size vLLM's log states (its blocks x the block size)."""
    found = re.search(r"KV cache size: ([\d,]+) tokens", log.read_text(errors="replace"))
    if not found:
        raise RuntimeError(f"{log}: vLLM's log does not say its KV cache size")
    return int(found.group(1).replace(",", ""))


def usable_tokens(kv_cache_tokens: int, s: Settings) -> int:
    """What requests can hold of vLLM's KV cache, the simulator's pool: one block is vLLM's null
    block, never handed out (its step log's kv_tokens never exceeds the rest)."""
    return kv_cache_tokens - s.block_size


def serve_runs(args, s: Settings, label: str, runs: list[str], calibrate: bool, blocks: int | None = None) -> dict:
    """One vLLM start with the plugin running the scheduler `label` names (its first word), its KV
    cache cut to `blocks` if given: the calibration run first if asked, then the workloads already
    written; returns what the runs need to be simulated."""
    scheduler = label.split("-")[0]
    step_log = args.logs / f"steps_{label}.jsonl"  # beside vLLM's log; the calibration's steps are kept
    config = {"scheduler": scheduler, "step_log": str(step_log)}
    url = f"http://127.0.0.1:{s.port}"
    extra = [*plugin_args(config), *s.vllm_args()]
    if blocks is not None:
        extra += ["--num-gpu-blocks-override", str(blocks)]
    cmd = vllm_command(args.vllm_python, str(args.model_dir), s.port, s.max_num_seqs, extra)
    env = {**os.environ, **CPU_ENV, "PYTHONPATH": str(REPO)}
    with server(f"vllm-{label}", cmd, env, f"{url}/v1/models", args.logs) as log:
        warm_up(url)
        pool = kv_cache_tokens(log)
        if calibrate:
            calibrate_on(url, step_log, s)
            runs = write_workloads(s, usable_tokens(pool, s))
        conditions = {name: one_run(url, step_log, label, k, name, s) for k, name in enumerate(runs)}
    return {"scheduler": scheduler, "pool_tokens": pool, "runs": conditions}


def one_run(url: str, step_log: Path, label: str, k: int, name: str, s: Settings) -> dict:
    """bench-http of one workload, with prompts this server never saw (no prefix-cache hit across runs);
    how the machine ran it: the load average, how long vLLM's steps took against the calibrated
    model's time for the same steps (1: as during the calibration; above: the machine was slower), and
    how many requests vLLM preempted."""
    print(f"[vllm-{label}] {name}", flush=True)
    out, seed = OUT / f"{name}_{label}.vllm.jsonl", 10 * ([*SCHEDULERS, SMALL_KV].index(label) + 1) + k
    before, load = _lines(step_log), os.getloadavg()[0]
    bench(OUT / f"{name}.trace.jsonl", url, out, s.deadline, s.deadline, prompt_seed=seed)
    steps = read_step_log(step_log)[before:]  # one line a step: the lines after `before` are the run's
    intake = [round(r.t, 4) for r in steps for _ in range(r.arrived)]  # each request's step start, in order
    (OUT / f"{name}_{label}.intake.json").write_text(json.dumps({"t": intake}) + "\n")
    model = VllmStepModel.from_json(json.loads((OUT / "testbed.json").read_text()))
    return {
        "loadavg_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
        "step_time_ratio": _step_ratio(steps, model),
        "step_time_ratio_by_window": _step_ratio_by_window(steps, model),
        "decode_context_p10_p90": context_range(steps),
        "vllm_preempted": sum(step.preempted for step in steps),
    }


def context_range(steps: list[StepRecord]) -> list[int]:
    """The 10th and 90th percentiles of the tokens decode steps attended over: where a run's steps lie."""
    contexts = sorted(r.context_tokens for r in steps if r.decode_reqs)
    return [contexts[len(contexts) // 10], contexts[9 * len(contexts) // 10]] if contexts else [0, 0]


def _step_ratio_by_window(steps: list[StepRecord], model: VllmStepModel) -> list[list[float]]:
    """_step_ratio over each RATIO_WINDOW_S of the run, from its first step: [window start (s), ratio],
    where the machine ran faster or slower than its average over the run (windows without a busy step left out)."""
    if not steps:
        return []
    windows: dict[int, list[StepRecord]] = {}
    for r in steps:
        windows.setdefault(int((r.t - steps[0].t) // RATIO_WINDOW_S), []).append(r)
    ratios = ((k * RATIO_WINDOW_S, _step_ratio(window, model)) for k, window in sorted(windows.items()))
    return [[start, round(ratio, 3)] for start, ratio in ratios if ratio is not None]


def _step_ratio(steps: list[StepRecord], model: VllmStepModel) -> float | None:
    """vLLM's time for the busy steps over what the calibrated `model` gives them (None: no busy step)."""
    busy = [r for r in steps if r.prefill_tokens or r.decode_reqs]
    if not busy:
        return None
    fitted = sum(model.mixed_time(*(getattr(r, t) for t in STEP_TERMS)) - model.gap_s for r in busy)
    return sum(r.wall_s for r in busy) / fitted


def calibrate_on(url: str, step_log: Path, s: Settings) -> None:
    """The calibration run; its steps (those after the warm-up) fitted into testbed.json."""
    trace = OUT / "calibration.trace.jsonl"
    write_trace(calibration_trace(s), trace)
    before = _lines(step_log)
    bench(trace, url, OUT / "calibration.vllm.jsonl", s.deadline, s.deadline, prompt_seed=1)
    lines = step_log.read_text().splitlines()[before:]
    (OUT / "calibration.steps.jsonl").write_text("\n".join(lines) + "\n")
    contexts = context_range(read_step_log(OUT / "calibration.steps.jsonl"))
    (OUT / "calibration.json").write_text(json.dumps({"decode_context_p10_p90": contexts}) + "\n")
    cmd = [sys.executable, "-m", "slora_vtc", "calibrate", "--vllm-steps", str(OUT / "calibration.steps.jsonl")]
    subprocess.run([*cmd, "--out", str(OUT / "testbed.json")], check=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def write_workloads(s: Settings, pool: int) -> list[str]:
    """Each workload's trace, and how long its arrivals last (s), in `scaling.json`."""
    stretch = stretch_factor(OUT / "testbed.json", pool, s)
    print(f"the paper's workloads stretched {stretch:.2f}x in time", flush=True)
    arrivals = {}
    for name, (start, span) in WORKLOADS.items():
        span = s.seconds / stretch if span is None else span
        write_trace(scaled_workload(name, stretch, start, span), OUT / f"{name}.trace.jsonl")
        arrivals[name] = span * stretch
    (OUT / "scaling.json").write_text(json.dumps({"stretch": stretch, "arrivals_s": arrivals}) + "\n")
    return list(WORKLOADS)


# -- the comparison -------------------------------------------------------------------------------


def observed(path: Path, seconds: float) -> dict:
    """Of one result file: throughput (prompt and output tokens of the finished requests over the time
    until the last finished), each tenant's share of the service while requests arrive ([0, seconds],
    the paper's cost), and each tenant's mean TTFT."""
    (result,) = read_results(path)
    done = result.array("status") == "finished"
    makespan = float((result.array("req_time") + result.array("request_latency"))[done].max())
    tokens = float((result.array("prompt_len") + result.array("output_len"))[done].sum())
    service = metrics.window_service_rates(result, 0.0, seconds)
    total = sum(service.values()) or 1.0
    finished = {c: int((done & (result.array("client") == c)).sum()) for c in result.clients}
    return {
        "throughput_tok_s": tokens / makespan,
        "share_pct": {c: 100.0 * service.get(c, 0.0) / total for c in result.clients},
        "ttft_mean_s": {c: metrics.mean_response_time(result, c) for c in result.clients},
        "finished": finished,
        "counts": {k: result.count(k) for k in ("finished", "aborted", "rejected")},
        "preemptions": int(result.array("preemptions").sum()),  # the simulator's (vLLM's come from its step log)
    }


def verdict(real: dict, sim: dict) -> dict:
    throughput_error = sim["throughput_tok_s"] / real["throughput_tok_s"] - 1.0
    share_points = max(abs(sim["share_pct"].get(c, 0.0) - v) for c, v in real["share_pct"].items())
    ttft = {
        c: (sim["ttft_mean_s"].get(c, float("nan")), v)
        for c, v in real["ttft_mean_s"].items()
        if real["finished"].get(c, 0) >= MIN_REQUESTS
    }
    ttft_ok = all(abs(p - m) <= max(TARGETS["ttft_relative"] * m, TARGETS["ttft_absolute_s"]) for p, m in ttft.values())
    return {
        "throughput_error": throughput_error,
        "throughput_ok": abs(throughput_error) <= TARGETS["throughput"],
        "share_points": share_points,
        "shares_ok": share_points <= TARGETS["share_points"],
        "ttft_pairs": {c: {"sim": p, "vllm": m} for c, (p, m) in ttft.items()},
        "ttft_ok": ttft_ok,
    }


def compare(s: Settings, runs: dict, arrivals_s: dict[str, float]) -> dict:
    testbed, table = OUT / "testbed.json", {}
    for label, info in runs.items():
        scheduler, pool = info.get("scheduler", label), usable_tokens(info["pool_tokens"], s)
        for name in info["runs"]:
            seconds = arrivals_s[name]
            real, trace = OUT / f"{name}_{label}.vllm.jsonl", OUT / f"{name}.trace.jsonl"
            out = OUT / f"{name}_{label}.sim.jsonl"
            sim = simulate(trace, scheduler, testbed, pool, s, out, duration=seconds)
            measured, predicted = observed(real, seconds), observed(sim, seconds)
            machine = info.get("runs", {}).get(name, {})
            row = table[f"{name}/{label}"] = {"vllm": measured, "sim": predicted, **verdict(measured, predicted)}
            row.update(machine)
            band, shares = jitter_band(trace, scheduler, testbed, pool, s, seconds, measured)
            row["ttft_jitter_band"] = {tenant: band[tenant] for tenant in row["ttft_pairs"]}
            row["share_points_jitter_band"] = shares
            if "step_time_ratio" in machine:
                ratio = machine["step_time_ratio"]
                at_speed = at_run_speed(trace, scheduler, testbed, pool, s, seconds, ratio)
                row["at_run_speed"] = {**verdict(measured, at_speed), "preemptions": at_speed["preemptions"]}
                if label == SMALL_KV:  # how far arrival jitter moves the count; and without the prefix cache
                    row["at_run_speed"]["preemptions_jitter_band"] = _spread(
                        at_run_speed(trace, scheduler, testbed, pool, s, seconds, ratio, jitter=(JITTER_MS, seed))[
                            "preemptions"
                        ]
                        for seed in range(JITTER_SEEDS)
                    )
                    without = at_run_speed(trace, scheduler, testbed, pool, s, seconds, ratio, prefix_cache=False)
                    row["without_prefix_cache"] = {**verdict(measured, without), "preemptions": without["preemptions"]}
                intake = OUT / f"{name}_{label}.intake.json"
                if intake.exists():
                    replay = partial(at_run_speed, scheduler=scheduler, testbed=testbed, pool=pool, s=s,
                                     seconds=seconds, ratio=ratio)  # fmt: skip
                    row["at_intake"] = at_intake(trace, intake, measured, replay)
            print(_row(name, label, row), flush=True)
    return table


def jitter_band(
    trace: Path, scheduler: str, testbed: Path, pool: int, s: Settings, seconds: float, measured: dict
) -> tuple[dict, list[float]]:
    """Over replays whose arrivals come up to JITTER_MS later (one seed each): each tenant's predicted
    mean TTFT, lowest and highest (the table keeps the compared tenants', 20+ finished requests), and
    the lowest and highest of the largest share error against `measured` (vLLM's run)."""
    band: dict[str, list[float]] = {}
    share_points = []
    with tempfile.TemporaryDirectory() as folder:
        for seed in range(JITTER_SEEDS):
            out = Path(folder) / f"{seed}.jsonl"
            simulate(trace, scheduler, testbed, pool, s, out, duration=seconds, jitter=(JITTER_MS, seed))
            predicted = observed(out, seconds)
            for tenant, ttft in predicted["ttft_mean_s"].items():
                low, high = band.get(tenant, [ttft, ttft])
                band[tenant] = [min(low, ttft), max(high, ttft)]
            share_points.append(verdict(measured, predicted)["share_points"])
    return band, _spread(share_points)


def at_run_speed(
    trace: Path,
    scheduler: str,
    testbed: Path,
    pool: int,
    s: Settings,
    seconds: float,
    ratio: float,
    prefix_cache: bool = True,
    jitter: tuple[float, int] | None = None,
) -> dict:
    """What the simulator predicts for the run with its step times scaled to the run's measured speed
    (`ratio`, the run's step_time_ratio: vLLM's steps in the run over the calibrated model's time for
    them); `jitter` as simulate's."""
    model = json.loads(testbed.read_text())
    for term in ("base_s", "prefill_token_s", "prefill_pair_s", "decode_req_s", "context_token_s"):  # not gap_s
        model[term] *= ratio
    with tempfile.TemporaryDirectory() as folder:
        scaled = Path(folder) / "testbed.json"
        scaled.write_text(json.dumps(model))
        out = Path(folder) / "sim.jsonl"
        return observed(
            simulate(trace, scheduler, scaled, pool, s, out, seconds, prefix_cache=prefix_cache, jitter=jitter), seconds
        )


def at_intake(trace: Path, intake: Path, measured: dict, predict: Callable[[Path], dict]) -> dict:
    """`predict` (a trace's replay, observed) with each request arriving when vLLM's engine took it in
    (the run's intake times, in order, moved together so that no request is taken in before it was
    sent), its verdict against `measured`, and how late the intake was after the send (median, 90th
    percentile, largest)."""
    specs, times = read_trace(trace), json.loads(intake.read_text())["t"]
    if len(times) != len(specs):
        return {"skipped": f"{len(times)} requests taken in, {len(specs)} sent"}
    sent = [r.arrival for r in specs]
    shift = min(t - a for t, a in zip(times, sent))
    late = sorted(t - shift - a for t, a in zip(times, sent))
    moved = [RequestSpec(r.client, r.prompt_len, r.output_len, t - shift) for r, t in zip(specs, times)]
    with tempfile.TemporaryDirectory() as folder:
        moved_trace = Path(folder) / "intake.trace.jsonl"
        write_trace(moved, moved_trace)
        predicted = predict(moved_trace)
    return {
        **verdict(measured, predicted),
        "preemptions": predicted["preemptions"],
        "late_s": {"median": late[len(late) // 2], "p90": late[9 * len(late) // 10], "max": late[-1]},
    }


def machine_speed(runs: dict) -> dict:
    """How far the machine's speed moved: the lowest and highest step-time ratio of the runs, and of
    their RATIO_WINDOW_S windows."""
    ratios = [row["step_time_ratio"] for row in runs.values() if "step_time_ratio" in row]
    windows = [ratio for row in runs.values() for _, ratio in row.get("step_time_ratio_by_window", [])]
    return {
        "runs": _spread(ratios),
        "windows": _spread(windows),
        "window_s": RATIO_WINDOW_S,
    }


def _row(name: str, scheduler: str, row: dict) -> str:
    ttft = ", ".join(f"{c} {v['sim']:.2f}/{v['vllm']:.2f}s" for c, v in row["ttft_pairs"].items())
    sim, real = row["sim"]["throughput_tok_s"], row["vllm"]["throughput_tok_s"]
    shares = f"shares off {row['share_points']:.1f} pts"
    tokens = f"tok/s sim/vllm {sim:.0f}/{real:.0f} ({row['throughput_error']:+.1%})"
    return f"{name:22s} {scheduler:5s} {tokens} {shares}  TTFT sim/vllm {ttft}"


def markdown_table(runs: dict) -> str:
    """One row per run: throughput, the largest share error, each compared tenant's mean TTFT, verdict."""
    lines = [
        "| workload | scheduler | tokens/s: vLLM, simulated | shares: largest error (in brackets, with each arrival "
        f"up to {JITTER_MS:.0f} ms later, the lowest to the highest) | mean TTFT (s): vLLM, simulated "
        f"(tenants with {MIN_REQUESTS}+ finished; in brackets, simulated with each arrival up to {JITTER_MS:.0f} ms "
        f"later, the lowest to the highest over {JITTER_SEEDS} seeds) | within the targets "
        "| vLLM's steps against the calibrated model; the prediction at that speed (tokens/s, shares, mean TTFT) |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, row in runs.items():
        name, scheduler = key.split("/")
        real, sim = row["vllm"]["throughput_tok_s"], row["sim"]["throughput_tok_s"]
        ttft = "; ".join(_ttft_words(c, v, row) for c, v in row["ttft_pairs"].items()) or "none"
        lines.append(
            f"| {name} | {scheduler} | {real:,.0f}, {sim:,.0f} ({row['throughput_error']:+.1%}) "
            f"| {row['share_points']:.1f} points ({_band(row.get('share_points_jitter_band'))}) | {ttft} "
            f"| {_verdict_words(row)} | {_machine_words(row)} |"
        )
    return "\n".join(lines) + "\n" + _pressure_table(runs)


def _pressure_table(runs: dict) -> str:
    """The runs under memory pressure: how often vLLM and the simulator preempted, and what the
    simulator predicts without the prefix cache (every preempted request computed again from 0)."""
    rows = [(key.split("/")[0], row) for key, row in runs.items() if "without_prefix_cache" in row]
    if not rows:
        return ""
    lines = [
        "",
        f"Under memory pressure (`{SMALL_KV}`: vLLM's KV cache cut to {SMALL_KV_BLOCKS} blocks):",
        "",
        "| workload | requests preempted: vLLM, simulated (at the run's speed; in brackets, with each arrival up to "
        f"{JITTER_MS:.0f} ms later, the lowest to the highest over {JITTER_SEEDS} seeds) "
        "| at the run's speed without the prefix cache: preempted; tokens/s, shares, mean TTFT (s) "
        "| at the run's speed, each request arriving when vLLM's engine took it in: preempted |",
        "|---|---|---|---|",
    ]
    for name, row in rows:
        without = row["without_prefix_cache"]
        ttft = "; ".join(f"{c} {v['sim']:.2f}" for c, v in without["ttft_pairs"].items()) or "none"
        at_speed = row["at_run_speed"]
        low, high = at_speed["preemptions_jitter_band"]
        lines.append(
            f"| {name} | {row['vllm_preempted']}, {row['sim']['preemptions']} ({at_speed['preemptions']}; "
            f"{low} to {high}) "
            f"| {without['preemptions']}; {without['throughput_error']:+.1%}, {without['share_points']:.1f} points, "
            f"TTFT {ttft}: {_verdict_words(without)} | {row.get('at_intake', {}).get('preemptions', '-')} |"
        )
    return "\n".join(lines) + "\n"


def _band(band: list[float] | None) -> str:
    return "-" if band is None else f"{band[0]:.1f} to {band[1]:.1f}"


def _ttft_words(tenant: str, pair: dict, row: dict) -> str:
    """vLLM's mean TTFT, the prediction, and the prediction's band under arrival jitter."""
    low, high = row["ttft_jitter_band"][tenant]
    return f"{tenant} {pair['vllm']:.2f}, {pair['sim']:.2f} ({low:.2f} to {high:.2f})"


def _machine_words(row: dict) -> str:
    """How fast the machine ran vLLM's steps during the run, and what the simulator predicts at that
    speed: what is left of the error is the simulator's, not the machine's."""
    if "at_run_speed" not in row:
        return "-"
    ratio, load, at_speed = row["step_time_ratio"], row["loadavg_1m"], row["at_run_speed"]
    ttft = "; ".join(f"{c} {v['sim']:.2f}" for c, v in at_speed["ttft_pairs"].items()) or "none"
    return (
        f"{ratio:.2f}x (load {load[0]:.1f} to {load[1]:.1f}); at that speed {at_speed['throughput_error']:+.1%}, "
        f"{at_speed['share_points']:.1f} points, TTFT {ttft}: {_verdict_words(at_speed)}"
    )


CHECKS = (("throughput", "throughput_ok"), ("shares", "shares_ok"), ("TTFT", "ttft_ok"))  # a run's targets, named


def within_targets(runs: dict) -> dict[str, int]:
    """How many runs met each target, and all three (what the docs' verdict counts)."""
    keys = [key for _, key in CHECKS]
    counts = {key.removesuffix("_ok"): sum(bool(row[key]) for row in runs.values()) for key in keys}
    at_speed = [row["at_run_speed"] for row in runs.values() if "at_run_speed" in row]
    return {
        "runs": len(runs),
        **counts,
        "all": _all_met(runs.values()),
        "all_at_run_speed": _all_met(at_speed),
        "ttft_at_run_speed": sum(bool(row["ttft_ok"]) for row in at_speed),
        "shares_within_jitter": sum(  # runs with a replay, its arrivals jittered, within the shares' target
            (band := row.get("share_points_jitter_band")) is not None and band[0] <= TARGETS["share_points"]
            for row in runs.values()
        ),
        **_at_intake_counts(runs),
    }


def _simulated_at_intake(row: dict) -> bool:
    """Whether a run was simulated at vLLM's intake times (logs from before the step log's `arrived` were not)."""
    return "preemptions" in row.get("at_intake", {})


def _at_intake_counts(runs: dict) -> dict:
    """Runs simulated at vLLM's intake times."""
    rows = [row["at_intake"] for row in runs.values() if _simulated_at_intake(row)]
    if not rows:
        return {}
    return {
        "at_intake_runs": len(rows),
        "all_at_intake": _all_met(rows),
        "ttft_at_intake": sum(bool(row["ttft_ok"]) for row in rows),
        "intake_late_s_max": max(row["late_s"]["max"] for row in rows),
        "intake_late_s_median_max": max(row["late_s"]["median"] for row in rows),
    }


def memory_pressure(runs: dict) -> dict:
    """Of the runs under memory pressure: preemptions in all (vLLM, simulated, simulated at the runs'
    speed, simulated without the prefix cache) and how many runs each prediction had within all three targets."""
    rows = [row for row in runs.values() if "without_prefix_cache" in row]
    return {
        "runs": len(rows),
        "blocks": SMALL_KV_BLOCKS,
        "preempted": {
            "vllm": sum(row["vllm_preempted"] for row in rows),
            "sim": sum(row["sim"]["preemptions"] for row in rows),
            "at_run_speed": sum(row["at_run_speed"]["preemptions"] for row in rows),
            "without_prefix_cache": sum(row["without_prefix_cache"]["preemptions"] for row in rows),
            **(
                {"at_intake": sum(row["at_intake"]["preemptions"] for row in rows)}
                if all(_simulated_at_intake(row) for row in rows)
                else {}
            ),
        },
        "vllm_within_jitter_band": sum(  # runs whose count of vLLM's lies within the simulator's at run speed
            low <= row["vllm_preempted"] <= high
            for row in rows
            for low, high in [row["at_run_speed"]["preemptions_jitter_band"]]
        ),
        "within_all": {
            "sim": _all_met(rows),
            "at_run_speed": _all_met(row["at_run_speed"] for row in rows),
            "without_prefix_cache": _all_met(row["without_prefix_cache"] for row in rows),  # at the runs' speed
        },
        "throughput_error": {  # the lowest and the highest of the runs
            "sim": _spread(row["throughput_error"] for row in rows),
            "at_run_speed": _spread(row["at_run_speed"]["throughput_error"] for row in rows),
            "without_prefix_cache": _spread(row["without_prefix_cache"]["throughput_error"] for row in rows),
        },
    }


def _all_met(verdicts) -> int:
    """How many of the verdicts met all three targets."""
    return sum(all(v[key] for _, key in CHECKS) for v in verdicts)


def _spread(values) -> list[float] | None:
    """The lowest and the highest of the values (None: none)."""
    values = list(values)
    return [min(values), max(values)] if values else None


def _verdict_words(row: dict) -> str:
    missed = [what for what, key in CHECKS if not row[key]]
    return "yes" if not missed else "no: " + ", ".join(missed)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-python", required=True, help="the python of a venv with vLLM (.venv-vllm/bin/python)")
    p.add_argument("--model-dir", type=Path, help="the model folder (default: built here, hidden 512, 8 layers)")
    p.add_argument("--seconds", type=float, default=Settings.seconds, help="seconds of each workload's arrivals")
    p.add_argument("--deadline", type=float, default=Settings.deadline, help="each run is cut after this many s")
    p.add_argument("--compare-only", action="store_true", help="simulate and compare the runs already here")
    args = p.parse_args()
    if not args.compare_only and not os.access(args.vllm_python, os.X_OK):
        print(f"vllm_fidelity: --vllm-python {args.vllm_python}: no such program", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the servers stop (their `finally`) on SIGTERM too
    s = Settings(seconds=args.seconds, deadline=args.deadline)
    OUT.mkdir(parents=True, exist_ok=True)
    args.logs = Path(tempfile.mkdtemp(prefix="vllm_fidelity_logs_"))
    started = time.time()
    if args.compare_only:
        record = json.loads(SUMMARY.read_text())
    else:
        record = measure(args, s)
    record["runs"] = compare(s, record["servers"], record["scaling"]["arrivals_s"])
    record["targets"] = TARGETS
    record["within_targets"] = within_targets(record["runs"])
    record["jitter"] = {"ms": JITTER_MS, "seeds": JITTER_SEEDS}
    record["speed"] = machine_speed(record["runs"])
    record["memory_pressure"] = memory_pressure(record["runs"])
    record["shares_missed"] = [  # the runs whose shares missed the target, named for the docs
        {"run": key, "share_points": row["share_points"], "jitter_band": row["share_points_jitter_band"],
         "at_run_speed": row.get("at_run_speed", {}).get("share_points"),
         "at_intake": row.get("at_intake", {}).get("share_points")}
        for key, row in record["runs"].items() if not row["shares_ok"]
    ]  # fmt: skip
    record["ttft_jitter_band_widest_s"] = max(
        high - low for row in record["runs"].values() for low, high in row["ttft_jitter_band"].values()
    )
    SUMMARY.write_text(json.dumps(record, indent=1) + "\n")
    TABLE.write_text(markdown_table(record["runs"]))
    print(f"wrote {SUMMARY.relative_to(REPO)} and {TABLE.relative_to(REPO)} ({time.time() - started:.0f} s)")
    return 0


def measure(args, s: Settings) -> dict:
    if args.model_dir is None:
        from tests.vllm.model import build_tiny_llama

        args.model_dir = build_tiny_llama(Path(tempfile.mkdtemp(prefix="fidelity-llama-")), hidden=512, layers=8)
    servers = {}
    for k, scheduler in enumerate(SCHEDULERS):
        servers[scheduler] = serve_runs(args, s, scheduler, [] if k == 0 else list(WORKLOADS), calibrate=k == 0)
    servers[SMALL_KV] = serve_runs(args, s, SMALL_KV, list(SMALL_KV_WORKLOADS), calibrate=False, blocks=SMALL_KV_BLOCKS)
    return {
        "machine": machine_info(),
        "settings": asdict(s),
        "model": {"hidden": 512, "layers": 8} if "fidelity-llama" in str(args.model_dir) else str(args.model_dir),
        "scaling": json.loads((OUT / "scaling.json").read_text()),
        "calibration": json.loads((OUT / "calibration.json").read_text()),
        "testbed": json.loads((OUT / "testbed.json").read_text()),
        "servers": servers,
    }


if __name__ == "__main__":
    raise SystemExit(main())
