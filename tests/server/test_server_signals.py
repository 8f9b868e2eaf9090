"""A second SIGINT while `serve` drains: everything left is aborted at once and ends cleanly (a final
error event on every stream, an OpenAI-shaped 503 for every other request), and the process exits
with SIGINT's usual status, long before the drain timeout would have ended it."""

import json
import signal
import threading
import time

import httpx2
import pytest

from tests.helpers.server import ENGINE_FLAGS, free_port, start_server, wait_healthy

pytestmark = pytest.mark.slow  # `slora-vtc serve` as a process

STREAMS, WHOLE = 4, 3  # streaming /v1/completions, then non-streaming /v1/completions and /generate
LONG = 4000  # tokens: seconds of decoding for the batch, far more than the time between the two signals
DRAIN_S = 120  # a drain that alone would let every request finish
BOUND_S = 60  # every wait below is bounded: a hang fails the test instead of blocking it


def running_total(url: str) -> float:
    text = httpx2.get(f"{url}/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("slora_client_running{"))


@pytest.mark.parametrize("engine", ENGINE_FLAGS.values(), ids=ENGINE_FLAGS.keys())
def test_second_sigint_aborts_everything_at_once_and_exits_cleanly(engine):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    pool = str((STREAMS + WHOLE) * (LONG + 8))
    proc = start_server(port, "--pool-tokens", pool, "--drain-timeout", str(DRAIN_S), *engine)
    streams: list[list[str]] = [[] for _ in range(STREAMS)]
    answers: list[httpx2.Response | None] = [None] * WHOLE

    def stream(k: int) -> None:
        body = {"prompt": [1, 2, 3 + k], "max_tokens": LONG, "stream": True, "ignore_eos": True}
        with httpx2.stream("POST", f"{url}/v1/completions", json=body, timeout=BOUND_S) as r:
            streams[k].extend(line for line in r.iter_lines() if line.startswith("data:"))

    def whole(k: int) -> None:
        if k % 2:
            body, path = (
                {"inputs": [1, 2, 9 + k], "parameters": {"max_new_tokens": LONG, "ignore_eos": True}},
                "/generate",
            )
        else:
            body, path = {"prompt": [1, 2, 9 + k], "max_tokens": LONG, "ignore_eos": True}, "/v1/completions"
        answers[k] = httpx2.post(f"{url}{path}", json=body, timeout=BOUND_S)

    try:
        wait_healthy(url, proc)
        threads = [threading.Thread(target=stream, args=(k,)) for k in range(STREAMS)]
        threads += [threading.Thread(target=whole, args=(k,)) for k in range(WHOLE)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + BOUND_S
        while running_total(url) < STREAMS + WHOLE:  # every request is being decoded
            assert time.monotonic() < deadline, "the requests did not all start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)  # the first signal is being handled: the drain has begun
        proc.send_signal(signal.SIGINT)
        for t in threads:
            t.join(BOUND_S)
        _, err = proc.communicate(timeout=BOUND_S)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "Traceback" not in err and "Exception in ASGI application" not in err
    for lines in streams:
        data = [line[5:].strip() for line in lines]
        assert data[-1] == "[DONE]"
        assert "shutting down" in json.loads(data[-2])["error"]["message"]  # aborted, not drained to the end
        assert all("finish_reason" not in d or json.loads(d)["choices"][0]["finish_reason"] is None for d in data[:-2])
    for r in answers:
        assert r is not None and r.status_code == 503
        error = r.json()["error"]
        assert "shutting down" in error["message"] and error["type"] == "service_unavailable"
