"""The prefix cache: a radix tree over token ids whose nodes own K/V slots of the unified pool.

One tree per adapter (a LoRA changes K and V, so a prefix is only shared between requests of the
same adapter). A node's edge is a run of token ids and the pool slots holding their K/V. A running
request locks the path it reads (a reference count on every node of it); unlocked nodes stay
cached and are evicted, least recently used leaf first, when the pool needs room.

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

    __slots__ = ("key", "slots", "children", "parent", "refs", "last_use")

    def __init__(self, key: np.ndarray, slots: np.ndarray, parent: "Node | None"):
        self.key, self.slots, self.parent = key, slots, parent
        self.children: dict[int, Node] = {}
        self.refs = 0
        self.last_use = 0

    def __len__(self) -> int:
        return len(self.key)

    def __lt__(self, other: "Node") -> bool:  # heap ties
        return id(self) < id(other)


def _ids(tokens: Sequence[int]) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int64)


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two id arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class RadixCache:
    def __init__(self, pool: TokenPool):
        self.pool = pool
        self._roots: dict[str | None, Node] = {}
        self._clock = count(1)  # an access counter, not time: LRU only needs an order
        self.size = 0  # slots the tree holds
        self.locked = 0  # slots on paths some request holds, each counted once
        self._candidates: dict[int, Node] = {}  # leaves that may be evictable (checked again when used)

    @property
    def evictable(self) -> int:
        return self.size - self.locked

    # -- reading ----------------------------------------------------------------------------
    def match_len(self, adapter: str | None, tokens: Sequence[int], limit: int | None = None) -> int:
        """Tokens of `tokens` (at most `limit`) whose K/V the tree holds for this adapter."""
        return sum(take for _, take in self._walk(adapter, _ids(tokens)[:limit]))

    def unlocked_len(self, adapter: str | None, tokens: Sequence[int], limit: int | None, seen: dict[int, int]) -> int:
        """Of the matched prefix, the slots no request locks yet and not already counted in `seen`
        (node id -> tokens of it counted; updated): what locking this prefix would newly reserve."""
        fresh = 0
        for node, take in self._walk(adapter, _ids(tokens)[:limit]):
            if node.refs == 0 and take > seen.get(id(node), 0):
                fresh += take - seen.get(id(node), 0)
                seen[id(node)] = take
        return fresh

    def _walk(self, adapter: str | None, ids: np.ndarray):
        """(node, tokens of it matched) along the longest cached prefix of ids."""
        node, pos = self._roots.get(adapter), 0
        while node is not None and pos < len(ids):
            child = node.children.get(int(ids[pos]))
            if child is None:
                return
            take = _common(child.key, ids[pos:])
            yield child, take
            if take < len(child):
                return
            node, pos = child, pos + take

    # -- locking ----------------------------------------------------------------------------
    def acquire(self, adapter: str | None, tokens: Sequence[int], limit: int | None = None) -> tuple[Node, np.ndarray]:
        """Lock the longest cached prefix (at most `limit` tokens): its deepest node and its slots."""
        ids = _ids(tokens)[:limit]
        node, pos, parts = self._root(adapter), 0, []
        while pos < len(ids) and (child := node.children.get(int(ids[pos]))) is not None:
            take = _common(child.key, ids[pos:])
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
        ids, slots = _ids(tokens), np.asarray(slots, dtype=np.int64)
        node, pos = self._root(adapter), 0
        tick = next(self._clock)
        while pos < len(ids) and (child := node.children.get(int(ids[pos]))) is not None:
            take = _common(child.key, ids[pos:])
            if take < len(child):
                child = self._split(child, take)
            child.last_use = tick
            node, pos = child, pos + take
        if pos < len(ids):
            leaf = Node(ids[pos:].copy(), slots[pos:].copy(), node)
            leaf.last_use = tick
            node.children[int(ids[pos])] = leaf
            self.size += len(leaf)
            self._candidates[id(leaf)] = leaf
        return pos

    def _split(self, node: Node, at: int) -> Node:
        """Cut node's edge after `at` tokens; the new upper node is returned, `node` keeps the tail
        (so a request's handle on a deep node stays valid)."""
        upper = Node(node.key[:at], node.slots[:at], node.parent)
        upper.refs, upper.last_use = node.refs, node.last_use
        upper.children[int(node.key[at])] = node
        node.parent.children[int(node.key[0])] = upper
        node.key, node.slots, node.parent = node.key[at:], node.slots[at:], upper
        return upper

    def _root(self, adapter: str | None) -> Node:
        if adapter not in self._roots:
            self._roots[adapter] = Node(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), None)
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
        return node.refs == 0 and not node.children and node.parent is not None and node.parent.children.get(int(node.key[0])) is node

    def _remove(self, node: Node) -> int:
        del node.parent.children[int(node.key[0])]
        self.pool.free(node.slots)
        self.size -= len(node)
        return len(node)
