"""Who holds which slots: each request's KV tokens, each resident LoRA adapter, and the prefix cache."""

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from slora_vtc.memory.pool import CountingPool, TokenPool
from slora_vtc.request import Request

if TYPE_CHECKING:  # the backends lie above; numpy and the radix tree are imported where slot ids are used
    import numpy as np

    from slora_vtc.memory.radix import Node, RadixCache

AdapterHook = Callable[[str, "np.ndarray"], None]


class MemoryManager:
    """S-LoRA's unified memory: KV slots and adapter slots come from the same TokenPool.

    Adapters are loaded when a batch that needs them is admitted and evicted once no running
    request uses them. `adapter_slots` is what one adapter takes: a number, or a function of its
    name (EngineConfig.slots_of: adapters of different ranks and targets differ). A real backend
    passes `on_load` to copy the adapter's weights into its slots.

    With a prefix cache (`cache=True`), a request starts from the longest prefix of its ids the tree
    holds for its adapter (locked while it runs), and the K/V it computes join the tree: its prompt
    right after its prefill, its generated tokens when it leaves (finished or preempted). A slot is
    then either the tree's or the request's own; `release` frees only the request's own. A hit is
    used in whole multiples of `hit_unit` tokens (chunked batching's block: vLLM reuses whole blocks
    only, so that a request's own blocks start at a block's start; 1 in S-LoRA's loop). With
    `vllm_cache` (chunked batching) the cache behaves as vLLM's, which knows every block by its
    tokens: tokens whose ids nobody knows are cached too, as the request's own (`cache_ids`), and
    an allocation evicts only what it needs, from a leaf's end (vLLM frees a request's blocks tail
    first); otherwise whole leaves go, as in SGLang's radix cache.

    On a CountingPool (a simulated backend without the cache: nothing reads slot ids) a request's
    `kv_slots` stay empty and the manager counts the slots it holds; the pool's counts are the same.
    """

    def __init__(
        self,
        pool: TokenPool | CountingPool,
        adapter_slots: int | Callable[[str], int],
        on_load: AdapterHook | None = None,
        cache: bool = False,
        hit_unit: int = 1,
        vllm_cache: bool = False,
    ):
        if not pool.hands_out_ids and (cache or on_load is not None):
            raise ValueError("the prefix cache and adapter loading need slot ids: give the manager a TokenPool")
        self.pool = pool
        self._ids = pool.hands_out_ids
        self._counts: dict[int, int] = {}  # on a CountingPool: the slots each running request holds
        self.slots_of = adapter_slots if callable(adapter_slots) else (lambda _name: adapter_slots)
        self._on_load = on_load
        self.adapters: dict[str, "np.ndarray | int"] = {}  # slot ids (a count on a CountingPool)
        self.cache: "RadixCache | None" = None
        if cache:
            from slora_vtc.memory.radix import RadixCache, id_array, with_own

            unit = hit_unit if vllm_cache else 1  # vLLM's cache knows whole blocks only
            self.cache, self._id_array, self._with_own = RadixCache(pool, vllm_cache, unit), id_array, with_own
        # with a cache: cache_ids of each request asked, until it leaves (and whether its prompt's ids were known)
        self._id_arrays: dict[int, tuple["np.ndarray", bool]] = {}
        self.hit_unit, self.vllm_cache = hit_unit, vllm_cache
        self._own: dict[int, list[int]] = {}  # with a cache: each running request's own slots
        self._node: dict[int, "Node"] = {}  # with a cache: the deepest tree node each running request locks
        self._matched: dict[
            int, tuple
        ] = {}  # rid -> (cached_len, end node, its `grown`, evictions, generated) of a waiting request
        self._spare: dict[int, list[int]] = {}  # chunked batching, with slot ids: slots a request holds unwritten

    @property
    def available(self) -> int:
        """Slots an allocation can get now: free ones, plus cached ones no request holds."""
        return self.pool.num_free + (self.cache.evictable if self.cache else 0)

    def cached_len(self, req: Request) -> int:
        """Tokens of the request's next prefill whose K/V the cache holds (at least one is left to
        compute). Remembered per waiting request until the tree changes: a locality-aware scheduler
        asks for every waiting request in every round."""
        ids = self.cache_ids(req)
        if ids is None:
            return 0
        evictions = self.cache.evictions(req.adapter)
        memo = self._matched.get(req.rid)
        if memo is not None:
            n, end, grown, seen_evictions, generated = memo
            if end.grown == grown and seen_evictions == evictions and generated == req.generated:
                return n
        n, end = self.cache.match(req.adapter, ids, req.prefill_len - 1)
        n -= n % self.hit_unit
        self._matched[req.rid] = (n, end, end.grown, evictions, req.generated)
        return n

    def forget(self, req: Request) -> None:
        """A waiting request left (aborted): drop what was remembered for it."""
        self._matched.pop(req.rid, None)
        self._id_arrays.pop(req.rid, None)

    def shared_tokens(self, req: Request) -> int:
        """Of a running request's slots, those the tree owns (counted in cache.locked, not as its own)."""
        return len(req.kv_slots) - len(self._own[req.rid]) if self.cache else 0

    # -- the engine's calls -----------------------------------------------------------------
    def admit(self, batch: list[Request]) -> None:
        """Lock the batch's cached prefixes, load its adapters, and give each request slots for the
        rest of its prefill. Prefixes are locked first so that allocating cannot evict them."""
        for req in batch:
            self._lock_prefix(req)
        for req in batch:
            self._ensure_adapter(req.adapter)
        for req in batch:
            if self._ids:
                new = self._alloc(req.prefill_len - req.cached_len).tolist()
                req.kv_slots.extend(new)
                if self.cache:
                    self._own[req.rid] = new
            else:
                self._counts[req.rid] = self._alloc(req.prefill_len - req.cached_len)
            if req.generated:
                req.recomputed += max(0, req.prefill_len - 1 - req.cached_len)

    # -- chunked batching: a request's K/V grow by chunks, its slots by whole blocks ------------------
    def start(self, req: Request) -> None:
        """A request scheduled for the first time since it waited (chunked batching): lock its cached
        prefix and load its adapter; it holds none of its own slots yet (`grow` gives them)."""
        self._lock_prefix(req)
        self._ensure_adapter(req.adapter)
        if self._ids:
            self._spare[req.rid] = []
            if self.cache:
                self._own[req.rid] = []
        else:
            self._counts[req.rid] = 0

    def start_cost(self, req: Request) -> int:
        """Slots `start` would take from what is available: cached slots it locks that nobody locks
        yet (they stop being evictable), and its adapter when it is not resident."""
        ids = self.cache_ids(req)
        locking = 0 if ids is None else self.cache.unlocked_len(req.adapter, ids, self.cached_len(req), {})
        adapter = 0 if req.adapter is None or req.adapter in self.adapters else self.slots_of(req.adapter)
        return locking + adapter

    def grow(self, req: Request, tokens: int, slots: int) -> None:
        """`slots` more slots for the request (a whole number of blocks, possibly none), and `tokens`
        more of its slots now hold K/V (its kv_slots, in position order; the rest stay spare)."""
        if not self._ids:
            if slots:
                self._counts[req.rid] += self._alloc(slots)
            return
        spare = self._spare[req.rid]
        if slots:
            spare.extend(self._alloc(slots).tolist())
        written = spare[:tokens]
        del spare[:tokens]
        req.kv_slots.extend(written)
        if self.cache:
            self._own[req.rid].extend(written)

    def grow_all(self, reqs: list[Request], tokens: int, slots: list[int]) -> None:
        """`grow(req, tokens, slots[i])` for each request in order; on a CountingPool one allocation
        takes them all (the same counts: the caller knows they fit, so no single call would fail)."""
        if self._ids:
            for req, n in zip(reqs, slots):
                self.grow(req, tokens, n)
            return
        self.pool.alloc(sum(slots))
        counts = self._counts
        for req, n in zip(reqs, slots):
            if n:
                counts[req.rid] += n

    def cache_prefill(self, batch: Iterable[Request]) -> None:
        """After a prefill: the prompts' K/V join the tree (later requests may share them at once).

        A request whose prefix another request of the same batch has just put in the tree keeps
        its own copy, and joins the tree only when it leaves: locking the tree's copy as well would
        hold that prefix twice after the other request ends, which its admission did not count.
        """
        if not self.cache:
            return
        for req in batch:
            ids = self.cache_ids(req)
            if ids is None:
                continue
            ids = ids[: self._cacheable(req)]
            if self.cache.match_len(req.adapter, ids) <= req.cached_len:
                self._insert(req, ids, keep_lock=True)

    def cache_scheduled(self, req: Request, tokens: int) -> None:
        """Chunked batching with `vllm_cache`: a step was scheduled to compute the request's first
        `tokens` positions; the whole blocks among them join the tree at once, locked by the request,
        as vLLM caches a full block when it allocates it (a request admitted later in the same step
        finds it). Not where the tree holds these tokens beyond what the request shares already:
        another request put them there, and the request keeps its own copy (`cache_prefill`)."""
        if not (self.vllm_cache and self.cache):
            return
        ids, shared = self.cache_ids(req), self.shared_tokens(req)
        n = tokens - tokens % self.hit_unit
        if ids is not None and n > shared and self.cache.match_len(req.adapter, ids[:n]) <= shared:
            self._insert(req, ids[:n], keep_lock=True)

    def extend(self, running: list[Request], steps: int = 1) -> None:
        """One more slot per running request and step, for the tokens the next decode steps write
        (`steps` at once get the slots that as many single calls would)."""
        n = len(running)
        if not self._ids:
            self.pool.alloc(n * steps)
            counts = self._counts
            for req in running:
                counts[req.rid] += steps
            return
        slots = self._alloc(n * steps).tolist()
        for i, req in enumerate(running):
            mine = slots[(steps - 1) * n + i :: -n]  # step 1 took the top of the free stack, as one call would
            req.kv_slots.extend(mine)
            if self.cache:
                self._own[req.rid].extend(mine)

    def release(self, req: Request, keep: bool = True) -> None:
        """Free the request's slots. With a cache and `keep`, the K/V it computed stay cached
        (`keep=False` for a request the model failed on: its K/V may be wrong)."""
        if not self._ids:
            self.pool.free(self._counts.pop(req.rid, 0))
            return
        node = self._node.pop(req.rid, None) if self.cache else None
        if node is not None:
            ids = self.cache_ids(req) if keep else None
            if ids is not None:
                self._insert(req, ids[: self._cacheable(req)], keep_lock=False)
            self.cache.unlock(node)
        own = self._own.pop(req.rid, None) if self.cache else req.kv_slots
        if own:
            self.pool.free(own)
        spare = self._spare.pop(req.rid, None)  # chunked batching: the unwritten rest of its last block
        if spare:
            self.pool.free(spare)
        req.kv_slots = []
        self._id_arrays.pop(req.rid, None)  # a preempted request's are made again when next asked

    def evict_unused(self, running: Iterable[Request]) -> None:
        if not self.adapters:
            return
        in_use = {req.adapter for req in running}
        for name in [a for a in self.adapters if a not in in_use]:
            self.pool.free(self.adapters.pop(name))

    def flush(self) -> None:
        """Empty the prefix cache of everything no request holds."""
        if self.cache:
            self.cache.flush()

    # -- helpers ----------------------------------------------------------------------------
    def cache_ids(self, req: Request) -> "np.ndarray | None":
        """The ids the cache knows the request by (prompt, then generated), as an array; None without
        a cache, and for a prompt given as a length unless `vllm_cache`. Kept until the request grows or
        leaves: converting a long prompt takes time of its length, and every admission attempt and
        look-ahead asks for a waiting request's.

        With `vllm_cache`, tokens whose ids nobody knows (a prompt given as a length, tokens a simulator
        counted without producing them) are the request's own: the id -1 - rid, which no token and no
        other request has. Nobody shares them, but the request finds its own K/V again after a
        preemption, as vLLM's prefix cache (each block known by its tokens) finds a preempted request's."""
        known = req.prompt_ids is not None
        if not self.cache or not (known or self.vllm_cache):
            return None
        length = req.prompt_len + req.generated if self.vllm_cache else len(req.prompt_ids) + len(req.output_ids)
        kept = self._id_arrays.get(req.rid)
        if kept is None or kept[1] != known or len(kept[0]) != length:
            ids = self._id_array((req.token_ids() if req.output_ids else req.prompt_ids) if known else ())
            kept = self._id_arrays[req.rid] = (self._with_own(ids, -1 - req.rid, length), known)
        return kept[0]

    def _lock_prefix(self, req: Request) -> None:
        ids = self.cache_ids(req)
        req.cached_len = 0
        if ids is None:
            return
        hit = self.cached_len(req)
        self._matched.pop(req.rid, None)  # kept for waiting requests only
        node, slots = self.cache.acquire(req.adapter, ids, hit)
        self._node[req.rid] = node
        req.kv_slots = slots.tolist()
        req.cached_len = len(slots)
        req.cached_tokens += len(slots)

    def _cacheable(self, req: Request) -> int:
        """How many of the request's tokens with K/V may join the tree: all of them, or with
        `vllm_cache` those in whole blocks. vLLM knows a block by its tokens only once it is full; a
        partly filled block is never cached, and when its request leaves it is the first reused."""
        n = len(req.kv_slots)
        return n - n % self.hit_unit if self.vllm_cache else n

    def _insert(self, req: Request, ids, keep_lock: bool) -> None:
        """Put the request's tokens in the tree; slots the tree takes stop being the request's own."""
        present = self.cache.insert(req.adapter, ids, req.kv_slots[: len(ids)])
        taken = set(req.kv_slots[present : len(ids)])
        self._own[req.rid] = [s for s in self._own[req.rid] if s not in taken]
        if keep_lock:  # move the lock down to the request's whole prefix
            node, _ = self.cache.acquire(req.adapter, ids)
            self.cache.unlock(self._node[req.rid])
            self._node[req.rid] = node

    def _alloc(self, n: int) -> "np.ndarray | int":
        if self.cache and self.pool.num_free < n:
            self.cache.evict(n - self.pool.num_free)
        return self.pool.alloc(n)

    def _ensure_adapter(self, name: str | None) -> None:
        if name is None or name in self.adapters:
            return
        size = self.slots_of(name)
        if size == 0:
            return
        slots = self._alloc(size)
        self.adapters[name] = slots
        if self._on_load is not None:
            self._on_load(name, slots)
