"""Throughput through the gateway against vLLM's own, on the same load (issue 19, item 4).

The load is the issue's: two tenants, one keeping 12 requests in flight and one 4, for a fixed
window, against a vLLM started with `--max-num-seqs 4`; every request streams 128 output tokens
(`ignore_eos`) after a prompt of 128 random token ids. The client is the official `openai` package,
one `X-Client-Id` per tenant. Rounds alternate: vLLM directly, then the same vLLM through
`slora-vtc gateway` (its own process), and again, so that drift on a shared machine falls on both
arms alike; each gateway round is divided by the direct round just before it.

Throughput is the output tokens that reached the client inside the window (streamed chunks,
corrected by `usage` for requests that ended), per second. Beside it, each round records what
explains a gap: vLLM's own batch (`vllm:num_requests_running` and `_waiting`, sampled every 0.25 s),
the gateway's budget (`slora_gateway_upstream_limit`) and the CPU seconds of the gateway process;
with `--step-log`, for a vLLM started with the plugin (`fcfs` orders its queue as stock vLLM does)
and its step log, vLLM's own steps in each window: decodes per step, step and gap times.

    # a vLLM on PORT (see docs/gateway.md), then, in our venv:
    python benchmarks/gateway_vllm.py --vllm http://127.0.0.1:PORT [--rounds 4] [--window 20]
        [--gateway-args '--scheduler vtc'] [--pin-engine 1]

Target (issue 19): the gateway's throughput at least 0.97x vLLM's. Writes
benchmarks/results/gateway_vllm.json (a section per --label).
"""

import argparse
import asyncio
import itertools
import json
import os
import random
import shlex
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import openai
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_seconds, git_revision, machine_info  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "gateway_vllm.json"
REPO = Path(__file__).resolve().parent.parent
TARGET = 0.97
TENANTS = {"heavy": 12, "light": 4}  # requests each keeps in flight
START_TIMEOUT_S = 60
DRAIN_TIMEOUT_S = 60
GENERATED = "vllm:generation_tokens_total"
VLLM_PROCESSES = {
    "vllm_api_server": "vllm.entrypoints.openai.api_server",
    "vllm_engine_core": "VLLM::EngineCore",
    "vllm_worker": "VLLM::Worker",
}
ENGINE_PROCESSES = {"vllm_engine_core", "vllm_worker"}  # what --pin-engine places apart from the rest
BURN_PERIOD_S = 0.004  # the stand-in wakes as often as a relay does at one token per 4 ms step


@dataclass
class Tally:
    tokens: int = 0  # output tokens received inside the window
    finished: int = 0
    errors: int = 0
    ttfts: list[float] = field(default_factory=list)


async def one_request(client: openai.AsyncOpenAI, tenant: str, args, tally: Tally, rng: random.Random) -> None:
    """One streamed request through the official client, its events read as raw lines: parsing
    each chunk into the client's models costs more CPU than the tiny model's step on this machine,
    and would measure the client."""
    prompt = [rng.randrange(10, args.vocab) for _ in range(args.input_len)]
    start, seen, usage = time.perf_counter(), 0, None
    async with client.completions.with_streaming_response.create(
        model=args.model,
        prompt=prompt,
        max_tokens=args.output_len,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
        extra_headers={"X-Client-Id": tenant},
    ) as response:
        async for line in response.iter_lines():
            if '"usage":{' in line.replace(" ", "") and '"completion_tokens"' in line:
                usage = json.loads(line[5:])["usage"]["completion_tokens"]
            elif line.startswith("data:") and '"text"' in line:
                if seen == 0:
                    tally.ttfts.append(time.perf_counter() - start)
                seen += 1
                tally.tokens += 1
    if usage is not None and usage > seen:
        tally.tokens += usage - seen  # tokens that sent no chunk of their own (or several in one)
    tally.finished += 1


async def tenant_loop(client, tenant, inflight, args, tally, rng) -> None:
    async def worker():
        while True:
            try:
                await one_request(client, tenant, args, tally, rng)
            except openai.APIError as e:
                tally.errors += 1
                print(f"  {tenant} at {client.base_url}: {type(e).__name__}: {e} ({e.__cause__!r})", file=sys.stderr)
                await asyncio.sleep(0.1)

    await asyncio.gather(*(worker() for _ in range(inflight)))


def gauges(text: str, names: tuple[str, ...]) -> dict[str, float]:
    out = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in out:
                out[sample.name] += sample.value
    return out


async def sample_metrics(http: httpx2.AsyncClient, vllm: str, gateway: str | None, samples: list) -> None:
    """vLLM's batch every 0.25 s, the gateway's budget every second (each page costs its server CPU)."""
    limit = {}
    for tick in itertools.count():
        await asyncio.sleep(0.25)
        try:
            page = (await http.get(f"{vllm}/metrics")).text
            row = gauges(page, ("vllm:num_requests_running", "vllm:num_requests_waiting"))
            if gateway is not None and tick % 4 == 0:
                limit = gauges((await http.get(f"{gateway}/metrics")).text, ("slora_gateway_upstream_limit",))
            samples.append(row | limit)
        except httpx2.HTTPError:
            pass


async def one_round(url: str, args, vllm: str, gateway: str | None, seed: int) -> dict:
    tallies = {t: Tally() for t in TENANTS}
    rng = random.Random(seed)
    samples: list[dict] = []
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    async with httpx2.AsyncClient(timeout=5) as http:
        generated, first_step = await generation_tokens(http, vllm), step_lines(args.step_log)
        account = CpuAccount(args.pids)
        tasks = [
            asyncio.ensure_future(tenant_loop(client, t, n, args, tallies[t], rng)) for t, n in TENANTS.items()
        ] + [asyncio.ensure_future(sample_metrics(http, vllm, gateway, samples))]
        await asyncio.sleep(args.window)
        counted = {t: (tallies[t].tokens, tallies[t].finished) for t in TENANTS}
        generated = await generation_tokens(http, vllm) - generated
        cpu = account.since()
        steps = steps_since(args.step_log, first_step)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
        await drained(http, vllm)
    mean = lambda key: statistics.fmean(s[key] for s in samples if key in s) if samples else None  # noqa: E731
    return {
        "tokens_per_s": sum(c[0] for c in counted.values()) / args.window,
        "vllm_tokens_per_s": generated / args.window,
        "finished": {t: c[1] for t, c in counted.items()},
        "errors": sum(t.errors for t in tallies.values()),
        "tokens": {t: c[0] for t, c in counted.items()},
        "mean_ttft_s": {t: statistics.fmean(tallies[t].ttfts) if tallies[t].ttfts else None for t in TENANTS},
        "vllm_mean_running": mean("vllm:num_requests_running"),
        "vllm_mean_waiting": mean("vllm:num_requests_waiting"),
        "gateway_mean_limit": mean("slora_gateway_upstream_limit") if gateway else None,
        "vllm_steps": steps,
        **cpu,
    }


def vllm_pids() -> dict[str, int]:
    """This machine's vLLM processes, found by their command lines (Linux /proc): the API server and
    its engine core and the engine core's worker (the first of each; none where vLLM runs elsewhere)."""
    pids = {}
    for proc in sorted(Path("/proc").glob("[0-9]*"), key=lambda p: int(p.name)):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        for name, mark in VLLM_PROCESSES.items():
            if mark in cmdline and name not in pids:
                pids[name] = int(proc.name)
    return pids


def cpu_ticks() -> list[tuple[int, int]]:
    """Each CPU's busy and total ticks since boot (Linux /proc/stat; idle and iowait are not busy)."""
    ticks = []
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            values = list(map(int, fields))
            ticks.append((sum(values) - values[3] - values[4], sum(values)))
    return ticks


class CpuAccount:
    """Where the CPUs' time went in a window: each CPU's busy share, and the CPU seconds of each of
    the processes named (vLLM's API server, engine core and worker, the benchmark's client, the gateway)."""

    def __init__(self, pids: dict[str, int]):
        self.pids, self.ticks = pids, cpu_ticks()
        self.seconds = {name: cpu_seconds(pid) for name, pid in pids.items()}

    def since(self) -> dict:
        ticks = cpu_ticks()
        return {
            "cpu_busy": [(b - b0) / max(1, t - t0) for (b, t), (b0, t0) in zip(ticks, self.ticks)],
            "cpu_s": {name: cpu_seconds(pid) - self.seconds[name] for name, pid in self.pids.items()},
        }


def affinities(pids: dict[str, int]) -> dict[str, list[int]]:
    """The CPUs each named process may run on (where one was pinned with taskset; all where none was)."""
    out = {}
    for name, pid in pids.items():
        try:
            out[name] = sorted(os.sched_getaffinity(pid))
        except OSError:
            pass
    return out


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process `pid` onto `cpus` (threads that ended meanwhile are skipped)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except ProcessLookupError:
            pass


def cpu_list(text: str) -> set[int]:
    """CPU numbers separated by commas ("1" or "2,3")."""
    return {int(c) for c in text.split(",")}


class EnginePlacement:
    """--pin-engine: vLLM's engine core and its worker on `cpus`, its API server and this benchmark
    (the client, and the gateway it starts) on the other CPUs; everything back on every CPU on exit."""

    def __init__(self, cpus: set[int], pids: dict[str, int]):
        self.pids, self.everything = pids, os.sched_getaffinity(0)
        missing = ENGINE_PROCESSES - set(pids)
        if missing:
            raise ValueError(f"--pin-engine: no {', '.join(sorted(missing))} process on this machine (is vLLM local?)")
        self.engine, self.rest = cpus, self.everything - cpus
        if not self.rest or not cpus <= self.everything:
            raise ValueError(f"--pin-engine {sorted(cpus)}: must leave some of CPUs {sorted(self.everything)} free")

    def __enter__(self):
        for name, pid in self.pids.items():
            pin(pid, self.engine if name in ENGINE_PROCESSES else self.rest)
        pin(os.getpid(), self.rest)
        return self

    def __exit__(self, *exc):
        for pid in [*self.pids.values(), os.getpid()]:
            pin(pid, self.everything)


def step_lines(path: Path | None) -> int:
    return len(path.read_text().splitlines()) if path is not None and path.exists() else 0


def steps_since(path: Path | None, first: int) -> dict | None:
    """vLLM's steps from line `first` of the plugin's step log to now (docs/vllm.md): how full its
    batch ran (decodes per step, out of --max-num-seqs) and how long its steps and the gaps between
    them took."""
    if path is None:
        return None
    records = [json.loads(line) for line in path.read_text().splitlines()[first:]]
    if not records:
        return None
    return {
        "steps": len(records),
        "decodes_per_step": statistics.fmean(r["decode_reqs"] for r in records),
        "prefills_per_step": statistics.fmean(r["prefill_reqs"] for r in records),
        "step_ms": 1000 * statistics.fmean(r["wall_s"] for r in records),
        "gap_ms": 1000 * statistics.fmean(r["gap_s"] for r in records),
    }


async def generation_tokens(http: httpx2.AsyncClient, vllm: str) -> float:
    """vLLM's own count of the tokens it generated so far."""
    return gauges((await http.get(f"{vllm}/metrics")).text, (GENERATED,))[GENERATED]


async def drained(http: httpx2.AsyncClient, vllm: str) -> None:
    """Wait until vLLM has nothing running or waiting (the cancelled streams are aborted there)."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        row = gauges(
            (await http.get(f"{vllm}/metrics")).text, ("vllm:num_requests_running", "vllm:num_requests_waiting")
        )
        if not any(row.values()):
            return
        await asyncio.sleep(0.2)
    raise SystemExit(f"vLLM at {vllm} did not drain within {DRAIN_TIMEOUT_S} s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gateway(vllm: str, gateway_args: str, nice: int = 0, idle: bool = False) -> tuple[subprocess.Popen, str]:
    """The gateway in front of `vllm`, at CPU priority `nice` (0: the benchmark's own), or under Linux's
    SCHED_IDLE policy (`idle`: it runs only on a CPU nothing else wants, and never preempts)."""
    port = free_port()
    cmd = ["nice", "-n", str(nice)] if nice else []
    cmd += ["chrt", "--idle", "0"] if idle else []
    cmd += [sys.executable, "-m", "slora_vtc", "gateway", "--upstream", vllm, "--port", str(port)]
    cmd += ["--log-level", "warning", *shlex.split(gateway_args)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the gateway exited: {proc.stdout.read()}")
        try:
            if httpx2.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx2.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the gateway did not start")


def spread(values: list[float]) -> dict:
    return {
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
        "n": len(values),
    }


def burn(share: float) -> None:
    """Keep `share` of a core busy in wake-ups every BURN_PERIOD_S (a relay's CPU, standing in), until killed."""
    busy = share * BURN_PERIOD_S
    while True:
        start = time.perf_counter()
        while time.perf_counter() - start < busy:
            pass
        time.sleep(BURN_PERIOD_S - busy)


def stand_in_round(args, seed: int) -> dict:
    """The second arm of --stand-in: vLLM directly, with a process beside it burning args.stand_in of a core."""
    burner = subprocess.Popen([sys.executable, __file__, "--burn", str(args.stand_in)])
    try:
        through = asyncio.run(one_round(args.vllm, args, args.vllm, None, seed=seed))
        through["gateway_cpu_s"] = cpu_seconds(burner.pid)
    finally:
        burner.kill()
        burner.wait()
    return through


def run(args) -> dict:
    proc, gateway = (
        start_gateway(args.vllm, args.gateway_args, args.gateway_nice, args.gateway_idle)
        if args.stand_in is None
        else (None, None)
    )
    args.pids = {**args.vllm_pids, "client": os.getpid(), **({"gateway": proc.pid} if proc else {})}
    placement = affinities(args.pids)
    rounds = []
    try:
        print("warm-up (one round each, not counted)", flush=True)
        asyncio.run(one_round(args.vllm, args, args.vllm, None, seed=0))
        if gateway:
            asyncio.run(one_round(gateway, args, args.vllm, gateway, seed=0))
        for i in range(args.rounds):
            direct = asyncio.run(one_round(args.vllm, args, args.vllm, None, seed=i + 1))
            if gateway:
                cpu = cpu_seconds(proc.pid)
                through = asyncio.run(one_round(gateway, args, args.vllm, gateway, seed=i + 1))
                through["gateway_cpu_s"] = cpu_seconds(proc.pid) - cpu
            else:
                through = stand_in_round(args, seed=i + 1)
            ratio = through["tokens_per_s"] / direct["tokens_per_s"]
            rounds.append({"direct": direct, "gateway": through, "ratio": ratio})
            print(
                f"round {i + 1}: direct {direct['tokens_per_s']:.0f} tok/s "
                f"(running {direct['vllm_mean_running']:.2f}, vllm {direct['vllm_tokens_per_s']:.0f}), "
                f"gateway {through['tokens_per_s']:.0f} tok/s (running {through['vllm_mean_running']:.2f}, "
                f"vllm {through['vllm_tokens_per_s']:.0f}, errors {through['errors']}, "
                f"limit {through['gateway_mean_limit'] or 0:.2f}, cpu {through['gateway_cpu_s']:.1f} s): "
                f"ratio {ratio:.3f}",
                flush=True,
            )
            for arm, record in (("direct", direct), ("gateway", through)):
                busy = ", ".join(f"{b:.2f}" for b in record["cpu_busy"])
                seconds = ", ".join(f"{name} {s:.1f}" for name, s in record["cpu_s"].items())
                print(f"  {arm}: CPUs busy {busy}; CPU s {seconds}", flush=True)
            if direct["vllm_steps"] and through["vllm_steps"]:
                print(
                    f"  vLLM's steps: decodes per step {direct['vllm_steps']['decodes_per_step']:.2f} direct, "
                    f"{through['vllm_steps']['decodes_per_step']:.2f} through the gateway; step "
                    f"{direct['vllm_steps']['step_ms']:.2f} : {through['vllm_steps']['step_ms']:.2f} ms, gap "
                    f"{direct['vllm_steps']['gap_ms']:.2f} : {through['vllm_steps']['gap_ms']:.2f} ms",
                    flush=True,
                )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    arm = args.gateway_args if args.stand_in is None else f"stand-in burning {args.stand_in} of a core"
    summary = summarize(rounds, arm, args.code or git_revision(), args.gateway_nice)
    summary["window_s"] = args.window
    summary["cpu_affinity"] = placement
    if args.gateway_idle:
        summary["gateway_policy"] = "SCHED_IDLE"
    print(
        f"ratio {summary['ratio']['mean']:.3f} (min {summary['ratio']['min']:.3f}, max {summary['ratio']['max']:.3f})"
    )
    return summary


def summarize(rounds: list[dict], gateway_args: str, code: str, nice: int = 0) -> dict:
    """A run's summary over its rounds (also rebuilt from recorded rounds by --resummarize)."""
    ratios = [r["ratio"] for r in rounds]
    over = lambda arm, key: spread([r[arm][key] for r in rounds])  # noqa: E731
    return {
        "gateway_args": gateway_args,
        "gateway_code": code,
        "gateway_nice": nice,
        "ratio": spread(ratios),
        "direct_tokens_per_s": over("direct", "tokens_per_s"),
        "gateway_tokens_per_s": over("gateway", "tokens_per_s"),
        "direct_mean_running": over("direct", "vllm_mean_running"),
        "gateway_mean_running": over("gateway", "vllm_mean_running"),
        **(
            {"gateway_mean_limit": over("gateway", "gateway_mean_limit")}
            if all(r["gateway"]["gateway_mean_limit"] is not None for r in rounds)
            else {}
        ),
        **{
            f"{arm}_{key}": spread([r[arm]["vllm_steps"][key] for r in rounds])
            for arm in ("direct", "gateway")
            for key in ("decodes_per_step", "step_ms", "gap_ms")
            if all(r[arm].get("vllm_steps") for r in rounds)
        },
        **{
            f"{arm}_cpu_s": {name: spread([r[arm]["cpu_s"][name] for r in rounds]) for name in rounds[0][arm]["cpu_s"]}
            for arm in ("direct", "gateway")
            if all("cpu_s" in r[arm] for r in rounds)
        },
        **{
            f"{arm}_cpu_busy": [spread(list(busy)) for busy in zip(*(r[arm]["cpu_busy"] for r in rounds))]
            for arm in ("direct", "gateway")
            if all("cpu_busy" in r[arm] for r in rounds)
        },
        **(worker_share(rounds) if all("vllm_worker" in r["direct"].get("cpu_s", {}) for r in rounds) else {}),
        "light_share_direct": spread([share(r["direct"]) for r in rounds]),
        "light_share_gateway": spread([share(r["gateway"]) for r in rounds]),
        "ttft_s": {
            arm: {t: spread([r[arm]["mean_ttft_s"][t] for r in rounds]) for t in TENANTS}
            for arm in ("direct", "gateway")
        },
        "target": TARGET,
        "met": statistics.fmean(ratios) >= TARGET,
        "rounds": rounds,
    }


def worker_share(rounds: list[dict]) -> dict:
    """What vLLM's worker (the process that runs the model) got of the CPUs in each arm, and what it
    made of them: the gateway arm's worker CPU seconds over the direct arm's, and output tokens per
    worker CPU second in each arm."""
    worker = lambda r, arm: r[arm]["cpu_s"]["vllm_worker"]  # noqa: E731
    return {
        "worker_cpu_ratio": spread([worker(r, "gateway") / worker(r, "direct") for r in rounds]),
        **{
            f"{arm}_tokens_per_worker_cpu_s": spread([sum(r[arm]["tokens"].values()) / worker(r, arm) for r in rounds])
            for arm in ("direct", "gateway")
        },
    }


def share(round_: dict) -> float:
    """The light tenant's tokens over the heavy tenant's (1.0 is an even split)."""
    return round_["tokens"]["light"] / max(1, round_["tokens"]["heavy"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", help="a running vLLM's root URL (started with --max-num-seqs 4)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--gateway-args", default="--scheduler vtc")
    parser.add_argument(
        "--gateway-nice",
        type=int,
        default=0,
        help="run the gateway at this nice value (a lower CPU priority than vLLM's on shared cores; default 0)",
    )
    parser.add_argument(
        "--gateway-idle",
        action="store_true",
        help="run the gateway under SCHED_IDLE (chrt --idle 0): it never preempts vLLM's processes",
    )
    parser.add_argument(
        "--stand-in",
        type=float,
        metavar="SHARE",
        help="a control instead of the gateway: the second arm sends to vLLM directly while a process beside it "
        "keeps SHARE of a core busy in wake-ups every 4 ms (what any process with the gateway's CPU costs vLLM)",
    )
    parser.add_argument(
        "--pin-engine",
        metavar="CPUS",
        type=cpu_list,
        help="a local vLLM's engine core and worker on these CPUs (e.g. 1), its API server, the client and the "
        "gateway on the others, for the whole run (Linux)",
    )
    parser.add_argument("--burn", type=float, help=argparse.SUPPRESS)  # the stand-in's process
    parser.add_argument("--label", default="vtc", help="the section of the result file")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=299, help="prompt token ids are drawn below this")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--step-log", type=Path, help="the plugin's step log of this vLLM (started with the plugin and a step_log)"
    )
    parser.add_argument(
        "--pool",
        metavar="NAME=LABEL,LABEL",
        help="record the ratios of every round of the runs LABEL,... as one spread under 'pooled' NAME, run nothing",
    )
    parser.add_argument("--code", help="which gateway code ran (default: this checkout's git revision)")
    parser.add_argument("--dry", action="store_true", help="print, record nothing")
    parser.add_argument("--resummarize", action="store_true", help="rebuild each recorded run's summary, run nothing")
    args = parser.parse_args(argv)
    if args.burn is not None:
        burn(args.burn)
    if args.stand_in is not None and not 0 < args.stand_in < 1:
        parser.error("--stand-in is a share of one core, between 0 and 1")
    if args.resummarize:
        out = json.loads(args.out.read_text())
        for label, run_ in out["runs"].items():
            kept = {key: run_[key] for key in ("window_s", "gateway_policy", "cpu_affinity") if key in run_}
            out["runs"][label] = summarize(
                run_["rounds"], run_["gateway_args"], run_["gateway_code"], run_.get("gateway_nice", 0)
            )
            out["runs"][label].update(kept)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
        return
    if args.pool:
        if "=" not in args.pool:
            parser.error("--pool NAME=LABEL,LABEL")
        try:
            pool(args.out, *args.pool.split("=", 1))
        except ValueError as e:
            parser.error(str(e))
        return
    if args.vllm is None:
        parser.error("--vllm URL is required")
    if args.rounds < 1 or args.window <= 0:
        parser.error("--rounds and --window must be positive")
    args.vllm_pids = vllm_pids()
    if args.pin_engine:
        try:
            placement = EnginePlacement(args.pin_engine, args.vllm_pids)
        except ValueError as e:
            parser.error(str(e))
        with placement:
            summary = run(args)
    else:
        summary = run(args)
    if args.dry:
        return
    out = json.loads(args.out.read_text()) if args.out.exists() else {}
    out["machine"] = machine_info(vllm=vllm_version(args.vllm))
    out["load"] = {
        "tenants_inflight": TENANTS,
        "window_s": args.window,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "client": f"openai {openai.__version__}",
    }
    out.setdefault("runs", {})[args.label] = summary
    args.out.write_text(json.dumps(out, indent=1) + "\n")


def pool(path: Path, name: str, labels: str) -> None:
    """The rounds of several recorded runs as one: their ratios' spread, under out["pooled"][name]."""
    if not path.exists():
        raise ValueError(f"--pool: no result file {path}")
    out = json.loads(path.read_text())
    labels = labels.split(",")
    missing = [label for label in labels if label not in out["runs"]]
    if missing:
        raise ValueError(f"--pool: {path} has no run labelled {', '.join(missing)}")
    ratios = [r["ratio"] for label in labels for r in out["runs"][label]["rounds"]]
    out.setdefault("pooled", {})[name] = {"runs": labels, "ratio": spread(ratios), "target": TARGET}
    path.write_text(json.dumps(out, indent=1) + "\n")


def vllm_version(url: str) -> str:
    try:
        return httpx2.get(f"{url}/version", timeout=5).json().get("version", "unknown")
    except (httpx2.HTTPError, ValueError):
        return "unknown"


if __name__ == "__main__":
    main()
