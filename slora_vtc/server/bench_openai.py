"""bench-http's OpenAI sender (`--api openai`): any OpenAI-compatible server (vLLM, our `serve`, our
gateway, ...) through the `openai` client.

Each request is a streamed /v1/completions of the trace's lengths: a prompt of prompt_len token ids,
max_tokens = output_len, `ignore_eos` (vLLM's extension, and ours) so that exactly that many tokens
come, greedy, and `stream_options.include_usage` so that the last chunk reports the tokens
generated. The tenant is named as for the S-LoRA sender (X-Client-Id, or its API key). The first
chunk carrying a choice is the first token. The prompts' ids are drawn per request (seeded by its
index in the trace) from the ids 3..255 (byte tokens in Llama-style vocabularies), so that a prefix cache
finds nothing two prompts share: every prompt costs its prefill, as the trace's lengths say.
"""

import random
import time

import httpx2
import openai

from slora_vtc.errors import UserError
from slora_vtc.server.bench_outcome import Outcome, refused
from slora_vtc.workload import RequestSpec

PROMPT_TOKENS = range(3, 256)  # not the special tokens 0-2 (unk, bos, eos); in every vocabulary of 256 or more
FINISHED = ("length", "stop")


def prompt_ids(index: int, length: int, seed: int = 0) -> list[int]:
    """The token ids of trace request `index`'s prompt: the same on every run with the same `seed`,
    nothing shared with another seed's."""
    return random.Random(index if seed == 0 else f"{seed}/{index}").choices(PROMPT_TOKENS, k=length)


class OpenAISender:
    def __init__(self, url: str, model: str | None, connect_timeout_s: float, prompt_seed: int = 0):
        self.url, self.model, self.prompt_seed = url, model, prompt_seed
        limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
        self.http = openai.DefaultAsyncHttpxClient(limits=limits)
        self.client = openai.AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key="EMPTY",  # a tenant's own key, where the clients file gives one, goes in its headers
            max_retries=0,  # a retried request would be measured as one
            timeout=httpx2.Timeout(None, connect=connect_timeout_s),  # bench.py bounds each request's time
            http_client=self.http,
        )

    async def aclose(self) -> None:
        await self.client.close()

    async def server_info(self) -> dict:
        """The model to ask for (--model, which the server must list, else the first it lists), and
        what the server's /health says of itself where it says anything (our serve and gateway do)."""
        served = await self._models()
        if self.model is None:
            self.model = served[0]
        elif self.model not in served:
            raise UserError(f"{self.url} does not serve model '{self.model}' (it serves: {', '.join(served)})")
        return {"api": "openai", "model": self.model, **await self._health()}

    async def _models(self) -> list[str]:
        try:
            page = await self.client.models.list()
        except openai.APIStatusError as e:
            raise UserError(f"{self.url}/v1/models: HTTP {e.status_code} ({_message(e)})") from None
        except openai.APIError as e:
            raise UserError(f"{self.url}: no server answers ({type(e).__name__}: {e})") from None
        served = [m.id for m in page.data]
        if not served:
            raise UserError(f"{self.url}/v1/models lists no model")
        return served

    async def _health(self) -> dict:
        try:
            info = (await self.http.get(f"{self.url}/health")).json()
        except (httpx2.HTTPError, ValueError):
            return {}
        return {k: info[k] for k in ("scheduler", "pool_tokens") if isinstance(info, dict) and k in info}

    async def send(self, rec: RequestSpec, index: int, headers: dict[str, str]) -> Outcome:
        first = finish = usage = None
        sent = time.perf_counter()
        try:
            stream = await self.client.completions.create(
                model=self.model,
                prompt=prompt_ids(index, rec.prompt_len, self.prompt_seed),
                max_tokens=rec.output_len,
                temperature=0.0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
                extra_headers=headers,
            )
            async with stream:
                async for chunk in stream:
                    if chunk.choices:
                        first = first if first is not None else time.perf_counter() - sent
                        finish = chunk.choices[0].finish_reason or finish
                    usage = chunk.usage or usage
        except openai.APIStatusError as e:
            return refused(e.status_code, _message(e))
        except openai.APIError as e:  # no connection, or a stream that broke off or carried an error
            return Outcome("aborted", why=f"a connection error ({type(e).__name__}: {e})")
        if first is None or finish not in FINISHED:
            return Outcome("aborted", why=f"a stream that ended without finishing ({finish or 'no finish reason'})")
        return Outcome("finished", first, time.perf_counter() - sent, usage.completion_tokens if usage else None)


def _message(error: openai.APIStatusError) -> str:
    """The server's error message (OpenAI's error shape), else what the client made of the reply."""
    body = error.body
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return error.message
