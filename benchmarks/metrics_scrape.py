"""/metrics with many clients: its size, the time one scrape takes, and how long a concurrent stream
stalls while scrapes run (issue 12 measured 11.6 MB, about 1 s per scrape and 1 s stalls at 5,000 ids).

Starts `slora-vtc serve` (tiny model, CPU) in a subprocess on 127.0.0.1, sends one 1-token completion
for each of N client ids (X-Client-Id), then streams one long generation and, while it runs,
scrapes /metrics a few times, one after another. The largest gap between two chunks of the stream
during the scrapes is compared with the largest gap in as long a stretch without scrapes.
Writes benchmarks/results/metrics_scrape.json.

    .venv/bin/python benchmarks/metrics_scrape.py [--clients 5000] [--scrapes 5] [--before DIR]

--before DIR also measures the server of another checkout (the code before issue 12, say), the same
way on the same machine, and records it under "before".
"""

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx2

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "metrics_scrape.json"
START_TIMEOUT_S = 120
CONCURRENCY = 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, code: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(code)}
    cmd = [sys.executable, "-m", "slora_vtc", "serve", "--model", "tiny", "--port", str(port), "--pool-tokens", "20000"]
    proc = subprocess.Popen(cmd, env=env, cwd=code, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx2.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not start")


async def make_clients(url: str, n: int) -> float:
    """One 1-token completion per client id, CONCURRENCY at a time; returns the seconds it took."""
    start, ids = time.perf_counter(), iter(range(n))
    async with httpx2.AsyncClient(timeout=60) as http:

        async def worker():
            for i in ids:
                r = await http.post(
                    f"{url}/v1/completions",
                    json={"prompt": "hi", "max_tokens": 1},
                    headers={"X-Client-Id": f"user-{i}"},
                )
                r.raise_for_status()

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return time.perf_counter() - start


def stream_chunks(url: str, arrivals: list[float], started: threading.Event) -> None:
    body = {"prompt": "stream", "max_tokens": 4000, "stream": True, "ignore_eos": True}
    with httpx2.stream(
        "POST", f"{url}/v1/completions", json=body, headers={"X-Client-Id": "streamer"}, timeout=120
    ) as r:
        for _ in r.iter_raw():
            arrivals.append(time.perf_counter())
            started.set()


def largest_gap(arrivals: list[float], start: float, end: float) -> float:
    inside = [t for t in arrivals if start <= t <= end]
    return max((b - a for a, b in zip(inside, inside[1:])), default=float("nan"))


def measure(url: str, scrapes: int) -> dict:
    arrivals: list[float] = []
    started = threading.Event()
    streamer = threading.Thread(target=stream_chunks, args=(url, arrivals, started), daemon=True)
    streamer.start()
    started.wait(60)
    time.sleep(0.5)
    quiet_start = time.perf_counter()
    results = []
    windows = []
    for _ in range(scrapes):
        t0 = time.perf_counter()
        r = httpx2.get(f"{url}/metrics", timeout=60)
        t1 = time.perf_counter()
        windows.append((t0, t1))
        results.append({"bytes": len(r.content), "seconds": t1 - t0})
    scrape_start, scrape_end = quiet_start, time.perf_counter()
    time.sleep(scrape_end - scrape_start)  # as long again without scrapes
    quiet_end = time.perf_counter()
    streamer.join(120)
    for scrape, (t0, t1) in zip(results, windows):
        scrape["largest_chunk_gap_s"] = largest_gap(arrivals, t0, t1)
    text = r.text
    labels = {
        line.split('client="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("slora_requests_total{") and 'outcome="finished"' in line
    }
    return {
        "scrapes": results,
        "bytes": results[-1]["bytes"],
        "scrape_s_median": sorted(s["seconds"] for s in results)[len(results) // 2],
        "scrape_s_max": max(s["seconds"] for s in results),
        "client_label_values": len(labels),
        "stream_chunks": len(arrivals),
        "largest_chunk_gap_during_scrapes_s": largest_gap(arrivals, scrape_start, scrape_end),
        "largest_chunk_gap_without_scrapes_s": largest_gap(arrivals, scrape_end, quiet_end),
    }


def git_revision(code: Path) -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=code, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(code: Path, clients: int, scrapes: int) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(port, code)
    try:
        made_s = asyncio.run(make_clients(url, clients))
        return {"git": git_revision(code), "clients": clients, "clients_made_s": made_s, **measure(url, scrapes)}
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=5000)
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("--before", type=Path, help="another checkout to measure the same way (recorded as 'before')")
    args = parser.parse_args()
    result = run(ROOT, args.clients, args.scrapes)
    if args.before:
        result["before"] = run(args.before.resolve(), args.clients, args.scrapes)
    result["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "scrapes"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
