"""Client load for the vLLM tests, through the `openai` client: tenants that each keep a number of
streaming completions in flight (a closed loop), bounded in time; tokens counted as they arrive.

Prompts are token ids drawn at random (seeded), so that the prefix cache does not favour anyone;
`ignore_eos` makes every request produce exactly `max_tokens` tokens.
"""

import asyncio
import random
import threading
import time
from dataclasses import dataclass, field

import httpx
from openai import APIConnectionError, AsyncOpenAI

VOCAB = range(3, 250)  # the tiny model's ordinary tokens (0-2 are special)

# The fairness tests' load. A tenant is backlogged only while vLLM holds one of its requests waiting;
# each request also spends time outside vLLM: its tokens streamed out through vLLM's API server to
# this process, the next request on its way in. On the tiny model (hidden 256, 4 layers) vLLM on a
# quiet 2-core machine made tokens faster than both could stream them, and most requests were out:
# with outputs of 384-640 tokens the light tenant (8 in flight) had under one request running on
# average and nothing waiting in most samples, and the heavy one (24) nothing waiting in a third of
# them; VTC rightly gave the turns away, and no scheduler could have been judged. The servers that
# are loaded serve a slower model (conftest.py's load_model), on which both tenants wait throughout
# (each test checks it); drawn uniformly so that requests admitted together end apart. VTC holds
# backlogged tenants' services within about one request's cost of each other, small against what
# each receives in the window. Those observations of the tiny model were made with vLLM in a session of
# its own, which starved this process (server.py); re-checked in one session with this load (24 and 8 in
# flight, 60 s), both tenants had requests waiting in vLLM in all 184 samples on the tiny model too.
PROMPT, OUTPUT = 32, (96, 224)
RUN_S, WINDOW = 60.0, (10.0, 56.0)  # seconds of load, and the window measured (all backlogged)


def client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120.0)


def prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.choice(VOCAB) for _ in range(length)]


@dataclass
class Served:
    """What one tenant received: token arrival times, and the usage of each request that finished."""

    token_times: list[float] = field(default_factory=list)
    usages: list[tuple[int, int]] = field(default_factory=list)  # (prompt_tokens, completion_tokens)
    errors: list[str] = field(default_factory=list)
    resets: list[str] = field(default_factory=list)  # connections reset before any of the answer came (`is_reset`)

    def tokens_between(self, start: float, end: float) -> int:
        return sum(start <= t < end for t in self.token_times)


async def complete(api: AsyncOpenAI, tenant: str, ids: list[int], max_tokens: int, served: Served) -> None:
    """One streaming completion; its tokens and usage are noted in `served`."""
    stream = await api.completions.create(
        model="tiny", prompt=ids, max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        extra_headers={"X-Client-Id": tenant},
    )  # fmt: skip
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text is not None:
            served.token_times.append(time.monotonic())
        if chunk.usage is not None:
            served.usages.append((chunk.usage.prompt_tokens, chunk.usage.completion_tokens))


def is_reset(error: BaseException) -> bool:
    """The openai client's connection error caused by the connection being reset (ECONNRESET)."""
    if not isinstance(error, APIConnectionError):
        return False
    cause = error.__cause__
    while cause is not None and not isinstance(cause, ConnectionResetError):
        cause = cause.__cause__ or cause.__context__
    return cause is not None


async def closed_loop(url: str, in_flight: dict[str, int], seconds: float, prompt_len: int,
                      max_tokens: tuple[int, int], seed: int = 0) -> dict[str, Served]:  # fmt: skip
    """Each tenant keeps `in_flight[tenant]` requests going for `seconds`, each asking for a number of
    tokens drawn in `max_tokens` (so that requests admitted together do not all end together); then
    every request still going is cancelled (its client disconnects, so vLLM aborts it)."""
    api, rng = client(url), random.Random(seed)
    served = {tenant: Served() for tenant in in_flight}
    deadline = time.monotonic() + seconds

    async def worker(tenant: str) -> None:
        while time.monotonic() < deadline:
            received = len(served[tenant].token_times)
            try:
                tokens = rng.randint(*max_tokens)
                await complete(api, tenant, prompt(rng, prompt_len), tokens, served[tenant])
            except Exception as e:  # noted, with its cause (the openai client's own error hides it); the test decides
                said = f"{e!r} from {e.__cause__!r}" if e.__cause__ else repr(e)
                answered = len(served[tenant].token_times) > received
                (served[tenant].resets if is_reset(e) and not answered else served[tenant].errors).append(said)
                await asyncio.sleep(0.1)

    tasks = [asyncio.create_task(worker(t)) for t, n in in_flight.items() for _ in range(n)]
    await asyncio.sleep(seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await api.close()
    return served


async def batch(url: str, requests: list[tuple[str, int, int]], seed: int = 0) -> dict[str, Served]:
    """Send (tenant, prompt length, max tokens) requests all at once and wait for all of them."""
    api, rng = client(url), random.Random(seed)
    served = {tenant: Served() for tenant, _, _ in requests}
    await asyncio.wait_for(
        asyncio.gather(*(complete(api, t, prompt(rng, p), m, served[t]) for t, p, m in requests)), timeout=600
    )
    await api.close()
    return served


def run(coroutine):
    """Run a coroutine to its end on a loop of its own (the tests are not async)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


def service_ratio(url: str, in_flight: dict[str, int], seconds: float, window: tuple[float, float], prompt_len: int,
                  max_tokens: tuple[int, int]) -> tuple[float, dict[str, Served]]:  # fmt: skip
    """`closed_loop`, then the first tenant's tokens over the second's within `window` (seconds after
    about the load's start, when every tenant is backlogged); with what each tenant received."""
    served = run(closed_loop(url, in_flight, seconds, prompt_len, max_tokens))
    t0 = min(min(s.token_times) for s in served.values() if s.token_times) - 1.0  # about the load's start
    first, second = (served[t].tokens_between(t0 + window[0], t0 + window[1]) for t in in_flight)
    assert second > 100, f"too little service measured: {first} and {second} tokens"
    return first / second, served


class Sampler:
    """Reads `read()` every `every_s` in a thread while a load runs; `rows` holds (monotonic time, value)."""

    def __init__(self, read, every_s: float = 0.2):
        self.read, self.every_s, self.rows, self._stop = read, every_s, [], threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            try:
                self.rows.append((time.monotonic(), self.read()))
            except (OSError, ValueError, httpx.HTTPError):  # a stats file being replaced, a server busy
                pass
            self._stop.wait(self.every_s)

    @property
    def values(self) -> list:
        return [value for _, value in self.rows]

    def between(self, start: float, end: float) -> list:
        """The values read from `start` to `end` (monotonic times)."""
        return [value for t, value in self.rows if start <= t <= end]

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)


def assert_backlogged(stats: list[dict], tenants) -> None:
    """Every tenant had a request waiting in vLLM in at least 90 % of the plugin's stats samples `stats`:
    what "backlogged" means to a scheduler (the note on OUTPUT)."""
    for tenant in tenants:
        waiting = [int(s["tenants"].get(tenant, {}).get("waiting", 0)) for s in stats]
        idle = waiting.count(0)
        assert idle <= 0.1 * len(stats), f"{tenant} had nothing waiting in {idle} of {len(stats)} samples: {waiting}"


def wait_until(predicate, timeout_s: float = 30.0, every_s: float = 0.5):
    """Poll `predicate` until it returns something true (returned) or the time is up (AssertionError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
        except (OSError, ValueError):  # a stats file being replaced
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s} s")
        time.sleep(every_s)
