"""What the server counts per client, and a consistent snapshot of it with the engine's state."""

from dataclasses import dataclass

from slora_vtc.request import State


@dataclass
class ClientStats:
    """One client's requests and served tokens since the server started (engine thread only)."""

    admitted: int = 0  # accepted by the scheduler at arrival
    rejected: int = 0  # refused at arrival (rate limit, shutdown)
    finished: int = 0
    aborted: int = 0  # client disconnected, shutdown, model failure
    input_tokens: int = 0  # prompts prefilled
    output_tokens: int = 0  # tokens generated

    def ended(self, state: State) -> None:
        if state is State.FINISHED:
            self.finished += 1
        elif state is State.ABORTED:
            self.aborted += 1
        elif state is State.REJECTED:
            self.rejected += 1

    def served(self, input_tokens: int, output_tokens: int) -> None:
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens


@dataclass(frozen=True)
class Snapshot:
    clients: dict[str, ClientStats]
    counters: dict[str, float]  # VTC's virtual counters (empty for schedulers without one)
    waiting: dict[str, int]
    running: dict[str, int]
    pool_size: int
    pool_used: int
    adapters_resident: int
