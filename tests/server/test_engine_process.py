"""The engine in a process of its own (`serve`'s default): what only a separate engine process can do (die on its
own, fail at start), and the same tokens as the engine in the server's thread. The rest of the HTTP behaviour runs
in tests/server/test_server.py against both."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest

from slora_vtc.errors import UserError
from slora_vtc.server.context import ServerConfig, build_context
from slora_vtc.server.engine_process import ENGINE_GONE, start_engine_process
from tests.helpers import sigint_probe
from tests.helpers.server import running_server, start_long_stream

BODY = {"model": "tiny", "prompt": [1, 7, 8, 9], "max_tokens": 9, "temperature": 0, "ignore_eos": True}


def test_the_same_tokens_as_the_engine_in_a_thread():
    texts = []
    for engine_process in (False, True):
        with running_server(pool_tokens=1000, engine_process=engine_process, seed=3) as srv:
            texts.append(httpx2.post(f"{srv.url}/v1/completions", json=BODY, timeout=30).json()["choices"][0]["text"])
    assert texts[0] == texts[1] and texts[0]


def test_an_engine_that_dies_ends_every_open_request_and_the_server_refuses_new_ones():
    with running_server(pool_tokens=5000, engine_process=True) as srv:
        reader, lines = start_long_stream(srv.url, {**BODY, "max_tokens": 4000})
        os.kill(srv.ctx.service.process.pid, signal.SIGKILL)
        reader.join(30)
        assert not reader.is_alive()
        data = [line[5:].strip() for line in lines if line.startswith("data:")]
        assert data[-1] == "[DONE]" and ENGINE_GONE in json.loads(data[-2])["error"]["message"]
        health = httpx2.get(f"{srv.url}/health")
        assert health.status_code == 503
        refused = httpx2.post(f"{srv.url}/v1/completions", json=BODY, timeout=30)
        assert refused.status_code == 503 and refused.json()["error"]["message"]


def test_the_engine_process_ignores_sigint_from_its_first_import():
    """A Ctrl-C reaches the engine process too (the terminal's process group); the server relays stops itself.
    The child must ignore SIGINT before its first imports (unpickling its target), not only once _child_main
    runs, or a Ctrl-C at start prints a KeyboardInterrupt traceback from the child."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a server started from a terminal
    try:
        with pytest.raises(UserError, match="SIGINT ignored at import: True"):
            start_engine_process(sigint_probe.build_service)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the server's own handler is back
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_failure_inside_the_engine_process_at_start_is_one_clear_error():
    with pytest.raises(UserError, match="--device cuda: no CUDA GPU is available"):
        build_context(ServerConfig(engine_process=True, device="cuda"))


@pytest.mark.parametrize("started", [False, True])
def test_a_server_that_exits_without_a_shutdown_leaves_no_engine_process(tmp_path, started):
    """The child ignores SIGTERM (the server relays its stops), so multiprocessing's own exit handler could not end
    it: the server's exit closes the pipe, which stops it."""
    script = tmp_path / "server.py"
    script.write_text(
        "import sys\n"
        "from slora_vtc.server.context import ServerConfig, build_context\n"
        "if __name__ == '__main__':\n"
        "    ctx = build_context(ServerConfig(engine_process=True))\n"
        "    print(ctx.service.process.pid, flush=True)\n"
        "    if sys.argv[1] == 'started':\n"
        "        ctx.service.start()\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path.cwd())}
    done = subprocess.run(
        [sys.executable, str(script), "started" if started else "built"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    child = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _alive(child):  # an orphan once the server has exited: init reaps it as it ends
        assert time.monotonic() < deadline, "the engine process outlived the server"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_metrics_export_the_engine_process_beside_the_server_process():
    """The engine's CPU time is spent in its own process: /metrics exports that process's series under
    slora_engine_process_* (the server's own stay process_*); the engine in a thread has no such series."""
    for engine_process in (False, True):
        with running_server(pool_tokens=1000, engine_process=engine_process) as srv:
            assert httpx2.post(f"{srv.url}/v1/completions", json=BODY, timeout=30).status_code == 200
            page = httpx2.get(f"{srv.url}/metrics", timeout=30).text
        lines = {line.split(" ")[0]: line.split(" ")[1] for line in page.splitlines() if not line.startswith("#")}
        assert float(lines["process_cpu_seconds_total"]) > 0
        if engine_process:  # the engine loaded a model and ran a request: it used CPU and memory of its own
            assert float(lines["slora_engine_process_cpu_seconds_total"]) > 0
            assert float(lines["slora_engine_process_resident_memory_bytes"]) > 0
        else:
            assert not any(name.startswith("slora_engine_process_") for name in lines)
