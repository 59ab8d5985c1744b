"""The decoding state of the rows a transformers engine is sampling: one KV cache, left-padded.

Rows join between decode steps and leave as soon as they finish, so a request never waits for a
batch to drain. A prompt is prefilled once: its cache is copied to every row that shares it (the
`n` choices of a request, a group's identical prompts), also to rows that arrive while an earlier
row with that prompt is still decoding (the copy masks out what that row has generated since).
Every row keeps exactly one sampled token not yet fed to the model (its last); `step` feeds them.
Positions are per row, so the left padding that joining adds and leaving trims changes nothing a
row computes. Decoding appends each token's KV into spare room (`RoomyLayer`) rather than copying the whole cache.

With a `PrefixCache`, a prompt prefills only what follows its longest cached prefix: that prefix's KV goes into
the row's cache first (padding may then sit between it and the rest, masked out like the left padding). Prompts
arriving together that share a head beyond what is cached get the head prefilled once first. Prompts and the rows
that finish are kept in the cache.
"""

from __future__ import annotations

from typing import Any

from art_agents.server.engines.prefix_cache import BLOCK, PrefixCache


class KVBatch:
    def __init__(
        self, model: Any, cache_kw: str, pad_id: int, device: Any, prefix_cache: PrefixCache | None = None
    ) -> None:
        self.model = model
        self.cache_kw = cache_kw  # "cache" in transformers >= 5.2x, "past_key_values" before
        self.pad_id = pad_id
        self.device = device
        self.cache: Any = None
        self.attention: Any = None  # [rows, width]: 1 where the cache holds a real token
        self.positions: Any = None  # [rows, 1]: the position of each row's next fed token
        self.prompts: list[tuple[int, ...]] = []  # each row's prompt
        self.first_logits: dict[tuple[int, ...], Any] = {}  # a running prompt's next-token logits after prefill
        self.prefix_cache = prefix_cache
        self.computed: dict[tuple[int, ...], int] = {}  # prompt tokens the last `join` computed, by prompt

    @property
    def rows(self) -> int:
        return 0 if self.attention is None else int(self.attention.shape[0])

    @property
    def joinable(self) -> bool:
        """Whether rows can join a running batch: only plain full-attention layers can be padded and merged."""
        return self.cache is None or _full_attention(self.cache)

    def join(self, prompts: list[tuple[int, ...]], copies: list[int]) -> tuple[list[int], Any]:
        """Add one row per entry of `copies` (an index into the distinct `prompts`) after the running rows, prefilling
        only prompts no running row has. Returns the entries in the order their rows were added, and those rows'
        next-token logits [len(copies), vocab]."""
        import torch

        self.computed = {}
        running = {prompt: row for row, prompt in enumerate(self.prompts) if prompt in self.first_logits}
        fresh = [i for i in range(len(prompts)) if prompts[i] not in running]
        order = [entry for entry, i in enumerate(copies) if prompts[i] not in running]
        logits = []
        if fresh:
            slot = {i: k for k, i in enumerate(fresh)}
            logits.append(self._prefill([prompts[i] for i in fresh], [slot[copies[entry]] for entry in order]))
        shared = [entry for entry, i in enumerate(copies) if prompts[i] in running]
        if shared:
            sources = [running[prompts[copies[entry]]] for entry in shared]
            self._copy_prompts(sources)
            logits.append(torch.stack([self.first_logits[self.prompts[row]] for row in sources]))
        self.prompts += [prompts[copies[entry]] for entry in order + shared]
        return order + shared, torch.cat(logits)

    def _prefill(self, prompts: list[tuple[int, ...]], copies: list[int]) -> Any:
        import torch

        self.computed = dict.fromkeys(prompts, 0)
        for head in self._shared_heads(prompts):  # its tokens count as computed for the first prompt it heads
            *_, (matched,) = self._forward([head])
            self.computed[next(p for p in prompts if p[: len(head)] == head)] += len(head) - matched
        cache, attention, last, matched_lengths = self._forward(prompts)
        for prompt, matched in zip(prompts, matched_lengths, strict=True):
            self.computed[prompt] += len(prompt) - matched
        self.first_logits.update(zip(prompts, last, strict=True))
        index = torch.tensor(copies, device=self.device)
        cache.reorder_cache(index)
        attention = attention[index]
        positions = attention.sum(-1, keepdim=True)
        if self.cache is None:
            self.cache, self.attention, self.positions = cache, attention, positions
        else:
            self._merge(cache, attention, positions)
        return last[index]

    def _shared_heads(self, prompts: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Whole-block prefixes that prompts arriving together share beyond what the prefix cache holds, shortest
        first: prefilled (and cached) once before the prompts themselves."""
        if self.prefix_cache is None or len(prompts) < 2:
            return []
        heads = set()
        for i, prompt in enumerate(prompts):
            shared = max(_common_length(prompt, other) for other in prompts[:i] + prompts[i + 1 :])
            length = min(shared, len(prompt) - 1) // BLOCK * BLOCK
            if length > self.prefix_cache.cached_length(prompt):
                heads.add(prompt[:length])
        return sorted(heads, key=len)

    def _forward(self, prompts: list[tuple[int, ...]]) -> tuple[Any, Any, Any, list[int]]:
        """Prefill `prompts` (one row each) after their cached prefixes and keep them in the prefix cache: the
        rows' cache, attention mask, next-token logits, and how many tokens of each prompt came from the cache."""
        import torch

        pasts = [self.prefix_cache.match(p) if self.prefix_cache else (0, None) for p in prompts]
        matched_lengths = [matched for matched, _ in pasts]
        past, suffix = max(matched_lengths), max(len(p) - m for p, m in zip(prompts, matched_lengths, strict=True))
        input_ids = torch.full((len(prompts), suffix), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), past + suffix), dtype=torch.long)
        for i, (prompt, matched) in enumerate(zip(prompts, matched_lengths, strict=True)):
            input_ids[i, suffix - len(prompt) + matched :] = torch.tensor(prompt[matched:])
            attention[i, past - matched : past] = 1
            attention[i, past + suffix - len(prompt) + matched :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=(attention.cumsum(-1) - 1).clamp(min=0)[:, past:],
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_kw: self._past_cache(pasts, past)},
        )
        cache = getattr(output, self.cache_kw)
        if not _full_attention(cache):
            self.prefix_cache = None  # sliding-window or recurrent layers: prefixes cannot be cut out and reused
        for row, prompt in enumerate(prompts):
            self._remember(cache, attention, row, prompt)
        return cache, attention, output.logits[:, -1, :].float(), matched_lengths

    def _past_cache(self, pasts: list[tuple[int, Any]], width: int) -> Any:
        """A cache holding each row's cached prefix, right-aligned in `width` columns (None when none matched)."""
        if width == 0:
            return None
        from transformers.cache_utils import DynamicCache

        some = next(kv for _, kv in pasts if kv is not None)
        layers, _, heads, _, dim = some.shape
        joined = some.new_zeros((layers, 2, len(pasts), heads, width, dim))
        for row, (matched, kv) in enumerate(pasts):
            if matched:
                joined[:, :, row, :, width - matched :] = kv
        return DynamicCache(ddp_cache_data=[(layer[0], layer[1]) for layer in joined.unbind(0)])

    def _remember(self, cache: Any, attention: Any, row: int, ids: tuple[int, ...]) -> None:
        """Keep the whole blocks of the tokens in `row` of `cache` (`ids`, those its `attention` marks, in order)."""
        import torch

        if self.prefix_cache is None:
            return
        columns = attention[row].nonzero()[:, 0][: len(ids)]

        def kv_of(start: int, end: int) -> Any:
            span = columns[start:end]
            return torch.stack(
                [torch.stack([layer.keys[row][:, span], layer.values[row][:, span]]) for layer in cache.layers]
            )

        self.prefix_cache.store(ids, kv_of)

    def remember(self, row: int, generated: list[int]) -> None:
        """Keep a finishing row's prompt and the tokens of `generated` its cache holds in the prefix cache."""
        if self.prefix_cache is not None:
            held = int(self.attention[row].sum())
            self._remember(self.cache, self.attention, row, (self.prompts[row] + tuple(generated))[:held])

    def _copy_prompts(self, sources: list[int]) -> None:
        """New rows holding the prompt part of these running rows' caches (what they generated since, masked out)."""
        import torch

        index = torch.tensor(sources, device=self.device)
        lengths = torch.tensor([len(self.prompts[row]) for row in sources], device=self.device)
        attention = self.attention[index]
        attention = attention * (attention.cumsum(-1) <= lengths[:, None])
        for layer in self.cache.layers:
            layer.keys = torch.cat([layer.keys, layer.keys[index]])
            layer.values = torch.cat([layer.values, layer.values[index]])
        self.attention = torch.cat([self.attention, attention])
        self.positions = torch.cat([self.positions, lengths[:, None]])

    def _merge(self, cache: Any, attention: Any, positions: Any) -> None:
        import torch

        width = max(self.attention.shape[1], attention.shape[1])

        def padded(tensor: Any, dim: int) -> Any:
            missing = width - tensor.shape[dim]
            if missing == 0:
                return tensor
            shape = list(tensor.shape)
            shape[dim] = missing
            return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)

        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([padded(mine.keys, 2), padded(theirs.keys, 2)])
            mine.values = torch.cat([padded(mine.values, 2), padded(theirs.values, 2)])
        self.attention = torch.cat([padded(self.attention, 1), padded(attention, 1)])
        self.positions = torch.cat([self.positions, positions])

    def step(self, tokens: list[int]) -> Any:
        """Feed each row its pending token; returns the next-token logits [rows, vocab]."""
        import torch

        from art_agents.server.engines.roomy_layer import RoomyLayer

        if self.joinable:
            self.cache.layers = [RoomyLayer.adopt(layer) for layer in self.cache.layers]
        attention = torch.cat([self.attention, torch.ones_like(self.attention[:, :1])], dim=1)
        output = self.model(
            input_ids=torch.tensor(tokens, device=self.device)[:, None],
            attention_mask=attention,
            position_ids=self.positions,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_kw: self.cache},
        )
        self.cache, self.attention = getattr(output, self.cache_kw), attention
        self.positions = self.positions + 1
        return output.logits[:, -1, :].float()

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows (in this order), and drop the left padding no remaining row needs."""
        import torch

        self.prompts = [self.prompts[row] for row in rows]
        self.first_logits = {prompt: logits for prompt, logits in self.first_logits.items() if prompt in self.prompts}
        if not rows:
            self.cache = self.attention = self.positions = None
            return
        index = torch.tensor(rows, device=self.device)
        self.cache.reorder_cache(index)
        self.attention, self.positions = self.attention[index], self.positions[index]
        if not self.joinable:
            return
        lead = int(self.attention.any(dim=0).int().argmax())
        if lead:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, lead:], layer.values[:, :, lead:]
            self.attention = self.attention[:, lead:]


def _full_attention(cache: Any) -> bool:
    """Whether every layer of `cache` is a plain full-attention one (no sliding window, no recurrent state): only
    those can be padded, merged and cut into prefixes."""
    from transformers.cache_utils import DynamicLayer

    from art_agents.server.engines.roomy_layer import RoomyLayer

    layers = getattr(cache, "layers", None)
    return layers is not None and all(type(layer) in (DynamicLayer, RoomyLayer) for layer in layers)


def _common_length(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
