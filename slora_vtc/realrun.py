"""Real-engine commands beside `run`: `generate` (token ids for prompts) and `profile` (a cost
profile of this hardware, in the artifact's format, plus prefix-hit points: prefills over a cached
prefix). Imported lazily: it imports torch.
"""

from tqdm import tqdm

from slora_vtc.backends.llama import LlamaBackend, build_backend
from slora_vtc.builder import build_engine
from slora_vtc.clock import VirtualClock
from slora_vtc.config import EngineConfig
from slora_vtc.errors import UserError
from slora_vtc.memory import MemoryManager, TokenPool
from slora_vtc.model.adapters import AdapterTable
from slora_vtc.model.sampling_params import SamplingParams
from slora_vtc.model.spec import resolve_spec
from slora_vtc.profile import PrefixHitPoint, ProfilePoint
from slora_vtc.request import Request, State
from slora_vtc.sched import build_scheduler

# The grid of the artifact's profile (profiles/a10g_llama7b.json): every input length with one
# output token, and four input lengths with longer outputs.
ARTIFACT_GRID: tuple[tuple[int, int], ...] = (
    *((i, 1) for i in (8, 16, 32, 64, 128, 256, 512)),
    *((i, o) for i in (8, 64, 256, 512) for o in (64, 128, 196, 256)),
)
# (cached_len, extend_len) of the prefix-hit points: a long and a short cached prefix, a short and a longer extension
PREFIX_GRID: tuple[tuple[int, int], ...] = tuple((c, e) for c in (256, 1024) for e in (32, 128))


def generate(
    model: str,
    prompts: list[list[int]],
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    ignore_eos: bool = False,
    backend: str = "torch",
    device: str | None = None,
    dtype: str | None = None,
    seed: int = 0,
    pool_tokens: int | None = None,
    adapters: AdapterTable = AdapterTable(),
    use_lora: str | None = None,
) -> list[list[int]]:
    """Generated token ids per prompt, all prompts served together by the engine (with adapter `use_lora`, if given)."""
    spec = resolve_spec(model)
    adapters = AdapterTable((adapters.get(use_lora),)) if use_lora else AdapterTable()  # an unknown name is an error
    if max_new_tokens <= 0:
        raise UserError(f"--max-new-tokens must be positive, got {max_new_tokens}")
    for ids in prompts:
        _check_prompt(ids, spec.vocab_size)
    lora_slots = sum(size for _, size in adapters.sizes(spec))
    pool = pool_tokens or sum(len(p) + max_new_tokens for p in prompts) + 1 + lora_slots
    for ids in prompts:
        if len(ids) + max_new_tokens >= pool - lora_slots:
            raise UserError(
                f"a prompt of {len(ids)} tokens plus {max_new_tokens} new tokens does not fit a pool of {pool} tokens"
                + (f" ({lora_slots} of them for adapter '{use_lora}')" if lora_slots else "")
            )
        if len(ids) + max_new_tokens > spec.max_position:
            raise UserError(f"{len(ids)} + {max_new_tokens} tokens exceed the model's context of {spec.max_position}")
    llama = build_backend(backend, model, pool, adapters, device, dtype, seed, sampling)
    config = EngineConfig(
        pool_tokens=pool,
        lora_rank=0,
        batch_max_tokens_override=max(sum(map(len, prompts)), 1),
        adapter_sizes=adapters.sizes(spec),
    )
    engine = build_engine(config, build_scheduler("fcfs", ["generate"]), llama, VirtualClock())  # times nothing
    stop = () if ignore_eos else spec.eos_token_ids
    requests = [
        Request("generate", len(ids), max_new_tokens, 0.0, prompt_ids=list(ids), stop_tokens=stop, adapter=use_lora)
        for ids in prompts
    ]
    engine.run(requests)
    for i, r in enumerate(requests):
        if r.state is not State.FINISHED:
            raise UserError(f"prompt {i + 1} was not served: {r.reason}")
    return [r.output_ids for r in requests]


def _check_prompt(ids: list[int], vocab: int) -> None:
    if not ids:
        raise UserError("a prompt needs at least one token id")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise UserError(f"token id {bad[0]} is outside the model's vocabulary (0..{vocab - 1})")


def measure_profile(
    backend: str,
    model: str,
    pool_tokens: int = 10_000,
    grid=ARTIFACT_GRID,
    device: str | None = None,
    dtype: str | None = None,
    max_batch: int | None = None,
    seed: int = 0,
    progress: bool = False,
    adapters: AdapterTable = AdapterTable(),
    prefix_grid=(),
) -> tuple[list[ProfilePoint], list[PrefixHitPoint]]:
    """Prefill and decode seconds per request at each (input, output) length, as the artifact measured,
    and prefill seconds per request at each (cached, extend) length of `prefix_grid`.

    pool // (input + output) requests (at most `max_batch`) run together: one prefill, then
    `output` decode steps; times are the batch's totals divided by its size. A prefix-hit point runs
    pool // (cached + extend) requests the same way, timing one prefill that computes only the last
    `extend` tokens of each prompt. With adapters, the requests use them in turn (all resident: their
    slots come off the pool first).
    """
    for i, o in grid:
        if i <= 0 or o <= 0 or i + o > pool_tokens:
            raise UserError(f"profile point ({i}, {o}) does not fit a pool of {pool_tokens} tokens")
    room = _kv_room(pool_tokens, model, adapters)
    for c, e in prefix_grid:
        if c <= 0 or e <= 0 or c + e > room:
            raise UserError(
                f"prefix-hit point (cached {c}, extend {e}) does not fit the {room} tokens a pool of "
                f"{pool_tokens} leaves for KV (and the model's context)"
            )
    llama = build_backend(backend, model, pool_tokens, adapters, device, dtype, seed)
    llama.warmup()
    config = EngineConfig(pool_tokens=pool_tokens, adapter_sizes=adapters.sizes(llama.spec))
    memory = MemoryManager(TokenPool(pool_tokens), config.slots_of, on_load=llama.load_adapter)
    free = pool_tokens - sum(size for _, size in config.adapter_sizes)

    def batch_of(tokens: int) -> int:
        return max(1, min(free // tokens, max_batch or pool_tokens))

    points, hits = [], []
    for i, o in tqdm(grid, desc="profile", unit="point", disable=not progress, leave=False):
        batch = batch_of(i + o)
        prefill_s, decode_s = _measure(llama, memory, i, o, batch, adapters.names)
        points.append(ProfilePoint(i, o, batch, prefill_s / batch, decode_s / batch))
    for c, e in tqdm(prefix_grid, desc="prefix hits", unit="point", disable=not progress, leave=False):
        batch = batch_of(c + e)
        hits.append(PrefixHitPoint(batch, c, e, _measure_hit(llama, memory, c, e, batch, adapters.names) / batch))
    return points, hits


def fitting_prefix_grid(
    pool_tokens: int, model: str, adapters: AdapterTable = AdapterTable(), grid=PREFIX_GRID
) -> tuple[tuple[int, int], ...]:
    """The pairs of `grid` that fit the pool (beside the adapters) and the model's context: the default
    grid shrinks to a small pool."""
    room = _kv_room(pool_tokens, model, adapters)
    return tuple((c, e) for c, e in grid if c + e <= room)


def _kv_room(pool_tokens: int, model: str, adapters: AdapterTable) -> int:
    """The longest request a pool holds beside every adapter, within the model's context."""
    spec = resolve_spec(model)
    return min(pool_tokens - sum(size for _, size in adapters.sizes(spec)), spec.max_position)


def _measure_hit(
    backend: LlamaBackend,
    memory: MemoryManager,
    cached: int,
    extend: int,
    batch: int,
    adapters: list[str],
    repeats: int = 3,
) -> float:
    """Seconds of a prefill of `batch` requests whose first `cached` tokens' K/V are in the pool (the median
    of `repeats`): a cold prefill first writes every prompt's K/V (and keeps its drawn ids on the request)."""
    reqs = [
        Request("profile", cached + extend, 1, 0.0, rid=k, adapter=adapters[k % len(adapters)] if adapters else None)
        for k in range(batch)
    ]
    memory.admit(reqs)
    try:
        times = []
        for _ in range(repeats + 1):
            result = backend.prefill(reqs)
            if result.failed:
                raise RuntimeError(f"the model failed while profiling the prefix hit ({cached}, {extend})")
            times.append(result.elapsed)
            for r in reqs:
                backend.release(r)  # its row goes; its slots, and their K/V, stay
                r.cached_len = cached
    finally:
        for r in reqs:
            memory.release(r)
            backend.release(r)
    return sorted(times[1:])[repeats // 2]


def _measure(
    backend: LlamaBackend, memory: MemoryManager, input_len: int, output_len: int, batch: int, adapters: list[str]
) -> tuple[float, float]:
    reqs = [
        Request(
            "profile", input_len, output_len + 1, 0.0, rid=k, adapter=adapters[k % len(adapters)] if adapters else None
        )
        for k in range(batch)
    ]
    memory.admit(reqs)
    try:
        step = backend.prefill
        times = []
        for _ in range(output_len + 1):  # one prefill, then `output_len` decode steps
            if times:
                memory.extend(reqs)
            result = step(reqs)
            if result.failed:
                raise RuntimeError(f"the model failed while profiling ({input_len}, {output_len})")
            for r, t in zip(reqs, result.tokens):
                r.append_token(t, 0.0)
            times.append(result.elapsed)
            step = backend.decode
    finally:
        for r in reqs:
            memory.release(r)
            backend.release(r)
    return times[0], sum(times[1:])
