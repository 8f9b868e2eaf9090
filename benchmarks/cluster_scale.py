"""How the cluster simulator scales: requests simulated per wall-clock second and peak memory as
the cluster grows, and the target run (64 replicas, 10,000 clients, 1,000,000 requests).

    .venv/bin/python benchmarks/cluster_scale.py                    # 1, 4, 16, 64 replicas, 2,000 requests per replica
    .venv/bin/python benchmarks/cluster_scale.py --target           # 64 replicas, 10,000 clients, 1,000,000 requests
    .venv/bin/python benchmarks/cluster_scale.py --target --requests 100000   # the same, scaled down

Each size runs in a fresh process, so that its peak memory (getrusage's max RSS) is its own. The
workload: clients send Poisson arrivals at `LOAD` times what one replica serves per second of
256/256-shaped requests (prompt and output uniform in 16..496 tokens), each client equally often.
Every replica: pool 10,000 tokens, VTC, the default testbed. Wall time covers building the
requests, the simulation and the result (one Response per request) with its throughput.
Results: benchmarks/results/cluster_scale.json.
"""

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from slora_vtc.backends.sim import sim_backend
from slora_vtc.cluster import RouterOptions, build_router
from slora_vtc.cluster.serve import build_cluster
from slora_vtc.config import EngineConfig
from slora_vtc.metrics import load_imbalance, throughput
from slora_vtc.request import Request
from slora_vtc.results import RunResult
from slora_vtc.sched import build_scheduler

RESULTS = Path(__file__).resolve().parent / "results" / "cluster_scale.json"
SIZES = (1, 4, 16, 64)
PER_REPLICA_RATE = 1.6  # requests/s one replica (pool 10k, A10G testbed) serves of these shapes, about
LOAD = 0.95  # offered load per replica, as a share of that


def workload(requests: int, clients: int, replicas: int, seed: int = 42) -> list[Request]:
    rng = np.random.default_rng(seed)
    rate = LOAD * PER_REPLICA_RATE * replicas
    arrivals = np.cumsum(rng.exponential(1 / rate, requests))
    who = rng.integers(0, clients, requests)
    prompts, outputs = rng.integers(16, 497, requests), rng.integers(16, 497, requests)
    names = [f"client{i}" for i in range(clients)]
    return [
        Request(names[c], int(p) + 1, int(o), float(t), rid=i, adapter=names[c], added_tokens=1)
        for i, (c, p, o, t) in enumerate(zip(who.tolist(), prompts, outputs, arrivals.tolist()))
    ]


def measure(replicas: int, requests: int, clients: int, router: str, scheduler: str) -> dict:
    start = time.perf_counter()
    reqs = workload(requests, clients, replicas)
    names = [f"client{i}" for i in range(clients)]
    built = time.perf_counter()
    cluster = build_cluster(
        build_router(router, RouterOptions(tuple(names))),
        [EngineConfig()] * replicas,
        [sim_backend() for _ in range(replicas)],
        lambda: build_scheduler(scheduler, names),
    )
    cluster.run(reqs)
    simulated = time.perf_counter()
    result = RunResult.of({"replicas": replicas}, reqs, cluster.now, cluster.replica_of)
    tokens_s, imbalance = throughput(result), load_imbalance(result)
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "replicas": replicas,
        "clients": clients,
        "requests": requests,
        "router": router,
        "scheduler": scheduler,
        "finished": result.count("finished"),
        "simulated_s": cluster.now,
        "wall_s": wall,
        "build_s": built - start,
        "simulate_s": simulated - built,
        "requests_per_s": requests / wall,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "cpu_s": usage.ru_utime + usage.ru_stime,  # less than wall_s when other processes share the cores
        "tokens_per_s_simulated": tokens_s,
        "load_imbalance": imbalance,
    }


def in_subprocess(replicas: int, requests: int, clients: int, router: str, scheduler: str) -> dict:
    argv = [
        sys.executable,
        __file__,
        "--one",
        "--replicas",
        str(replicas),
        "--requests",
        str(requests),
        "--clients",
        str(clients),
        "--router",
        router,
        "--scheduler",
        scheduler,
    ]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--target", action="store_true", help="the target run: 64 replicas, 10,000 clients, 1,000,000 requests"
    )
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--replicas", type=int, default=64)
    p.add_argument(
        "--requests",
        type=int,
        help="requests of the target run (default 1,000,000), or per replica of the sweep (default 2,000)",
    )
    p.add_argument("--clients", type=int, default=10_000)
    p.add_argument("--router", default="round-robin")
    p.add_argument("--scheduler", default="vtc")
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.replicas, args.requests, args.clients, args.router, args.scheduler)))
        return 0
    if args.target:
        rows = [in_subprocess(64, args.requests or 1_000_000, args.clients, args.router, args.scheduler)]
        key = "target"
    else:
        per = args.requests or 2_000
        rows = [in_subprocess(n, per * n, args.clients, args.router, args.scheduler) for n in SIZES]
        key = "sweep"
    for row in rows:
        print(
            f"{row['replicas']:3d} replicas {row['requests']:>9,} requests {row['clients']:>6,} clients: "
            f"{row['wall_s']:7.1f} s wall, {row['cpu_s']:7.1f} s CPU ({row['simulate_s']:.1f} simulating), "
            f"{row['requests_per_s']:7,.0f} req/s, peak {row['peak_rss_mb']:6,.0f} MB, "
            f"{row['simulated_s']:,.0f} s simulated, imbalance {row['load_imbalance']:.3f}, "
            f"{row['finished']:,} finished"
        )
    saved = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    saved[f"{key} {args.router} {args.scheduler}"] = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(saved, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
