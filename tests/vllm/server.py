"""Start vLLM's OpenAI server on a free 127.0.0.1 port, wait until it answers, stop it.

    with VllmServer(model_dir, ["--max-num-seqs", "4"]) as server:
        server.url  # http://127.0.0.1:PORT

The server runs as `python -m vllm.entrypoints.openai.api_server` with the python running the tests
(.venv-vllm's) and the environment vLLM needs on a small CPU machine. A start that does not answer
/v1/models within `start_timeout_s`, or a server that exits, fails with the tail of vLLM's log.

The server gets a process group of its own (to be stopped as one) but stays in the caller's session:
Linux shares the CPU between sessions first (autogroups, `/proc/sys/kernel/sched_autogroup_enabled`),
and a session of its own let vLLM's busy engine and worker starve the mostly idle session of the
client: on a 2-core machine the client process and a monitor beside it got almost no CPU for 1 to 6 s
at a time, again and again, so that requests stopped reaching vLLM and tenants that keep 16 requests
in flight had nothing waiting in vLLM for seconds. In one session the CPU is shared between processes,
and none of those stalls was seen (same load, 60 s: longest gap between samples 0.25 s).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

SERVED_NAME = "tiny"
START_TIMEOUT_S = 600.0  # ~100 s on a quiet 2-core machine; a busy CI machine takes longer
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def plugin_args(config: dict) -> list[str]:
    """The command line of item 1 of issue 19, with `config` as the plugin's additional config."""
    return [
        "--scheduler-cls", "slora_vtc.vllm.FairScheduler",
        "--middleware", "slora_vtc.vllm.TenantMiddleware",
        "--additional-config", json.dumps({"slora_vtc": config}),
    ]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """One vLLM server process (a context manager; `start` and `stop` otherwise)."""

    def __init__(self, model: Path, args: list[str] = (), env: dict[str, str] | None = None,
                 start_timeout_s: float = START_TIMEOUT_S, port: int | None = None):  # fmt: skip
        self.model, self.args = Path(model), list(args)
        self.env = {**os.environ, **CPU_ENV, **(env or {})}
        self.start_timeout_s = start_timeout_s
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(tempfile.mkstemp(prefix="vllm-", suffix=".log")[1])
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model), "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(self.port), *self.args,
        ]  # fmt: skip

    def start(self) -> "VllmServer":
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                process_group=0,  # module docstring
            )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited with status {self.process.returncode}:\n{self.log_tail()}")
            if self.answers():
                return self
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM did not answer within {self.start_timeout_s:.0f} s:\n{self.log_tail()}")

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Stop the server and every process it started (its process group), waiting at most 30 s."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        except ProcessLookupError:
            pass

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
