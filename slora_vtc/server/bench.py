"""`slora-vtc bench-http TRACE --url URL`: replay a trace against a running server, over HTTP.

As the artifact's benchmark client does: every request is sent at its trace time to
/generate_stream, as its client (X-Client-Id, or the client's API key from a clients file), with
prompt_len dummy token ids and max_new_tokens = output_len (greedy, EOS ignored). First-token and
total latency are measured here, on the client side, and written in the simulator's result
format, so the same figures and tables come out of a served run. Status: finished; rejected
(429, or 400: the server can never fit the request); aborted (any other failure). A replay in
which no request finished is an error that names the commonest reason (e.g. HTTP 401).
"""

import asyncio
import json
import math
import time
from collections import Counter
from dataclasses import dataclass

import httpx2

from slora_vtc.errors import UserError
from slora_vtc.results import Response, RunResult
from slora_vtc.serving.clients import Clients, load_clients
from slora_vtc.traces import read_trace
from slora_vtc.workload import RequestSpec

DUMMY_TOKEN = 3  # a byte token in Llama's vocabulary (and in the byte tokenizer's), never a special one
REJECTED_STATUSES = (400, 429)


@dataclass(frozen=True)
class BenchConfig:
    trace: str
    url: str
    time_scale: float = 1.0  # trace seconds per wall-clock second (as for real runs)
    duration: float | None = None  # replay only the requests sent before this trace time
    clients_file: str | None = None  # to send each client's API key
    connect_timeout_s: float = 10.0

    def check(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise UserError(f"--url must start with http:// or https://, got '{self.url}'")
        if self.time_scale <= 0:
            raise UserError(f"--time-scale must be positive, got {self.time_scale}")
        if self.duration is not None and self.duration <= 0:
            raise UserError(f"--duration must be positive, got {self.duration}")


@dataclass(frozen=True)
class _Outcome:
    status: str
    first_token_s: float = -1.0
    total_s: float = -1.0
    output_len: int | None = None
    why: str = ""  # for a request that did not finish: the HTTP status and the server's message


class NothingServed(UserError):
    """Every request of a replay failed: the run measured nothing."""


def run_bench(config: BenchConfig) -> RunResult:
    config.check()
    records = [r for r in read_trace(config.trace) if config.duration is None or r.arrival < config.duration]
    if not records:
        raise UserError(f"{config.trace}: no request before --duration {config.duration}")
    clients = load_clients(config.clients_file)
    return asyncio.run(_replay(config, records, clients))


async def _replay(config: BenchConfig, records: list[RequestSpec], clients: Clients) -> RunResult:
    url = config.url.rstrip("/")
    timeout = httpx2.Timeout(None, connect=config.connect_timeout_s)  # a queued request may wait long
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx2.AsyncClient(timeout=timeout, limits=limits) as http:
        server = await _server_info(http, url)
        start = time.perf_counter()
        outcomes = await asyncio.gather(
            *(_send(http, url, r, start, config.time_scale, _headers(r.client, clients)) for r in records)
        )
        total = (time.perf_counter() - start) * config.time_scale
    duration = config.duration or math.ceil(records[-1].arrival)
    run_config = {
        "workload": "http",
        "trace": config.trace,
        "url": url,
        "backend": "http",
        "time_scale": config.time_scale,
        "duration": duration,
        **server,
    }
    if not any(o.status == "finished" for o in outcomes):
        raise NothingServed(_why_none(outcomes))
    responses = tuple(_response(r, o, config.time_scale) for r, o in zip(records, outcomes))
    return RunResult(run_config, total, responses)


def _why_none(outcomes: list[_Outcome]) -> str:
    reasons = Counter(o.why or o.status for o in outcomes)
    (reason, count), *others = reasons.most_common()
    more = f"; {sum(n for _, n in others)} for other reasons" if others else ""
    return f"none of the {len(outcomes)} requests finished: {count} got {reason}{more}"


async def _server_info(http: httpx2.AsyncClient, url: str) -> dict:
    try:
        reply = await http.get(f"{url}/health")
    except httpx2.HTTPError as e:
        raise UserError(f"{url}: no server answers ({e})") from None
    if reply.status_code != 200:
        raise UserError(f"{url}/health: the server is not ready (HTTP {reply.status_code})")
    info = reply.json()
    return {k: info[k] for k in ("scheduler", "model", "pool_tokens") if k in info}


def _headers(client: str, clients: Clients) -> dict[str, str]:
    if clients.keys_required:
        entry = clients.named.get(client)
        key = entry.api_key if entry else None
        if not key:
            raise UserError(f"the clients file lists API keys but none for trace client '{client}'")
        return {"Authorization": f"Bearer {key}"}
    return {"X-Client-Id": client}


async def _send(
    http: httpx2.AsyncClient, url: str, rec: RequestSpec, start: float, scale: float, headers: dict
) -> _Outcome:
    await asyncio.sleep(max(0.0, start + rec.arrival / scale - time.perf_counter()))
    body = {
        "inputs": [DUMMY_TOKEN] * rec.prompt_len,
        "parameters": {"max_new_tokens": rec.output_len, "ignore_eos": True, "do_sample": False},
    }
    sent = time.perf_counter()
    first, final = None, None
    try:
        async with http.stream("POST", f"{url}/generate_stream", json=body, headers=headers) as reply:
            if reply.status_code != 200:
                why = f"HTTP {reply.status_code} ({await _error_message(reply)})"
                return _Outcome("rejected" if reply.status_code in REJECTED_STATUSES else "aborted", why=why)
            async for line in reply.aiter_lines():
                event = _event(line)
                if event is None:
                    continue
                if first is None and event.get("token"):
                    first = time.perf_counter() - sent
                if event.get("finished"):
                    final = event
    except httpx2.HTTPError as e:
        return _Outcome("aborted", why=f"a connection error ({type(e).__name__}: {e})")
    details = (final or {}).get("details") or {}
    if first is None or details.get("finish_reason") not in ("length", "stop"):
        return _Outcome(
            "aborted", why=f"a stream that ended without finishing ({details.get('finish_reason', 'no final event')})"
        )
    return _Outcome("finished", first, time.perf_counter() - sent, details.get("generated_tokens"))


async def _error_message(reply: httpx2.Response) -> str:
    """The server's error message (OpenAI's error shape), or the body's first line."""
    body = (await reply.aread()).decode(errors="replace")
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body.strip().splitlines()[0][:200] if body.strip() else "no message"


def _event(line: str) -> dict | None:
    if not line.startswith("data:"):
        return None
    try:
        return json.loads(line[len("data:") :])
    except json.JSONDecodeError:
        return None


def _response(rec: RequestSpec, outcome: _Outcome, scale: float) -> Response:
    served = outcome.status == "finished"
    output_len = outcome.output_len if served and outcome.output_len is not None else rec.output_len
    return Response(
        rec.client,
        rec.prompt_len,
        output_len,
        rec.arrival,
        outcome.first_token_s * scale if served else -1.0,
        outcome.total_s * scale if served else -1.0,
        outcome.status,
    )
