"""The prefix cache: a radix tree over token ids (or whole blocks of them: `unit`) whose nodes own
K/V slots of the unified pool.

One tree per adapter (a LoRA changes K and V, so a prefix is only shared between requests of the
same adapter). A node's edge is a run of token ids and the pool slots holding their K/V. A running
request locks the path it reads (a reference count on every node of it); unlocked nodes stay
cached and are evicted, least recently used leaf first, when the pool needs room: a whole leaf at a
time (SGLang's radix cache), or with `trim_leaves` only what is needed, from the leaf's end (vLLM,
which frees a request's blocks tail first and evicts block by block).

`locked` counts every slot on a locked path once, however many requests share it; the admission
check reserves exactly that, and treats the rest of the tree (`evictable`) as free.
"""

import heapq
from collections.abc import Sequence
from itertools import count

import numpy as np

from slora_vtc.memory.pool import TokenPool


class Node:
    """A run of tokens (`key`) and their slots; `refs` requests read through it."""

    __slots__ = ("key", "slots", "children", "parent", "refs", "last_use", "adapter", "grown", "serial", "_raw")

    def __init__(self, key: np.ndarray, slots: np.ndarray, parent: "Node | None", adapter: str | None = None):
        self.key, self.slots, self.parent = key, slots, parent
        self.adapter = parent.adapter if parent is not None else adapter
        self.grown = 0  # bumped when the node gains a child or its edge is cut: a match ending at it may grow
        self.serial = 0  # creation order, set by the tree: breaks LRU ties the same way on every run
        self._raw: bytes | None = None
        self.children: dict[int, Node] = {}
        self.refs = 0
        self.last_use = 0

    def __len__(self) -> int:
        return len(self.key)

    @property
    def raw(self) -> bytes:
        """The key's bytes: a whole edge matches with one bytes.startswith, the common case."""
        if self._raw is None:
            self._raw = self.key.tobytes()
        return self._raw

    def cut(self, at: int) -> None:
        """Keep the edge from `at` on (the first `at` tokens went to a new parent)."""
        self.key, self.slots, self._raw = self.key[at:], self.slots[at:], None
        self.grown += 1

    def __lt__(self, other: "Node") -> bool:  # LRU ties: the older node first
        return self.serial < other.serial


def id_array(tokens: Sequence[int]) -> np.ndarray:
    """Token ids as the tree keeps them (no copy when they are already)."""
    return np.asarray(tokens, dtype=np.int64)


def with_own(ids: np.ndarray, owner: int, length: int) -> np.ndarray:
    """`ids`, then `owner`'s own id up to `length` ids (no copy when there is none to add)."""
    if len(ids) >= length:
        return ids
    return np.concatenate([ids, np.full(length - len(ids), owner, dtype=np.int64)])


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two id arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class RadixCache:
    """`trim_leaves`: evict from a leaf's end only what is needed (vLLM frees a request's blocks tail
    first and evicts block by block); without it a leaf goes whole (SGLang's radix cache). `unit`:
    the tree's grain, in tokens. With a unit of a block (vLLM, which knows a block by all its tokens
    and those before) an edge is a run of whole blocks, a node's children are told apart by their
    first block, a match counts whole blocks, and eviction frees whole blocks: two requests whose
    prompts differ inside a block share nothing of it. Only whole blocks are then inserted."""

    def __init__(self, pool: TokenPool, trim_leaves: bool = False, unit: int = 1):
        self.pool, self.trim_leaves, self.unit = pool, trim_leaves, unit
        self._roots: dict[str | None, Node] = {}
        self._clock = count(1)  # an access counter, not time: LRU only needs an order
        self._serials = count(1)
        self.size = 0  # slots the tree holds
        self.locked = 0  # slots on paths some request holds, each counted once
        self._evictions: dict[str | None, int] = {}  # per adapter: a match may shrink only after one
        self._candidates: dict[int, Node] = {}  # leaves that may be evictable (checked again when used)

    def evictions(self, adapter: str | None) -> int:
        return self._evictions.get(adapter, 0)

    @property
    def evictable(self) -> int:
        return self.size - self.locked

    # -- reading ----------------------------------------------------------------------------
    def match_len(self, adapter: str | None, tokens: Sequence[int], limit: int | None = None) -> int:
        """Tokens of `tokens` (at most `limit`) whose K/V the tree holds for this adapter."""
        return self.match(adapter, tokens, limit)[0]

    def match(self, adapter: str | None, tokens: Sequence[int], limit: int | None = None) -> tuple[int, Node]:
        """match_len, and the node where the match stopped: until that node grows (`grown`) or
        the adapter's tree loses a node (`evictions`), the same tokens match the same length."""
        total, end = 0, self._root(adapter)
        for node, take in self._walk(adapter, id_array(tokens)[:limit]):
            total += take
            end = node
        return total, end

    def unlocked_len(self, adapter: str | None, tokens: Sequence[int], limit: int | None, seen: dict[int, int]) -> int:
        """Of the matched prefix, the slots no request locks yet and not already counted in `seen`
        (node id -> tokens of it counted; updated): what locking this prefix would newly reserve."""
        fresh = 0
        for node, take in self._walk(adapter, id_array(tokens)[:limit]):
            if node.refs == 0 and take > seen.get(id(node), 0):
                fresh += take - seen.get(id(node), 0)
                seen[id(node)] = take
        return fresh

    def _walk(self, adapter: str | None, ids: np.ndarray):
        """(node, tokens of it matched) along the longest cached prefix of ids."""
        node, pos, raw = self._roots.get(adapter), 0, ids.tobytes()
        while node is not None and pos < len(ids):
            child = node.children.get(self._key(ids, pos))
            if child is None:
                return
            take = self._matched(child, ids, raw, pos)
            yield child, take
            if take < len(child):
                return
            node, pos = child, pos + take

    # -- locking ----------------------------------------------------------------------------
    def acquire(self, adapter: str | None, tokens: Sequence[int], limit: int | None = None) -> tuple[Node, np.ndarray]:
        """Lock the longest cached prefix (at most `limit` tokens): its deepest node and its slots."""
        ids = id_array(tokens)[:limit]
        node, pos, parts, raw = self._root(adapter), 0, [], ids.tobytes()
        while pos < len(ids) and (child := node.children.get(self._key(ids, pos))) is not None:
            take = self._matched(child, ids, raw, pos)
            if take < len(child):
                child = self._split(child, take)
            parts.append(child.slots)
            node, pos = child, pos + take
        self.lock(node)
        return node, np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def lock(self, node: Node) -> None:
        tick = next(self._clock)
        while node.parent is not None:
            if node.refs == 0:
                self.locked += len(node)
            node.refs += 1
            node.last_use = tick
            node = node.parent

    def unlock(self, node: Node) -> None:
        tick = next(self._clock)
        while node.parent is not None:
            node.refs -= 1
            if node.refs == 0:
                self.locked -= len(node)
                if not node.children:
                    self._candidates[id(node)] = node
            node.last_use = tick
            node = node.parent

    # -- writing ----------------------------------------------------------------------------
    def insert(self, adapter: str | None, tokens: Sequence[int], slots: Sequence[int]) -> int:
        """Cache tokens whose K/V are in `slots`. The tree keeps what it already held and takes
        slots[present:] for the rest; returns `present` (the caller still owns slots[:present]
        that are not the tree's own)."""
        ids, slots = id_array(tokens), np.asarray(slots, dtype=np.int64)
        node, pos, raw = self._root(adapter), 0, ids.tobytes()
        tick = next(self._clock)
        while pos < len(ids) and (child := node.children.get(self._key(ids, pos))) is not None:
            take = self._matched(child, ids, raw, pos)
            if take < len(child):
                child = self._split(child, take)
            child.last_use = tick
            node, pos = child, pos + take
        if pos < len(ids):
            leaf = Node(ids[pos:].copy(), slots[pos:].copy(), node)
            leaf.serial = next(self._serials)
            leaf.last_use = tick
            node.children[self._key(ids, pos)] = leaf
            node.grown += 1
            self.size += len(leaf)
            self._candidates[id(leaf)] = leaf
        return pos

    def _split(self, node: Node, at: int) -> Node:
        """Cut node's edge after `at` tokens; the new upper node is returned, `node` keeps the tail
        (so a request's handle on a deep node stays valid)."""
        upper = Node(node.key[:at], node.slots[:at], node.parent)
        upper.serial = next(self._serials)
        upper.refs, upper.last_use = node.refs, node.last_use
        upper.children[self._key(node.key, at)] = node
        node.parent.children[self._key(node.key, 0)] = upper
        node.cut(at)
        node.parent = upper
        return upper

    def _root(self, adapter: str | None) -> Node:
        if adapter not in self._roots:
            self._roots[adapter] = Node(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), None, adapter)
        return self._roots[adapter]

    # -- eviction ---------------------------------------------------------------------------
    def evict(self, need: int) -> int:
        """Free at least `need` slots (fewer if not that many are evictable); returns how many."""
        heap = [(n.last_use, n) for n in self._candidates.values() if self._is_evictable(n)]
        heapq.heapify(heap)
        self._candidates.clear()
        freed = 0
        while heap and freed < need:
            _, node = heapq.heappop(heap)
            if not self._is_evictable(node):
                continue
            rest = -(-(need - freed) // self.unit) * self.unit  # in whole units
            if self.trim_leaves and len(node) > rest:
                freed += self._trim(node, rest)
                heap.append((node.last_use, node))  # still a leaf, what is left of it
                break
            freed += self._remove(node)
            parent = node.parent
            if parent.parent is not None and self._is_evictable(parent):
                heapq.heappush(heap, (parent.last_use, parent))
        self._candidates.update((id(n), n) for _, n in heap)
        return freed

    def flush(self) -> int:
        """Evict everything no request holds."""
        return self.evict(self.evictable)

    def _is_evictable(self, node: Node) -> bool:
        return (
            node.refs == 0
            and not node.children
            and node.parent is not None
            and node.parent.children.get(self._key(node.key, 0)) is node
        )

    def _key(self, ids: np.ndarray, pos: int):
        """What tells a node's children apart: the first token of an edge, or its first unit's tokens."""
        return int(ids[pos]) if self.unit == 1 else ids[pos : pos + self.unit].tobytes()

    def _matched(self, node: Node, ids: np.ndarray, raw: bytes, pos: int) -> int:
        """Tokens of node's edge that ids[pos:] starts with, in whole units."""
        if raw.startswith(node.raw, pos * ids.itemsize):
            return len(node)
        common = _common(node.key, ids[pos:])
        return common - common % self.unit

    def _trim(self, node: Node, n: int) -> int:
        """Evict the last n tokens of a leaf's edge."""
        evicted = node.slots[-n:]
        node.key, node.slots, node._raw = node.key[:-n], node.slots[:-n], None
        return self._evicted(node.adapter, evicted)

    def _remove(self, node: Node) -> int:
        del node.parent.children[self._key(node.key, 0)]
        return self._evicted(node.adapter, node.slots)

    def _evicted(self, adapter: str | None, slots: np.ndarray) -> int:
        """Slots the tree gave up: back to the pool, counted as an eviction of the adapter's tree."""
        self.pool.free(slots)
        self.size -= len(slots)
        self._evictions[adapter] = self._evictions.get(adapter, 0) + 1
        return len(slots)
