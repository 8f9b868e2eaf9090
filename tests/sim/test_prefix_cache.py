"""The prefix cache: the radix tree against a brute-force model, the pool never leaking, and the
admission check counting cached tokens once."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slora_vtc.backends.sim import sim_backend
from slora_vtc.builder import build_engine
from slora_vtc.clock import VirtualClock
from slora_vtc.config import EngineConfig
from slora_vtc.experiment import Experiment
from slora_vtc.memory import Budget, MemoryManager, TokenPool
from slora_vtc.memory.radix import RadixCache
from slora_vtc.request import Request, State
from slora_vtc.runner import run_experiment
from slora_vtc.sched import build_scheduler

ADAPTERS = (None, "a")


def tree_entries(cache: RadixCache) -> dict[tuple, int]:
    """Every cached prefix of every adapter -> the slot of its last token, read from the tree."""
    out = {}

    def walk(adapter, node, prefix):
        for child in node.children.values():
            path = prefix
            for token, slot in zip(child.key.tolist(), child.slots.tolist()):
                path = path + (token,)
                out[(adapter, path)] = slot
            walk(adapter, child, path)

    for adapter, root in cache._roots.items():
        walk(adapter, root, ())
    return out


def brute_match(model: dict, adapter, seq: tuple, limit: int) -> int:
    k = 0
    while k < min(len(seq), limit) and (adapter, seq[: k + 1]) in model:
        k += 1
    return k


def programs(seqs) -> st.SearchStrategy:
    """Runs of operations on a tree: inserts and locks of `seqs`, unlocks, evictions."""
    return st.lists(
        st.one_of(
            st.tuples(st.just("insert"), st.sampled_from(ADAPTERS), seqs),
            st.tuples(st.just("acquire"), st.sampled_from(ADAPTERS), seqs, st.integers(0, 8)),
            st.tuples(st.just("unlock"), st.integers(0, 20)),
            st.tuples(st.just("evict"), st.integers(0, 12)),
        ),
        max_size=40,
    )


seqs = st.lists(st.integers(0, 2), min_size=1, max_size=8).map(tuple)
ops = programs(seqs)


@pytest.mark.parametrize("trim_leaves", [False, True])
@settings(max_examples=300, deadline=None)
@given(program=ops)
def test_radix_tree_matches_a_brute_force_model(trim_leaves, program):
    pool = TokenPool(400)
    cache = RadixCache(pool, trim_leaves=trim_leaves)
    model: dict[tuple, int] = {}  # (adapter, prefix) -> slot of its last token
    locks = []  # (node handle, adapter, matched prefix)
    for op in program:
        if op[0] == "insert":
            _, adapter, seq = op
            slots = pool.alloc(len(seq))
            present = cache.insert(adapter, seq, slots)
            assert present == brute_match(model, adapter, seq, len(seq))
            pool.free(slots[:present])  # the caller keeps what the tree did not take
            for j in range(present, len(seq)):
                model[(adapter, seq[: j + 1])] = int(slots[j])
        elif op[0] == "acquire":
            _, adapter, seq, limit = op
            node, slots = cache.acquire(adapter, seq, limit)
            k = brute_match(model, adapter, seq, limit)
            assert slots.tolist() == [model[(adapter, seq[: j + 1])] for j in range(k)]
            assert cache.match_len(adapter, seq, limit) == k
            locks.append((node, adapter, seq[:k]))
        elif op[0] == "unlock" and locks:
            node, *_ = locks.pop(op[1] % len(locks))
            cache.unlock(node)
        elif op[0] == "evict":
            before = cache.evictable
            freed = cache.evict(op[1])
            assert freed >= min(op[1], before)
            assert freed == min(op[1], before) or not trim_leaves  # trimmed: exactly what was asked
            remaining = tree_entries(cache)
            locked = {(a, p[: j + 1]) for _, a, p in locks for j in range(len(p))}
            assert locked <= set(remaining), "a locked prefix was evicted"
            assert all(remaining[k] == model[k] for k in remaining)
            model = remaining
        entries = tree_entries(cache)
        assert entries == model
        assert all((a, p[:-1]) in model for a, p in model if len(p) > 1), "the cache is prefix-closed"
        locked = {(a, p[: j + 1]) for _, a, p in locks for j in range(len(p))}
        assert cache.size == len(model) == pool.num_used
        assert cache.locked == len(locked)
    for node, *_ in locks:
        cache.unlock(node)
    cache.flush()
    assert cache.size == cache.locked == pool.num_used == 0


def block_entries(cache: RadixCache) -> dict[tuple, tuple]:
    """A tree of whole blocks: every cached run of blocks of every adapter -> its last block's slots."""
    out, u = {}, cache.unit

    def walk(adapter, node, prefix):
        for child in node.children.values():
            path, keys, slots = prefix, child.key.tolist(), child.slots.tolist()
            for b in range(0, len(keys), u):
                path = path + (tuple(keys[b : b + u]),)
                out[(adapter, path)] = tuple(slots[b : b + u])
            walk(adapter, child, path)

    for adapter, root in cache._roots.items():
        walk(adapter, root, ())
    return out


def blocks_of(seq: tuple, u: int) -> tuple:
    return tuple(seq[b : b + u] for b in range(0, len(seq) - len(seq) % u, u))


UNIT = 2
block_ops = programs(
    st.lists(st.integers(0, 1), min_size=UNIT, max_size=4 * UNIT).map(lambda s: tuple(s[: len(s) // UNIT * UNIT]))
)


@settings(max_examples=300, deadline=None)
@given(program=block_ops)
def test_a_tree_of_whole_blocks_matches_a_brute_force_model(program):
    """vLLM's cache (unit = a block): a block is known by its tokens and all before it, so two runs
    that differ anywhere inside a block share nothing of it; matches and evictions are whole blocks."""
    pool = TokenPool(400)
    cache = RadixCache(pool, trim_leaves=True, unit=UNIT)
    model: dict[tuple, tuple] = {}  # (adapter, run of blocks) -> its last block's slots
    locks = []

    def brute(adapter, seq, limit):
        blocks, k = blocks_of(seq, UNIT), 0
        while k < len(blocks) and (k + 1) * UNIT <= limit and (adapter, blocks[: k + 1]) in model:
            k += 1
        return k

    for op in program:
        if op[0] == "insert":
            _, adapter, seq = op
            slots = pool.alloc(len(seq))
            present = cache.insert(adapter, seq, slots)
            k = brute(adapter, seq, len(seq))
            assert present == k * UNIT
            pool.free(slots[:present])
            for b in range(k, len(seq) // UNIT):
                model[(adapter, blocks_of(seq, UNIT)[: b + 1])] = tuple(slots[b * UNIT : (b + 1) * UNIT].tolist())
        elif op[0] == "acquire":
            _, adapter, seq, limit = op
            node, slots = cache.acquire(adapter, seq, limit)
            k = brute(adapter, seq, limit)
            assert slots.tolist() == [s for b in range(k) for s in model[(adapter, blocks_of(seq, UNIT)[: b + 1])]]
            assert cache.match_len(adapter, seq, limit) == k * UNIT
            locks.append((node, adapter, blocks_of(seq, UNIT)[:k]))
        elif op[0] == "unlock" and locks:
            node, *_ = locks.pop(op[1] % len(locks))
            cache.unlock(node)
        elif op[0] == "evict":
            before = cache.evictable
            freed = cache.evict(op[1])
            assert freed == min(-(-op[1] // UNIT) * UNIT, before)  # whole blocks, only as many as asked
            remaining = block_entries(cache)
            locked = {(a, p[: j + 1]) for _, a, p in locks for j in range(len(p))}
            assert locked <= set(remaining), "a locked block was evicted"
            assert all(remaining[k] == model[k] for k in remaining)
            model = remaining
        assert block_entries(cache) == model
        assert all((a, p[:-1]) in model for a, p in model if len(p) > 1), "the cache is prefix-closed"
        locked = {(a, p[: j + 1]) for _, a, p in locks for j in range(len(p))}
        assert cache.size == UNIT * len(model) == pool.num_used
        assert cache.locked == UNIT * len(locked)
    for node, *_ in locks:
        cache.unlock(node)
    cache.flush()
    assert cache.size == cache.locked == pool.num_used == 0


def test_eviction_takes_the_least_recently_used_leaf_first():
    pool = TokenPool(100)
    cache = RadixCache(pool)
    for seq in ((1, 1, 1), (2, 2, 2), (3, 3, 3)):
        cache.insert(None, seq, pool.alloc(3))
    node, _ = cache.acquire(None, (1, 1, 1))  # touch the oldest: (2, 2, 2) is now the least recent
    cache.unlock(node)
    assert cache.evict(1) == 3
    assert cache.match_len(None, (2, 2, 2)) == 0
    assert cache.match_len(None, (1, 1, 1)) == 3 and cache.match_len(None, (3, 3, 3)) == 3


def test_a_trimmed_leaf_loses_only_its_last_tokens():
    """vLLM frees a request's blocks tail first and evicts only what an allocation needs: the same
    three leaves as above, 4 tokens asked for: the least recent leaf (2, 2, 2) goes whole (3), then
    1 token from the end of the next least recent, (3, 3, 3)."""
    pool = TokenPool(100)
    cache = RadixCache(pool, trim_leaves=True)
    for seq in ((1, 1, 1), (2, 2, 2), (3, 3, 3)):
        cache.insert(None, seq, pool.alloc(3))
    node, _ = cache.acquire(None, (1, 1, 1))
    cache.unlock(node)
    assert cache.evict(4) == 4 and pool.num_used == 5
    assert [cache.match_len(None, seq) for seq in ((1, 1, 1), (2, 2, 2), (3, 3, 3))] == [3, 0, 2]


def test_a_prefix_is_shared_only_within_one_adapter():
    pool = TokenPool(100)
    cache = RadixCache(pool)
    cache.insert("a", (5, 6, 7), pool.alloc(3))
    assert cache.match_len("a", (5, 6, 7, 8)) == 3
    assert cache.match_len("b", (5, 6, 7, 8)) == 0
    assert cache.match_len(None, (5, 6, 7, 8)) == 0


# -- the admission check --------------------------------------------------------------------
def _with_ids(client, ids, max_new, rid, arrival=0.0):
    return Request(client, len(ids), max_new, arrival, rid=rid, adapter=None, prompt_ids=list(ids))


def _admitted_with_cache(pool_tokens: int, cache: bool) -> bool:
    """A (600-token prompt P, 100 new tokens) runs and has generated 1 token; can B (P[:550] + 50
    new tokens, 100 new) join? Worked by hand: with the cache, A's prompt is the tree's (600 slots
    reserved once), A holds 1 token of its own, B would hold 51; both have 99 tokens to go, so the
    worst moment needs 99 * 2 + 52 = 250 < pool - 600: B fits iff pool > 850. Without the cache
    both hold 601: 99 * 2 + 1202 = 1400 < pool."""
    config = EngineConfig(pool_tokens=pool_tokens, lora_rank=0, prefix_cache=cache)
    memory = MemoryManager(TokenPool(pool_tokens), 0, cache=cache)
    p = list(range(10, 610))
    a = _with_ids("x", p, 100, 0)
    memory.admit([a])
    memory.cache_prefill([a])
    a.append_token(None, 0.0)
    b = _with_ids("y", p[:550] + list(range(1000, 1050)), 100, 1)
    budget = Budget(config, [a], memory)
    assert budget.cached_len(b) == (550 if cache else 0)
    return budget.try_add(b)


def test_admission_counts_cached_tokens_once_as_the_trees():
    assert _admitted_with_cache(851, cache=True)
    assert not _admitted_with_cache(850, cache=True)
    assert not _admitted_with_cache(1400, cache=False)
    assert _admitted_with_cache(1401, cache=False)


def test_an_admitted_request_reuses_the_cached_slots():
    memory = MemoryManager(TokenPool(2000), 0, cache=True)
    p = list(range(10, 610))
    a, b = _with_ids("x", p, 10, 0), _with_ids("y", p[:550] + [7] * 50, 10, 1)
    memory.admit([a])
    memory.cache_prefill([a])
    memory.admit([b])
    assert b.cached_len == 550 and b.kv_slots[:550] == a.kv_slots[:550]
    assert len(b.kv_slots) == 600 and not set(b.kv_slots[550:]) & set(a.kv_slots)
    # A request that is exactly a cached prompt still computes its last token (its logits).
    c = _with_ids("z", p, 10, 2)
    memory.admit([c])
    assert c.cached_len == 599


def test_a_prompt_given_as_a_length_finds_only_its_own_kv_again():
    """vLLM knows every block by its tokens, so a preempted request's blocks are found again even when
    nobody shares its prompt. Worked by hand: blocks of 16; a 100-token prompt without ids, then 29
    decodes, leaves K/V at 129 positions (its newest token's is not computed); back from the
    preemption its prefill covers 130 tokens, of which the cache holds 129, used in whole blocks: 128.
    Another 100-token prompt without ids shares none of them."""
    memory = MemoryManager(TokenPool(1000), 0, cache=True, hit_unit=16, vllm_cache=True)
    a, b = Request("x", 100, 50, 0.0, rid=0), Request("y", 100, 50, 0.0, rid=1)
    memory.start(a)
    memory.grow(a, 100, 112)
    memory.cache_prefill([a])
    a.append_token(None, 0.0)
    memory.grow(a, 29, 32)
    a.generated += 29
    memory.release(a)  # preempted: its K/V stay cached, no request holds them
    assert memory.available == 1000
    assert memory.cached_len(a) == 128
    assert memory.cached_len(b) == 0


# -- whole runs -----------------------------------------------------------------------------
def _prefix_workload(seed: int, n: int, docs: int, doc_len: int, max_new: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    texts = [rng.integers(3, 50, doc_len) for _ in range(docs)]
    out = []
    for i in range(n):
        doc = texts[int(rng.integers(docs))][: int(rng.integers(1, doc_len + 1))]
        ids = np.concatenate([[1], doc, rng.integers(3, 50, int(rng.integers(1, 40)))])
        client = f"c{i % 3}"
        out.append(
            Request(
                client,
                len(ids),
                int(rng.integers(1, max_new + 1)),
                float(rng.uniform(0, 20)),
                rid=i,
                adapter=client if seed % 2 else None,
                prompt_ids=ids,
            )
        )
    return out


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 10_000),
    st.sampled_from(["fcfs", "vtc"]),
    st.sampled_from(["conservative", "optimistic"]),
    st.integers(1200, 4000),
)
def test_the_pool_never_leaks_and_every_request_ends_once(seed, scheduler, admission, pool):
    requests = _prefix_workload(seed, 40, 3, 300, 200)
    ended = []
    config = EngineConfig(pool_tokens=pool, prefix_cache=True, admission=admission)
    engine = build_engine(
        config, build_scheduler(scheduler, ["c0", "c1", "c2"]), sim_backend(), VirtualClock(), on_end=ended.append
    )

    def check():
        memory = engine.memory
        own = sum(len(memory._own[r.rid]) for r in engine.running)
        adapters = sum(len(s) for s in memory.adapters.values())
        assert memory.pool.num_used == memory.cache.size + own + adapters

    engine.run(requests, on_step=check)
    assert sorted(r.rid for r in ended) == sorted(r.rid for r in requests)
    assert all(r.state is State.FINISHED and r.generated == r.max_new_tokens for r in requests)
    assert not engine.running and engine.memory.cache.locked == 0
    engine.memory.flush()
    assert engine.memory.pool.num_used == 0 and engine.memory.cache.size == 0


def test_the_cache_shortens_a_run_of_shared_documents():
    def total(cache: bool) -> tuple[float, int]:
        requests = _prefix_workload(3, 60, 2, 1500, 20)
        engine = build_engine(
            EngineConfig(pool_tokens=10_000, prefix_cache=cache),
            build_scheduler("fcfs", []),
            sim_backend(),
            VirtualClock(),
        )
        engine.run(requests)
        return engine.clock.now(), sum(r.cached_tokens for r in requests)

    (cold, none), (warm, hits) = total(False), total(True)
    assert none == 0 and hits > 0 and warm < cold


def test_prefix_cache_on_changes_nothing_for_prompts_without_ids():
    def responses(cache: bool):
        return run_experiment(
            Experiment.of(suite="overload", scheduler="vtc", duration=60, prefix_cache=cache)
        ).responses

    assert responses(True) == responses(False)


# -- the simulator's price of a cached prefix ---------------------------------------------------
def test_a_cached_prefix_costs_its_attention_only():
    from slora_vtc.backends.sim import A10G_STEP_MODEL, SimBackend

    backend = SimBackend(A10G_STEP_MODEL)
    cold = Request("c", 2000, 10, 0.0)
    warm = Request("c", 2000, 10, 0.0, cached_len=1900)
    a, b, c = A10G_STEP_MODEL.prefill_coef
    g = (
        A10G_STEP_MODEL.decode_coef[2] / 128
    )  # with no prefix-hit points: decode's per-context-token cost per 128-query tile
    assert backend.prefill([cold]).elapsed == pytest.approx(a + b + c * 2000)
    assert backend.prefill([warm]).elapsed == pytest.approx(a + b + c * 100 + g * 100 * 1900)


def test_prefix_hit_points_fit_the_cached_attention_term():
    from slora_vtc.backends.sim import A10G_STEP_MODEL
    from slora_vtc.profile import PrefixHitPoint

    a, b, c = A10G_STEP_MODEL.prefill_coef
    true_g = 3e-8
    hits = [
        PrefixHitPoint(n, cached, extend, (a + b * n + c * n * extend + true_g * n * extend * cached) / n)
        for n, cached, extend in [(1, 256, 32), (4, 1024, 32), (2, 1024, 128), (8, 256, 128)]
    ]
    assert A10G_STEP_MODEL.with_prefix_hits(hits).cached_pair_s == pytest.approx(true_g, rel=1e-9)
    assert A10G_STEP_MODEL.with_prefix_hits([]).cached_pair_s == A10G_STEP_MODEL.decode_coef[2] / 128


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["insert", "evict", "ask"]), seqs, st.integers(0, 6)), max_size=40))
def test_a_remembered_match_is_what_matching_again_gives(program):
    """cached_len remembers a waiting request's match until its end node grows or its tree loses a node."""
    memory = MemoryManager(TokenPool(400), 0, cache=True)
    cache = memory.cache
    waiting = [
        _with_ids("w", list(s), 1, rid)
        for rid, s in enumerate([(0, 1, 2, 0), (0, 1, 1), (2, 2, 2, 2, 1), (1,), (0, 0, 0, 1, 2)])
    ]
    for op, seq, k in program:
        if op == "insert":
            slots = memory.pool.alloc(len(seq))
            present = cache.insert(None, seq, slots)
            memory.pool.free(slots[:present])
        elif op == "evict":
            cache.evict(k)
        for req in waiting:
            assert memory.cached_len(req) == cache.match_len(None, req.prompt_ids, req.prefill_len - 1)


def test_a_prefix_computed_twice_in_one_batch_is_not_held_twice():
    """Two requests of one prefill batch share an uncached 100-token prefix D, so both compute it.
    The admission check saw two requests of 101 tokens each, and their worst moment is
    max(249 + 102, 1 * 2 + 204) = 351 < 400 (by hand). The first request puts D in the tree. If
    the second also locked the tree's D while keeping its own copy, D would stay held twice after
    the first finished: 101 + 100 + 249 = 450 > 400, and the pool would run out."""
    d = list(range(1000, 1100))
    r1, r2 = _with_ids("a", d + [1], 2, -1), _with_ids("a", d + [2], 250, -1)
    engine = build_engine(
        EngineConfig(pool_tokens=400, lora_rank=0, prefix_cache=True),
        build_scheduler("fcfs", []),
        sim_backend(),
        VirtualClock(),
    )
    engine.run([r1, r2])
    assert r1.state is State.FINISHED and r2.state is State.FINISHED and r2.generated == 250
    engine.memory.flush()
    assert engine.memory.pool.num_used == 0
