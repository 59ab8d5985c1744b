"""The transformers engine's continuous batch: what a row samples never depends on the rows beside it, prompts are
prefilled once, rows join while others decode and leave as soon as they finish, and pausing stops admission."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from art_agents.server.engines.kv_batch import KVBatch
from art_agents.server.engines.protocol import SamplingParams
from art_agents.server.engines.transformers_engine import TransformersEngine
from art_agents.server.models.chat_format import render_prompt_ids
from art_agents.train_config import ModelConfig

SEEDED = SamplingParams(max_tokens=12, seed=9, temperature=0.8)
NEVER_STOPS = SamplingParams(max_tokens=80, seed=1, temperature=1.0)


@pytest.fixture
async def engine(tiny_model_path: Path) -> AsyncIterator[TransformersEngine]:
    engine = TransformersEngine.load(str(tiny_model_path), ModelConfig())
    engine._stop_ids = set()  # a random model may end a row early; these tests need rows of a known length
    yield engine
    await engine.close()


@pytest.fixture
def prefills(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(distinct prompts, rows) of every prefill pass."""
    seen: list[tuple[int, int]] = []
    prefill = KVBatch._prefill

    def counted(self: KVBatch, prompts: list[tuple[int, ...]], copies: list[int]) -> Any:
        seen.append((len(prompts), len(copies)))
        return prefill(self, prompts, copies)

    monkeypatch.setattr(KVBatch, "_prefill", counted)
    return seen


def prompt(engine: TransformersEngine, length: int) -> list[int]:
    return render_prompt_ids(engine.tokenizer, [{"role": "user", "content": "x" * length}], None)


async def decoding(engine: TransformersEngine, prompt_ids: list[int], params: SamplingParams) -> asyncio.Task[Any]:
    """A request, once its first token is sampled (so the next one arrives while it decodes)."""
    sampled: list[int] = []
    task = asyncio.create_task(engine.generate(prompt_ids, params, on_token=lambda _, token: sampled.append(token)))
    while not sampled:
        await asyncio.sleep(0.002)
    return task


async def test_a_seeded_row_samples_the_same_alone_batched_joined_late_or_as_one_of_n(
    engine: TransformersEngine, prefills: list[tuple[int, int]]
) -> None:
    short, middle, long = (prompt(engine, k) for k in (1, 40, 90))
    alone = (await engine.generate(short, SEEDED))[0]
    together = await asyncio.gather(*(engine.generate(p, SEEDED) for p in (long, middle, short)))
    running = await decoding(engine, long, NEVER_STOPS)
    joined = await engine.generate(short, SEEDED)
    await running
    as_choice = await engine.generate(short, SamplingParams(max_tokens=12, seed=9, temperature=0.8, n=3))

    assert prefills == [(1, 1), (3, 3), (1, 1), (1, 1), (1, 3)]  # the three of one tick in one left-padded pass;
    # the late request joined the running batch with a prefill of its own
    for sample in (together[2][0], joined[0], as_choice[0]):
        assert sample.token_ids == alone.token_ids
        assert sample.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    assert as_choice[1].token_ids != alone.token_ids  # choice i draws from seed + i


async def test_a_request_joining_a_row_with_its_prompt_copies_that_prompt_instead_of_prefilling(
    engine: TransformersEngine, prefills: list[tuple[int, int]]
) -> None:
    group = prompt(engine, 50)
    alone = (await engine.generate(group, SEEDED))[0]
    running = await decoding(engine, group, NEVER_STOPS)
    await asyncio.sleep(0.05)  # the running row is tokens past its prompt
    joined = (await engine.generate(group, SEEDED))[0]
    await running
    assert prefills == [(1, 1), (1, 1)]  # the joining request prefilled nothing
    assert joined.token_ids == alone.token_ids
    assert joined.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


async def test_identical_prompts_and_n_choices_share_one_prefill(
    engine: TransformersEngine, prefills: list[tuple[int, int]]
) -> None:
    group = prompt(engine, 30)
    params = SamplingParams(max_tokens=6, temperature=1.0, n=2)
    results = await asyncio.gather(*(engine.generate(group, params) for _ in range(4)))
    assert prefills == [(1, 8)]  # four requests of two choices each: one prompt prefilled once, eight rows
    assert len({tuple(s.token_ids) for samples in results for s in samples}) == 8  # unseeded rows differ


async def test_a_finished_row_leaves_at_once_and_a_late_one_joins_the_running_batch(engine: TransformersEngine) -> None:
    running = await decoding(engine, prompt(engine, 60), SamplingParams(max_tokens=200, temperature=1.0))
    short = asyncio.create_task(engine.generate(prompt(engine, 5), SamplingParams(max_tokens=3, temperature=1.0)))
    done, _ = await asyncio.wait({running, short}, return_when=asyncio.FIRST_COMPLETED)
    assert done == {short}  # served beside the long row, not after it
    assert len(short.result()[0].token_ids) == 3
    assert len((await running)[0].token_ids) == 200


async def test_pausing_lets_running_rows_finish_and_admits_none_until_resumed(engine: TransformersEngine) -> None:
    running = await decoding(engine, prompt(engine, 10), SamplingParams(max_tokens=40, temperature=1.0))
    async with engine.paused():
        assert running.done()  # the pause waited for the running row
        queued = asyncio.create_task(engine.generate(prompt(engine, 10), SamplingParams(max_tokens=2)))
        await asyncio.sleep(0.1)
        assert not queued.done()
    assert len((await queued)[0].token_ids) == 2


async def test_a_request_that_breaks_its_prefill_fails_alone(
    engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    poison = prompt(engine, 7)
    join = KVBatch.join

    def breaks_on_poison(self: KVBatch, prompts: list[tuple[int, ...]], copies: list[int]) -> Any:
        if tuple(poison) in prompts:
            raise RuntimeError("this prompt breaks the model")
        return join(self, prompts, copies)

    monkeypatch.setattr(KVBatch, "join", breaks_on_poison)
    fine, broken = await asyncio.gather(
        engine.generate(prompt(engine, 5), SEEDED), engine.generate(poison, SEEDED), return_exceptions=True
    )
    assert not isinstance(fine, BaseException) and len(fine[0].token_ids) == 12
    assert isinstance(broken, RuntimeError)


async def test_a_failed_decode_step_retries_unstreamed_requests_alone_and_fails_streamed_ones(
    engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = KVBatch.step
    failures = []

    def fails_once(self: KVBatch, tokens: list[int]) -> Any:
        if not failures and self.rows == 3:
            failures.append(self.rows)
            raise RuntimeError("out of memory")
        return step(self, tokens)

    monkeypatch.setattr(KVBatch, "step", fails_once)
    streamed: list[int] = []
    results = await asyncio.gather(
        engine.generate(prompt(engine, 5), SEEDED),
        engine.generate(prompt(engine, 9), SEEDED),
        engine.generate(prompt(engine, 3), SEEDED, on_token=lambda _, token: streamed.append(token)),
        return_exceptions=True,
    )
    assert failures == [3]
    assert [len(r[0].token_ids) for r in results[:2]] == [12, 12]  # type: ignore[index]
    assert isinstance(results[2], RuntimeError) and streamed  # its tokens were already sent: it cannot start over


async def test_a_request_for_the_current_step_by_number_is_served_by_the_latest_adapter(
    engine: TransformersEngine,
) -> None:
    """`name@N` resolved just before step N became the latest still names a step this engine serves."""
    from art_agents.server.engines.protocol import OlderStep

    alone = (await engine.generate(prompt(engine, 5), SEEDED))[0]
    by_number = await asyncio.wait_for(
        engine.generate(prompt(engine, 5), SEEDED, older=OlderStep(engine.step, Path("never-loaded"))), timeout=30
    )
    assert by_number[0].token_ids == alone.token_ids and by_number[0].step == engine.step


def test_a_decoding_layer_writes_into_its_room_and_remakes_it_after_a_reorder(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode steps append in place (no copy of the cache), and what the layer returns is what concatenation gives."""
    import torch
    from transformers.cache_utils import DynamicLayer

    from art_agents.server.engines import roomy_layer
    from art_agents.server.engines.roomy_layer import ROOM, RoomyLayer

    copies: list[int] = []  # the width of each copy made to give the layer room
    with_room = roomy_layer._with_room
    monkeypatch.setattr(
        roomy_layer, "_with_room", lambda tensor, width: copies.append(width) or with_room(tensor, width)
    )

    plain, start = DynamicLayer(), torch.randn(3, 2, 5, 4)
    plain.update(start, -start)
    roomy = RoomyLayer.adopt(plain)
    reference = DynamicLayer()
    reference.update(start, -start)
    rows = 3
    for step in range(2 * ROOM):  # runs out of room once
        token = torch.randn(rows, 2, 1, 4)
        keys, values = roomy.update(token, 2 * token)
        expected_keys, expected_values = reference.update(token, 2 * token)
        assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)
        if step == 10:
            order = torch.tensor([2, 0])
            roomy.reorder_cache(order)
            reference.reorder_cache(order)
            rows = 2
    # room made (keys and values) at the first step, after the reorder, and when the room ran out
    assert copies == [6 + ROOM] * 2 + [17 + ROOM] * 2 + [18 + 2 * ROOM] * 2
