"""The KV state of recently computed token sequences, so a prompt that starts like one seen before prefills only
the rest (a group's shared head, a conversation's earlier turns).

Sequences are cut into blocks of `BLOCK` tokens kept in a trie keyed by the block's token ids themselves (exact: no
hashes that could collide), so a shared head is stored once however many sequences continue it. A lookup returns
the longest run of cached blocks a sequence starts with. The memory budget evicts the least recently used blocks;
a block is always less recent than its ancestors, so the least recent one is a leaf and eviction never orphans one.
Entries are only valid for the weights that computed them: the engine clears the cache whenever those may change.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

BLOCK = 16  # tokens per block: what a lookup can miss at the end of a match, against trie depth and copies


@dataclass(eq=False)
class _Node:
    kv: Any  # [layers, 2 (keys, values), heads, BLOCK, head_dim]
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


class PrefixCache:
    """KV blocks by token prefix, within `budget_bytes`, least recently used evicted first."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.used_bytes = 0
        self.hits = 0  # lookups that found a cached prefix
        self.misses = 0
        self._root = _Node(None, None, ())
        self._recency: collections.OrderedDict[int, _Node] = collections.OrderedDict()  # least recent first

    def __len__(self) -> int:
        return len(self._recency)

    def clear(self) -> None:
        self._root.children.clear()
        self._recency.clear()
        self.used_bytes = 0

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

        self.hits += 1
        self._touch(path)
        return len(path) * BLOCK, torch.cat([node.kv for node in path], dim=3)

    def cached_length(self, ids: Sequence[int]) -> int:
        """How much of `ids` a `match` would serve (counts nothing and refreshes nothing)."""
        return len(self._path(ids, len(ids) - 1)) * BLOCK

    def store(self, ids: Sequence[int], kv_of: Callable[[int, int], Any]) -> None:
        """Keep the whole blocks of `ids` not cached yet; `kv_of(start, end)` gives the KV of `ids[start:end]`
        [layers, 2, heads, end - start, head_dim], asked for only when there is something new to keep."""
        if self.budget_bytes <= 0:
            return
        path = self._path(ids, len(ids))
        start, end = len(path) * BLOCK, len(ids) - len(ids) % BLOCK
        node = path[-1] if path else self._root
        if start < end:
            kv = kv_of(start, end)
            for offset in range(start, end, BLOCK):
                block = kv[:, :, :, offset - start : offset - start + BLOCK].clone()  # own memory: evictable alone
                key = tuple(ids[offset : offset + BLOCK])
                node.children[key] = node = _Node(block, node, key)
                self._recency[id(node)] = node
                self.used_bytes += block.numel() * block.element_size()
                path.append(node)
        self._touch(path)
        self._evict()

    def _evict(self) -> None:
        while self.used_bytes > self.budget_bytes and self._recency:
            _, node = self._recency.popitem(last=False)
            assert node.parent is not None and not node.children, "the least recent block must be a leaf"
            del node.parent.children[node.key]
            self.used_bytes -= node.kv.numel() * node.kv.element_size()
