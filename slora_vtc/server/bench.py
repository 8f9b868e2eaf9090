"""`slora-vtc bench-http TRACE --url URL [--api slora|openai]`: replay a trace against a running
server, over HTTP, each trace client a tenant.

Every request is sent at its trace time, as its client (X-Client-Id, or the client's API key from
a clients file), with the trace's prompt and output lengths (EOS ignored), by a sender speaking
the server's protocol: S-LoRA's /generate_stream as the artifact's benchmark client did
(bench_slora.py), or OpenAI's streamed /v1/completions for any OpenAI-compatible server
(bench_openai.py). First-token and total latency are measured here, on the client side, and
written in the simulator's result format, so the same figures, tables and `calibrate` work on a
served run. Status: finished; rejected (429, or 400: the server can never fit the request);
aborted (any other failure, a request past its timeout, or one the run's deadline cut off). A
replay in which no request finished is an error that names the commonest reason (e.g. HTTP 401).
"""

import asyncio
import math
import time
from collections import Counter
from dataclasses import dataclass

from slora_vtc.errors import UserError
from slora_vtc.progress import LazyProgress
from slora_vtc.results import Response, RunResult
from slora_vtc.server.bench_outcome import Outcome, Sender
from slora_vtc.serving.clients import Clients, load_clients
from slora_vtc.traces import read_trace
from slora_vtc.workload import RequestSpec

APIS = ("slora", "openai")


@dataclass(frozen=True)
class BenchConfig:
    trace: str
    url: str
    time_scale: float = 1.0  # trace seconds per wall-clock second (as for real runs)
    duration: float | None = None  # replay only the requests sent before this trace time
    clients_file: str | None = None  # to send each client's API key
    connect_timeout_s: float = 10.0
    api: str = "slora"  # the protocol: S-LoRA's /generate_stream, or OpenAI's /v1/completions
    model: str | None = None  # openai: the model to ask for (default: the first the server lists)
    request_timeout_s: float = 600.0  # a request still going after this (wall-clock) is aborted
    deadline_s: float | None = None  # wall-clock seconds for the whole run (default: last send + request timeout)
    prompt_seed: int = 0  # openai: which random prompts (bench_openai.prompt_ids)

    def check(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise UserError(f"--url must start with http:// or https://, got '{self.url}'")
        if self.api not in APIS:
            raise UserError(f"--api must be one of {', '.join(APIS)}, got '{self.api}'")
        if self.model is not None and self.api != "openai":
            raise UserError("--model is for --api openai (S-LoRA's /generate_stream serves one model)")
        if self.prompt_seed and self.api != "openai":
            raise UserError(
                "--prompt-seed is for --api openai (the S-LoRA sender sends one dummy token id, the artifact's way)"
            )
        for flag, value in (
            ("--time-scale", self.time_scale),
            ("--duration", self.duration),
            ("--request-timeout", self.request_timeout_s),
            ("--deadline", self.deadline_s),
        ):
            if value is not None and not value > 0:
                raise UserError(f"{flag} must be positive, got {value}")


class NothingServed(UserError):
    """Every request of a replay failed: the run measured nothing."""


def run_bench(config: BenchConfig, progress: bool = False) -> RunResult:
    """The replay; `progress`: a bar of the requests that ended, once the run has lasted a second."""
    config.check()
    records = [r for r in read_trace(config.trace) if config.duration is None or r.arrival < config.duration]
    if not records:
        raise UserError(f"{config.trace}: no request before --duration {config.duration}")
    clients = load_clients(config.clients_file)
    headers = [_headers(r.client, clients) for r in records]
    with LazyProgress(len(records), "bench-http", enabled=progress) as bar:
        return asyncio.run(_replay(config, records, headers, bar))


def _sender(config: BenchConfig, url: str) -> Sender:
    if config.api == "openai":
        from slora_vtc.server.bench_openai import OpenAISender

        return OpenAISender(url, config.model, config.connect_timeout_s, config.prompt_seed)
    from slora_vtc.server.bench_slora import SloraSender

    return SloraSender(url, config.connect_timeout_s)


async def _replay(config: BenchConfig, records: list[RequestSpec], headers: list[dict], bar: LazyProgress) -> RunResult:
    url = config.url.rstrip("/")
    sender = _sender(config, url)
    try:
        server = await sender.server_info()
        start = time.perf_counter()
        outcomes = await _send_all(sender, config, records, headers, start, bar)
        total = (time.perf_counter() - start) * config.time_scale
    finally:
        await sender.aclose()
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


async def _send_all(
    sender: Sender,
    config: BenchConfig,
    records: list[RequestSpec],
    headers: list[dict],
    start: float,
    bar: LazyProgress,
) -> list[Outcome]:
    """Every request at its time, each bounded by the request timeout and all by the run's deadline;
    `bar` counts those that ended."""
    last_send = records[-1].arrival / config.time_scale
    deadline = config.deadline_s or last_send + config.request_timeout_s + 1.0

    async def one(index: int, rec: RequestSpec) -> Outcome:
        await asyncio.sleep(max(0.0, start + rec.arrival / config.time_scale - time.perf_counter()))
        try:
            return await asyncio.wait_for(sender.send(rec, index, headers[index]), config.request_timeout_s)
        except TimeoutError:
            return Outcome("aborted", why=f"no end within --request-timeout {config.request_timeout_s:g} s")
        finally:
            bar.update()

    tasks = [asyncio.create_task(one(i, r)) for i, r in enumerate(records)]
    await asyncio.wait(tasks, timeout=max(0.0, start + deadline - time.perf_counter()))
    for task in tasks:
        task.cancel()  # those still waiting or streaming: closing the stream aborts them on the server
    await asyncio.gather(*tasks, return_exceptions=True)
    cut = Outcome("aborted", why=f"the run's --deadline of {deadline:g} s")
    return [t.result() if not t.cancelled() else cut for t in tasks]


def _why_none(outcomes: list[Outcome]) -> str:
    reasons = Counter(o.why or o.status for o in outcomes)
    (reason, count), *others = reasons.most_common()
    more = f"; {sum(n for _, n in others)} for other reasons" if others else ""
    return f"none of the {len(outcomes)} requests finished: {count} got {reason}{more}"


def _headers(client: str, clients: Clients) -> dict[str, str]:
    if clients.keys_required:
        entry = clients.named.get(client)
        key = entry.api_key if entry else None
        if not key:
            raise UserError(f"the clients file lists API keys but none for trace client '{client}'")
        return {"Authorization": f"Bearer {key}"}
    return {"X-Client-Id": client}


def _response(rec: RequestSpec, outcome: Outcome, scale: float) -> Response:
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
