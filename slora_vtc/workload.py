"""What a workload is: requests to send (client, lengths, arrival time), independent of where they
came from (a seeded suite, a trace file, a measured result file)."""

from dataclasses import dataclass, replace

from slora_vtc.errors import UserError
from slora_vtc.request import Request
from slora_vtc.segments import SegmentExpander, Segments

BOS_ID = 1
MAX_REQUESTS = 5_000_000  # a run holds about 1 KB of memory a request (overload at 60,000 s: 270,000 in 270 MB)


def check_size(requests: float, what: str) -> None:
    """Refuse a workload of more requests than a run can hold, before it is made."""
    if requests > MAX_REQUESTS:
        about = f"{requests:,.0f}" if requests < 1e12 else f"{requests:.1e}"
        raise UserError(
            f"{what} would send about {about} requests; a run holds at most {MAX_REQUESTS:,} "
            "(about 1 KB of memory each)"
        )


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload. In trace and result files `arrival` is the field `req_time`.

    `segments`: the prompt as named pieces (slora_vtc.segments), whose lengths sum to prompt_len;
    empty when the prompt is only a length.
    """

    client: str
    prompt_len: int
    output_len: int
    arrival: float
    segments: Segments = ()

    def __post_init__(self):
        if self.segments and sum(length for _, length in self.segments) != self.prompt_len:
            total = sum(length for _, length in self.segments)
            raise UserError(
                f"request of client '{self.client}' at {self.arrival}: its segments sum to {total} tokens, "
                f"prompt_len is {self.prompt_len}"
            )


@dataclass(frozen=True)
class Workload:
    name: str
    clients: tuple[str, ...]
    duration: float
    specs: tuple[RequestSpec, ...]

    def scaled(self, copies: int) -> "Workload":
        """The same clients sending `copies` times as much: every request repeated at its own time
        (for a cluster of N replicas, N copies load each replica as one engine is loaded)."""
        if copies == 1:
            return self
        check_size(len(self.specs) * copies, f"{len(self.specs):,} requests sent {copies} times each")
        return replace(self, specs=tuple(s for s in self.specs for _ in range(copies)))

    def requests(self, added_tokens: int = 0, vocab_size: int = 32000) -> list[Request]:
        """Fresh Request objects in arrival order (each client has its own LoRA adapter, as in the paper).

        `added_tokens`: what the serving path adds to every prompt before the engine sees it (the
        artifact's server tokenizes the client's text with a BOS in front: 1). A request with
        segments gets prompt_ids: that many BOS ids, then its segments' ids (drawn below
        `vocab_size`); one without keeps prompt_ids None.
        """
        expander = SegmentExpander(vocab_size)
        bos = (BOS_ID,) * added_tokens
        return [
            Request(
                s.client,
                s.prompt_len + added_tokens,
                s.output_len,
                s.arrival,
                rid=i,
                adapter=s.client,
                added_tokens=added_tokens,
                prompt_ids=expander.expand(s.segments, bos) if s.segments else None,
            )
            for i, s in enumerate(sorted(self.specs, key=lambda s: s.arrival))
        ]


def client_names(n: int) -> tuple[str, ...]:
    return tuple(f"client{i}" for i in range(n))


def workload_from_result(name: str, result) -> Workload:
    """The requests a result file records, replayable: client, lengths and send times."""
    specs = tuple(RequestSpec(r.client, r.prompt_len, r.output_len, r.req_time) for r in result.responses)
    duration = float(result.config.get("duration", max((s.arrival for s in specs), default=0.0)))
    return Workload(name, tuple(result.clients), duration, specs)
