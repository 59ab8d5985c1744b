"""An ART program, as ART's docs write it, with only `art` renamed to `art_agents` in the imports.

The rollout builds its trajectory by hand (`messages_and_choices`, the returned `Choice` appended),
the loop walks the data with `iterate_dataset`, RULER scores through `extra_litellm_params`, and the
model trains on the tiny model: the server finds every choice's tokens in its store (0 re-tokenized).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from ruler_fixtures import answer, shown
from scripted_openai import ScriptedOpenAI

import art_agents as art
from art_agents.local import LocalBackend
from art_agents.rewards import ruler_score_group
from art_agents.server.ops.quickstart import TOY_MODEL_CONFIG
from art_agents.utils import iterate_dataset

SCENARIOS = [{"question": f"Say the letter a {n} times."} for n in range(1, 5)]


async def rollout(model: art.TrainableModel, scenario: dict[str, str]) -> art.Trajectory:
    client = model.openai_client()
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "You answer with letters only."},
            {"role": "user", "content": scenario["question"]},
        ],
        reward=0,
    )
    completion = await client.chat.completions.create(
        model=model.get_inference_name(), messages=trajectory.messages(), max_tokens=6, temperature=1.0
    )
    trajectory.messages_and_choices.append(completion.choices[0])
    return trajectory


def judge_by_length(body: dict[str, Any]) -> str:
    """A stand-in judge that prefers longer answers, so every group has a spread of scores."""
    entries = [(trajectory_id, min(len(text), 400) / 400) for trajectory_id, text in shown(body)]
    return answer(entries)


async def test_an_art_program_runs_after_renaming_the_import(tmp_path: Path, tiny_model_path: Path) -> None:
    with ScriptedOpenAI() as judge:
        judge.default = judge_by_length
        backend = LocalBackend(path=str(tmp_path / ".art"), in_process=True)
        model = art.TrainableModel(
            name="agent-001", project="art-program", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG
        )
        await model.register(backend)
        try:
            trained = []
            batches = iterate_dataset(
                SCENARIOS, groups_per_step=2, num_epochs=1, initial_step=await model.get_step(), use_tqdm=False
            )
            for batch in batches:
                groups = await art.gather_trajectory_groups(
                    (art.TrajectoryGroup(rollout(model, scenario) for _ in range(4)) for scenario in batch.items),
                    pbar_desc="gather",
                    max_exceptions=0,
                    after_each=lambda group: ruler_score_group(
                        group,
                        "openai/judge",
                        extra_litellm_params={"api_base": judge.base_url, "api_key": "sk-test"},
                        swallow_exceptions=False,
                    ),
                )
                assert all("ruler_score" in t.metrics for g in groups for t in g.trajectories)
                result = await model.train(groups, config=art.TrainConfig(learning_rate=1e-4))
                trained.append((batch.step, result))
            assert [(step, result.step) for step, result in trained] == [(0, 1), (1, 2)]
            for _, result in trained:
                assert result.metrics["turns_retokenized"] == 0
                assert result.metrics["turns_from_store"] == 8  # 2 groups x 4 rollouts, one choice each
            assert len(judge.requests) == 4  # one judge call per group

            assert await model.delete_checkpoints() == [1]  # the latest step (and step 0) stay
            reply = await model.openai_client().chat.completions.create(
                model=model.get_inference_name(), messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            assert reply.model == "agent-001@2"
        finally:
            await backend.close()


async def test_art_retry_calls_again_with_a_growing_delay_then_gives_up() -> None:
    calls: list[float] = []
    retried: list[int] = []

    @art.retry(
        max_attempts=3, delay=0.05, exceptions=(TimeoutError,), on_retry=lambda exc, attempt: retried.append(attempt)
    )
    async def flaky() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise TimeoutError("slow")
        return "ok"

    assert await flaky() == "ok" and retried == [1, 2]
    assert calls[1] - calls[0] >= 0.05 and calls[2] - calls[1] >= 0.1  # 0.05, then 0.05 x 2

    @art.retry(max_attempts=2, delay=0)
    def always() -> None:
        calls.append(0.0)
        raise ValueError("broken")

    calls.clear()
    with pytest.raises(ValueError, match="broken"):
        always()
    assert len(calls) == 2

    @art.retry(exceptions=(TimeoutError,))
    def other() -> None:
        raise KeyError("not retried")

    with pytest.raises(KeyError):
        other()
