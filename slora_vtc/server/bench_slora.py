"""bench-http's S-LoRA sender (`--api slora`, the default): as the artifact's benchmark client, each
request goes to /generate_stream with prompt_len dummy token ids and max_new_tokens = output_len
(greedy, EOS ignored); the first event carrying a token is the first token."""

import json
import time

import httpx2

from slora_vtc.errors import UserError
from slora_vtc.server.bench_outcome import Outcome, refused
from slora_vtc.workload import RequestSpec

DUMMY_TOKEN = 3  # a byte token in Llama's vocabulary (and in the byte tokenizer's), never a special one


class SloraSender:
    def __init__(self, url: str, connect_timeout_s: float):
        self.url = url
        timeout = httpx2.Timeout(None, connect=connect_timeout_s)  # bench.py bounds each request's time
        limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
        self.http = httpx2.AsyncClient(timeout=timeout, limits=limits)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def server_info(self) -> dict:
        try:
            reply = await self.http.get(f"{self.url}/health")
        except httpx2.HTTPError as e:
            raise UserError(f"{self.url}: no server answers ({e})") from None
        if reply.status_code != 200:
            raise UserError(f"{self.url}/health: the server is not ready (HTTP {reply.status_code})")
        info = reply.json()
        return {k: info[k] for k in ("scheduler", "model", "pool_tokens") if k in info}

    async def send(self, rec: RequestSpec, index: int, headers: dict[str, str]) -> Outcome:
        body = {
            "inputs": [DUMMY_TOKEN] * rec.prompt_len,
            "parameters": {"max_new_tokens": rec.output_len, "ignore_eos": True, "do_sample": False},
        }
        sent = time.perf_counter()
        first, final = None, None
        try:
            async with self.http.stream("POST", f"{self.url}/generate_stream", json=body, headers=headers) as reply:
                if reply.status_code != 200:
                    return refused(reply.status_code, await _error_message(reply))
                async for line in reply.aiter_lines():
                    event = _event(line)
                    if event is None:
                        continue
                    if first is None and event.get("token"):
                        first = time.perf_counter() - sent
                    if event.get("finished"):
                        final = event
        except httpx2.HTTPError as e:
            return Outcome("aborted", why=f"a connection error ({type(e).__name__}: {e})")
        details = (final or {}).get("details") or {}
        if first is None or details.get("finish_reason") not in ("length", "stop"):
            reason = details.get("finish_reason", "no final event")
            return Outcome("aborted", why=f"a stream that ended without finishing ({reason})")
        return Outcome("finished", first, time.perf_counter() - sent, details.get("generated_tokens"))


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
