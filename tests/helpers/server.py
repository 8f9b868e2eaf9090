"""The HTTP server tests' helpers: a real uvicorn server on 127.0.0.1 in a background thread, its
metrics, and `slora-vtc serve` as a process."""

import os
import re
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx2  # noqa: E402
import torch  # noqa: E402
import uvicorn  # noqa: E402

from slora_vtc.server.context import ServerConfig, ServerContext, build_context  # noqa: E402
from slora_vtc.server.run import server_for  # noqa: E402

START_TIMEOUT_S = 30
ENGINE_FLAGS = {"engine-thread": ("--no-engine-process",), "engine-process": ("--engine-process",)}  # serve's two modes


@dataclass(frozen=True)
class Running:
    url: str
    ctx: ServerContext

    def metrics(self) -> dict[str, float]:
        """`name{labels}` -> value, from GET /metrics."""
        return parse_metrics(httpx2.get(f"{self.url}/metrics").text)

    def per_client(self, name: str, **labels: str) -> dict[str, float]:
        """client -> value of `slora_NAME{client="...",LABELS}` (the other labels as given, in their order)."""
        rest = "".join(f',{label}="{value}"' for label, value in labels.items())
        pattern = re.compile(rf'^slora_{name}\{{client="([^"]*)"{re.escape(rest)}\}}$')
        return {m.group(1): v for k, v in self.metrics().items() if (m := pattern.match(k))}

    def wait_idle(self, timeout_s: float = 20.0) -> dict[str, float]:
        """Metrics once nothing runs, nothing waits and the pool is free again, but for what the prefix
        cache keeps for no request (or fail)."""
        deadline = time.monotonic() + timeout_s
        while True:
            m = self.metrics()
            busy = sum(v for k, v in m.items() if k.startswith(("slora_client_waiting", "slora_client_running")))
            if not busy and m["slora_pool_used_tokens"] == m["slora_pool_cached_tokens"]:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"the server did not become idle: {m}")
            time.sleep(0.02)


@contextmanager
def running_server(**settings):
    """Serve ServerConfig(**settings) (tiny model by default) until the block ends."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    ctx = build_context(ServerConfig(**settings))
    with serve_in_thread(server_for(ctx, log_level="warning")) as (url, _):
        yield Running(url, ctx)


@contextmanager
def serve_in_thread(server: uvicorn.Server):
    """Run a uvicorn server on a free loopback port in a thread: (its URL, the thread) until the block ends."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", thread
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def parse_metrics(text: str) -> dict[str, float]:
    """`name{labels}` -> value, from the Prometheus text format."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    return values


# -- `serve` as a process ----------------------------------------------------------------------------
def free_port() -> int:
    """A loopback port nothing listens on (once this returns)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, *extra: str) -> subprocess.Popen:
    """`python -m slora_vtc serve` as a process on `port` (a 3000-token pool, a 1 s drain unless `extra` says)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "slora_vtc",
        "serve",
        "--port",
        str(port),
        "--pool-tokens",
        "3000",
        "--drain-timeout",
        "1",
        *extra,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    """Until GET /health answers 200 (fails if the process ends first or after timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            if httpx2.get(f"{url}/health").status_code == 200:
                return
        except httpx2.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("the server did not come up")


def start_long_stream(url: str, body: dict, timeout_s: float = 30) -> tuple[threading.Thread, list[str]]:
    """Stream POST /v1/completions with `body` in a thread, its lines collected; returns once the first line came."""
    lines, started = [], threading.Event()

    def read() -> None:
        with httpx2.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=timeout_s) as r:
            for line in r.iter_lines():
                started.set()
                lines.append(line)

    reader = threading.Thread(target=read)
    reader.start()
    assert started.wait(timeout_s), "the stream did not start"
    return reader, lines
