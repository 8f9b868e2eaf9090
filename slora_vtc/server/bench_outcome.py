"""What one replayed request came to, as a bench-http sender reports it, and the sender's shape.

A sender speaks one protocol (S-LoRA's /generate_stream: bench_slora.py; OpenAI's /v1/completions:
bench_openai.py); bench.py schedules the requests, bounds them in time and writes the result file.
"""

from dataclasses import dataclass
from typing import Protocol

from slora_vtc.workload import RequestSpec

REJECTED_STATUSES = (400, 429)  # 429: refused for now (rate, queue); 400: the server can never fit it


@dataclass(frozen=True)
class Outcome:
    status: str  # finished | rejected | aborted
    first_token_s: float = -1.0  # from the send, for a finished request
    total_s: float = -1.0
    output_len: int | None = None  # tokens generated, as the server reports them (None: not reported)
    why: str = ""  # for a request that did not finish: the HTTP status and the server's message


def refused(status_code: int, message: str) -> Outcome:
    """A request the server answered with an error status."""
    status = "rejected" if status_code in REJECTED_STATUSES else "aborted"
    return Outcome(status, why=f"HTTP {status_code} ({message})")


class Sender(Protocol):
    async def server_info(self) -> dict:
        """What the run's config records about the server (raises UserError when none answers)."""

    async def send(self, rec: RequestSpec, index: int, headers: dict[str, str]) -> Outcome:
        """Send trace request number `index` now, as the client whose `headers` are given."""

    async def aclose(self) -> None: ...
