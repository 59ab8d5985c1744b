"""The transformers engine's prefix cache: a prompt prefills only what follows its longest cached prefix (a group's
shared head, a conversation's earlier turns, a head being decoded), samples exactly what a full prefill samples, stays
within its memory budget, and is dropped whenever the weights may change."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch
from server_fixtures import start_server
from test_engine_batching import decoding
from test_trainer_on_policy import conversation, store_of

from art_agents import TrajectoryGroup
from art_agents.backends.remote import RemoteBackend
from art_agents.model import TrainableModel
from art_agents.server.engines.prefix_cache import BLOCK, NODE_BYTES, PrefixCache
from art_agents.server.engines.protocol import Sample, SamplingParams
from art_agents.server.engines.transformers_engine import TransformersEngine
from art_agents.server.models.chat_format import render_prompt_ids
from art_agents.train_config import ModelConfig, TrainConfig

SEEDED = SamplingParams(max_tokens=10, seed=5, temperature=0.9)
HEAD = "You are a tool-using agent. " + " ".join(f"tool_{i}(x): does thing {i}." for i in range(20))


async def engine_with(path: Path, prefix_cache_mb: float) -> TransformersEngine:
    engine = TransformersEngine.load(str(path), ModelConfig(prefix_cache_mb=prefix_cache_mb))
    engine._stop_ids = set()  # a random model may end a row early; these tests need rows of a known length
    return engine


@pytest.fixture
async def engines(tiny_model_path: Path) -> AsyncIterator[tuple[TransformersEngine, TransformersEngine]]:
    """The same model with the prefix cache on and off."""
    on, off = await engine_with(tiny_model_path, 64), await engine_with(tiny_model_path, 0)
    yield on, off
    await on.close()
    await off.close()


def chat(engine: TransformersEngine, *turns: str) -> list[int]:
    """A prompt: the shared system head, then these user messages."""
    messages = [{"role": "system", "content": HEAD}, *({"role": "user", "content": text} for text in turns)]
    return render_prompt_ids(engine.tokenizer, messages, None)


def assert_same(cached: Sample, full: Sample) -> None:
    assert cached.token_ids == full.token_ids
    assert cached.logprobs == pytest.approx(full.logprobs, abs=1e-5)


async def test_a_group_sharing_a_head_prefills_it_once_and_samples_what_full_prefills_sample(
    engines: tuple[TransformersEngine, TransformersEngine], caplog: pytest.LogCaptureFixture
) -> None:
    on, off = engines
    prompts = [chat(on, f"Task {i}: list the files in folder number {i}.") for i in range(4)]
    with caplog.at_level(logging.INFO, logger="art_agents.server"):
        cached = await asyncio.gather(*(on.generate(p, SEEDED) for p in prompts))
    logged = [r.getMessage() for r in caplog.records if "prefix cache" in r.getMessage()]
    assert len(logged) == 1 and logged[0].startswith("prefill of 4 requests, tokens computed/from the prefix cache: ")
    full = await asyncio.gather(*(off.generate(p, SEEDED) for p in prompts))
    alone = [(await off.generate(p, SEEDED))[0] for p in prompts]
    for c, f, a in zip(cached, full, alone, strict=True):
        assert_same(c[0], f[0])
        assert_same(c[0], a)
    total = sum(map(len, prompts))
    assert off.prefill_tokens.computed == 2 * total and off.prefill_tokens.cached == 0
    head = len(chat(on)) - 4  # the system head without the last turn's markers
    assert on.prefill_tokens.computed + on.prefill_tokens.cached == total
    assert on.prefill_tokens.computed < total - 3 * head + 4 * BLOCK  # the head once, then only the tails


async def test_the_next_turn_of_a_conversation_prefills_only_what_it_adds(
    engines: tuple[TransformersEngine, TransformersEngine],
) -> None:
    on, off = engines
    first = chat(on, "Find the largest file.")
    turn = (await on.generate(first, SEEDED))[0]
    assert_same(turn, (await off.generate(first, SEEDED))[0])
    result = (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n4096 bytes\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    following = first + turn.token_ids + on.tokenizer.encode(result)
    before = on.prefill_tokens.computed
    cached, full = (await on.generate(following, SEEDED))[0], (await off.generate(following, SEEDED))[0]
    assert_same(cached, full)
    added = len(following) - len(first) - len(turn.token_ids)
    assert on.prefill_tokens.computed - before <= added + BLOCK  # the earlier turn and its completion came cached


async def test_a_request_arriving_while_its_head_decodes_reuses_it(
    engines: tuple[TransformersEngine, TransformersEngine],
) -> None:
    on, off = engines
    running = await decoding(on, chat(on, "Run a long job."), SamplingParams(max_tokens=60, temperature=1.0))
    late = chat(on, "Check the weather.")
    before = on.prefill_tokens.computed
    joined = (await on.generate(late, SEEDED))[0]
    assert on.prefill_tokens.computed - before < len(late) - len(chat(on)) + 2 * BLOCK  # the head was cached
    await running
    assert_same(joined, (await off.generate(late, SEEDED))[0])


async def test_the_completion_logprobs_are_what_a_full_forward_over_prompt_and_completion_gives(
    engines: tuple[TransformersEngine, TransformersEngine],
) -> None:
    """What the trainer recomputes from the token store's ids: a plain forward over the whole sequence."""
    on, _ = engines
    prompt = chat(on, "Hello.")
    await on.generate(prompt, SEEDED)  # warm the cache with this prompt
    sample = (await on.generate(prompt, SEEDED))[0]
    assert on.prefix_cache is not None and on.prefix_cache.hits > 0
    with torch.inference_mode():
        logits = on.model(input_ids=torch.tensor([prompt + sample.token_ids])).logits[0, len(prompt) - 1 : -1]
    recomputed = torch.log_softmax(logits.float() / SEEDED.temperature, -1).gather(
        1, torch.tensor(sample.token_ids)[:, None]
    )
    assert sample.logprobs == pytest.approx(recomputed[:, 0].tolist(), abs=1e-5)


async def test_through_the_server_cached_turns_store_what_the_trainer_recomputes(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    """Multi-turn rollouts through the OpenAI SDK: the token store's logprobs are a full forward's, the trainer finds
    no gap, and the step's history row says how much of the prompts came from the cache."""
    from transformers import AutoModelForCausalLM

    with start_server(tmp_path / "art") as url:
        backend = RemoteBackend(url)
        model = TrainableModel(name="cached", project="p", base_model=str(tiny_model_path))
        await model.register(backend)
        sampling = {"temperature": 0.8, "max_tokens": 8}
        group = TrajectoryGroup([await conversation(model, 3, f"{HEAD} Task {i}.", **sampling) for i in range(2)])
        for reward, trajectory in enumerate(group.trajectories):
            trajectory.reward = float(reward)
        base = AutoModelForCausalLM.from_pretrained(
            tiny_model_path, dtype=torch.float32
        )  # the adapter starts as identity
        records = [
            store_of(tmp_path / "art", model).get(t.completion_id or "") for tr in group.trajectories for t in tr.turns
        ]
        for record in records:
            assert record is not None
            with torch.no_grad():
                ids = torch.tensor([record.prompt_ids + record.completion_ids])
                logits = base(input_ids=ids).logits[0, len(record.prompt_ids) - 1 : -1] / 0.8
            expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(record.completion_ids)[:, None])[:, 0]
            assert record.logprobs == pytest.approx(expected.tolist(), abs=1e-5)
        result = await model.train([group], TrainConfig(), progress=False)
        assert result.metrics["logprob_gap_sampler"] < 1e-5
        assert result.metrics["prefix_cache_hit_rate"] > 0.5  # later turns and the second rollout's head were cached
        await backend.close()


async def test_the_cache_is_dropped_after_a_pause_and_on_loading_an_adapter_and_unused_for_older_steps(
    engines: tuple[TransformersEngine, TransformersEngine], tmp_path: Path
) -> None:
    on, _ = engines
    prompt = chat(on, "Hi.")
    await on.generate(prompt, SEEDED)
    assert on.prefix_cache is not None and len(on.prefix_cache) > 0
    async with on.paused():  # training updates the weights in place here
        pass
    assert len(on.prefix_cache) == 0 and on.prefix_cache.used_bytes == 0
    await on.generate(prompt, SEEDED)
    on.model.save_pretrained(tmp_path / "adapter")
    on.load_adapter(tmp_path / "adapter")
    assert len(on.prefix_cache) == 0
    from art_agents.server.engines.protocol import OlderStep

    on.step = 1
    await on.generate(prompt, SEEDED, older=OlderStep(0, tmp_path / "adapter"))
    assert len(on.prefix_cache) == 0  # another adapter's KV is never kept


def test_the_budget_evicts_least_recently_used_blocks_first() -> None:
    block_bytes = 2 * 2 * 1 * BLOCK * 1 * 4 + NODE_BYTES  # [layers=2, 2, heads=1, BLOCK, dim=1] fp32, and its node

    def kv_of(ids: list[int]) -> object:
        return lambda start, end: torch.tensor(ids[start:end], dtype=torch.float32).expand(2, 2, 1, -1)[..., None]

    cache = PrefixCache(budget_bytes=4 * block_bytes)
    shared, a, b = list(range(2 * BLOCK)), [100] * BLOCK, [200] * BLOCK
    cache.store(shared + a, kv_of(shared + a))  # the shared head is stored once for both
    cache.store(shared + b, kv_of(shared + b))
    assert len(cache) == 4 and cache.used_bytes == 4 * block_bytes
    length, kv = cache.match(shared + a + [1])
    assert length == 3 * BLOCK and kv[0, 0, 0, :, 0].tolist() == shared + a
    cache.store(shared + [7] * BLOCK, kv_of(shared + [7] * BLOCK))  # over budget: b's block was used least recently
    assert cache.used_bytes == 4 * block_bytes
    assert cache.match(shared + b + [1])[0] == 2 * BLOCK and cache.match(shared + a + [1])[0] == 3 * BLOCK
    assert cache.match([5] * 40)[0] == 0 and (cache.hits, cache.misses) == (3, 1)
    assert cache.match(shared)[0] == BLOCK  # at least one token is left to compute: its logits are needed


def test_a_sequence_longer_than_the_budget_keeps_the_blocks_that_fit() -> None:
    cache = PrefixCache(budget_bytes=3 * (2 * 2 * BLOCK * 4 + NODE_BYTES))
    ids = list(range(10 * BLOCK))
    cache.store(ids, lambda start, end: torch.ones(2, 2, 1, end - start, 1))
    assert len(cache) == 3 and cache.match(ids)[0] == 3 * BLOCK


def test_the_cache_holds_its_budget_in_resident_memory() -> None:
    """Blocks live in a few large tensors and the budget counts their nodes: filling and evicting 32 MiB of a tiny
    model's 8 KiB blocks (13,000 sequences, ~4,000 blocks at a time) adds at most the budget + 10%."""
    import random

    def resident_mb() -> float:
        line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmRSS"))
        return int(line.split()[1]) / 1024

    cache, rng = PrefixCache(budget_bytes=32 * 2**20), random.Random(0)
    head = [rng.randrange(512) for _ in range(160)]
    cache.store(head, lambda start, end: torch.zeros(2, 2, 2, end - start, 16))
    before = resident_mb()
    for _ in range(13_000):
        ids = head + [rng.randrange(512) for _ in range(80)]
        cache.store(ids, lambda start, end: torch.zeros(2, 2, 2, end - start, 16))
    assert cache.used_bytes <= 32 * 2**20 and len(cache) > 3000
    assert resident_mb() - before <= 32 * 1.1
