"""The KV state of recently computed token sequences, so a prompt that starts like one seen before prefills only
the rest (a group's shared head, a conversation's earlier turns).

Sequences are cut into blocks of `BLOCK` tokens kept in a trie keyed by the block's token ids themselves (exact: no
hashes that could collide), so a shared head is stored once however many sequences continue it. A lookup returns
the longest run of cached blocks a sequence starts with. The memory budget evicts the least recently used blocks;
a block is always less recent than its ancestors, so the least recent one is a leaf and eviction never orphans one.
Blocks live in slots of a few large tensors (`_Slots`), and the budget counts each block's bytes plus its node's
(`NODE_BYTES`), so it is what the cache holds: one tensor per block cost a small model's 8 KiB block another 4.5 KiB
of allocator and object overhead, and put 32 MiB of budget at +90 MB of resident memory under load.
Entries are only valid for the weights that computed them: the engine clears the cache whenever those may change.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

BLOCK = 16  # tokens per block: what a lookup can miss at the end of a match, against trie depth and copies
CHUNK_BYTES = 16 * 2**20  # slots are allocated this many bytes at a time, up to the budget
NODE_BYTES = 1536  # what a block's trie node, key and recency entry cost in Python (measured: 1.3 KiB)


@dataclass(eq=False, slots=True)
class _Node:
    slot: int  # where its KV [layers, 2 (keys, values), heads, BLOCK, head_dim] is kept
    parent: _Node | None
    key: tuple[int, ...]
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)


@dataclass
class PrefillTokens:
    """Prompt tokens the engine computed and served from its prefix cache (cumulative); `take_metrics` reports
    the share served from cache since its last call (one training step)."""

    computed: int = 0
    cached: int = 0
    _mark: tuple[int, int] = field(default=(0, 0), repr=False)

    def add(self, computed: int, cached: int) -> None:
        self.computed += computed
        self.cached += cached

    def take_metrics(self) -> dict[str, float]:
        computed, cached = self.computed - self._mark[0], self.cached - self._mark[1]
        self._mark = (self.computed, self.cached)
        return {"prefix_cache_hit_rate": cached / (computed + cached)} if computed + cached else {}


class _Slots:
    """Room for `capacity` blocks of one shape, in tensors of about `CHUNK_BYTES` made as they are needed."""

    def __init__(self, block: Any, capacity: int) -> None:
        self.shape, self.dtype, self.device = tuple(block.shape), block.dtype, block.device
        self.block_bytes = block.numel() * block.element_size()
        self.capacity = capacity
        self.per_chunk = max(1, min(capacity, CHUNK_BYTES // self.block_bytes))
        self.chunks: list[Any] = []
        self.made = 0
        self.free: list[int] = []

    def fits(self, block: Any) -> bool:
        return tuple(block.shape) == self.shape and block.dtype == self.dtype and block.device == self.device

    def put(self, block: Any) -> int:
        """Copy `block` into a free slot (the caller made sure there is one)."""
        import torch

        if not self.free:
            size = min(self.per_chunk, self.capacity - self.made)
            self.chunks.append(torch.empty((size, *self.shape), dtype=self.dtype, device=self.device))
            self.free = list(range(self.made + size - 1, self.made - 1, -1))
            self.made += size
        slot = self.free.pop()
        self.view(slot).copy_(block)
        return slot

    def view(self, slot: int) -> Any:
        chunk, index = divmod(slot, self.per_chunk)
        return self.chunks[chunk][index]


class PrefixCache:
    """KV blocks by token prefix, within `budget_bytes`, least recently used evicted first."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.hits = 0  # lookups that found a cached prefix
        self.misses = 0
        self._root = _Node(-1, None, ())
        self._recency: collections.OrderedDict[int, _Node] = collections.OrderedDict()  # least recent first
        self._slots: _Slots | None = None

    def __len__(self) -> int:
        return len(self._recency)

    @property
    def used_bytes(self) -> int:
        return 0 if self._slots is None else len(self._recency) * (self._slots.block_bytes + NODE_BYTES)

    def clear(self) -> None:
        """Forget every block and free their memory."""
        self._root.children.clear()
        self._recency.clear()
        self._slots = None

    def _path(self, ids: Sequence[int], limit: int) -> list[_Node]:
        """The cached blocks `ids[:limit]` starts with, root side first."""
        path, node = [], self._root
        for start in range(0, limit - limit % BLOCK, BLOCK):
            child = node.children.get(tuple(ids[start : start + BLOCK]))
            if child is None:
                break
            path.append(child)
            node = child
        return path

    def _touch(self, path: list[_Node]) -> None:
        for node in reversed(path):  # leaf first, so every node ends up more recent than its descendants
            self._recency.move_to_end(id(node))

    def match(self, ids: Sequence[int]) -> tuple[int, Any]:
        """The longest cached prefix of `ids` that leaves at least one token to compute (its logits are needed):
        (its length, its KV [layers, 2, heads, length, head_dim] or None when nothing matched)."""
        path = self._path(ids, len(ids) - 1)
        if not path:
            self.misses += 1
            return 0, None
        import torch

        assert self._slots is not None
        self.hits += 1
        self._touch(path)
        return len(path) * BLOCK, torch.cat([self._slots.view(node.slot) for node in path], dim=3)

    def cached_length(self, ids: Sequence[int]) -> int:
        """How much of `ids` a `match` would serve (counts nothing and refreshes nothing)."""
        return len(self._path(ids, len(ids) - 1)) * BLOCK

    def store(self, ids: Sequence[int], kv_of: Callable[[int, int], Any]) -> None:
        """Keep the whole blocks of `ids` not cached yet (as many as the budget holds); `kv_of(start, end)` gives the
        KV of `ids[start:end]` [layers, 2, heads, end - start, head_dim], asked for only when there is something new
        to keep."""
        if self.budget_bytes <= 0:
            return
        path = self._path(ids, len(ids))
        start, end = len(path) * BLOCK, len(ids) - len(ids) % BLOCK
        if start < end:
            kv = kv_of(start, end)
            first = kv[:, :, :, :BLOCK]
            if self._slots is None or not self._slots.fits(first):
                self.clear()
                self._slots = _Slots(first, self.budget_bytes // (first.numel() * first.element_size() + NODE_BYTES))
            room = self._make_room((end - start) // BLOCK, protected=path)
            node = path[-1] if path else self._root
            for offset in range(start, start + room * BLOCK, BLOCK):
                slot = self._slots.put(kv[:, :, :, offset - start : offset - start + BLOCK])
                key = tuple(ids[offset : offset + BLOCK])
                node.children[key] = node = _Node(slot, node, key)
                self._recency[id(node)] = node
                path.append(node)
        self._touch(path)

    def _make_room(self, blocks: int, protected: list[_Node]) -> int:
        """Evict least recently used blocks (never those of `protected`, the path being extended) until `blocks`
        more fit, or as many as can; returns how many fit."""
        assert self._slots is not None
        keep = {id(node) for node in protected}
        for key in list(self._recency):
            if len(self._recency) + blocks <= self._slots.capacity:
                break
            if key in keep:
                continue
            node = self._recency.pop(key)
            assert node.parent is not None and not node.children, "the least recent block must be a leaf"
            del node.parent.children[node.key]
            self._slots.free.append(node.slot)
        return max(0, min(blocks, self._slots.capacity - len(self._recency)))
