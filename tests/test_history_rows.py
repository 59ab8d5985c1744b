"""The history row of every train call holds what a user needs to judge a step, with sane values.

A 2-step CPU run on the tiny model, RULER-scored by a scripted judge priced through LiteLLM's
custom pricing (so the judge cost is a real, non-zero figure), with one rollout per group raising.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ruler_fixtures import answer, shown
from scripted_openai import ScriptedOpenAI

import art_agents as art
from art_agents.jsonl import read_groups
from art_agents.local import LocalBackend
from art_agents.rewards import ruler_score_group
from art_agents.server.ops.quickstart import TOY_MODEL_CONFIG

# what the issue names, as the row calls it
TRAIN_FIELDS = (
    "reward_mean",
    "reward_std",
    "reward_std_within_group",
    "groups_skipped_zero_variance",
    "exception_rate",
    "tokens_trained",
    "turns_retokenized",
    "turns_foreign",
    "loss",
    "kl_sampler",
    "entropy",
    "clip_fraction",
    "grad_norm",
    "learning_rate",
    "train_s",
    "step_s",
    "tokens_per_s",
    "judge_cost_usd",
    "prefix_cache_hit_rate",
)


def judge_by_length(body: dict[str, Any]) -> str:
    return answer([(i, min(len(text), 400) / 400) for i, text in shown(body)])


async def rollout(model: art.TrainableModel, n: int, fail: bool) -> art.Trajectory:
    if fail:
        raise RuntimeError("tool crashed")
    trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": f"Say a {n} times."}])
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=trajectory.messages(), max_tokens=6
    )
    trajectory.messages_and_choices.append(completion.choices[0])
    return trajectory


async def test_two_train_steps_write_rows_with_every_named_field(tmp_path: Path, tiny_model_path: Path) -> None:
    with ScriptedOpenAI() as judge:
        judge.default = judge_by_length
        backend = LocalBackend(path=tmp_path / ".art", in_process=True)
        model = art.TrainableModel(
            name="rows", project="history", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG, report_to=[]
        )
        await model.register(backend)
        priced = {"api_base": judge.base_url, "api_key": "sk-test", "cache_dir": None}
        priced |= {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}
        try:
            for step in range(2):
                groups = await art.gather_trajectory_groups(
                    (art.TrajectoryGroup(rollout(model, g, fail=i == 3) for i in range(4)) for g in range(2)),
                    pbar_desc=None,
                    max_exceptions=2,
                    after_each=lambda group: ruler_score_group(group, "openai/judge", **priced),
                )
                result = await model.train(groups, config=art.TrainConfig(learning_rate=1e-4), progress=False)
                assert result.step == step + 1
            await model.log(groups, split="val")
        finally:
            await backend.close()

    model_dir = tmp_path / ".art" / "history" / "models" / "rows"
    rows = [json.loads(line) for line in (model_dir / "history.jsonl").read_text().splitlines()]
    train_rows = [row for row in rows if "split" not in row]
    assert [row["step"] for row in train_rows] == [1, 2]
    for row in train_rows:
        metrics = row["metrics"]
        missing = [name for name in TRAIN_FIELDS if name not in metrics]
        assert not missing, f"history row lacks {missing}"
        assert all(math.isfinite(value) for value in metrics.values())
        assert metrics["exception_rate"] == 0.25  # one of four rollouts raised in each group
        assert metrics["reward_std"] > 0 and metrics["reward_std_within_group"] > 0  # the judge spread its scores
        assert metrics["tokens_trained"] > 0 and metrics["turns_retokenized"] == 0 and metrics["turns_foreign"] == 0
        assert metrics["kl_sampler"] >= 0 and metrics["kl_sampler"] < 0.05  # on policy: sampler and trainer agree
        assert metrics["entropy"] > 0 and metrics["grad_norm"] > 0 and 0 <= metrics["clip_fraction"] <= 1
        assert metrics["learning_rate"] == 1e-4
        assert 0 < metrics["train_s"] <= metrics["step_s"]
        assert math.isclose(metrics["tokens_per_s"], metrics["tokens_trained"] / metrics["train_s"])
        assert 0 < metrics["judge_cost_usd"] < 0.1  # two priced judge calls of a few hundred tokens
        assert 0 < metrics["prefix_cache_hit_rate"] < 1  # a group's rollouts share their prompt's head
        trajectories = read_groups(model_dir / "trajectories" / "train" / f"{row['step']:04d}.jsonl")
        assert sum(len(g.trajectories) for g in trajectories) == 6
    val = next(row for row in rows if row.get("split") == "val")
    assert val["step"] == 2 and val["metrics"]["val/exception_rate"] == 0.25
    assert val["metrics"]["val/judge_cost_usd"] == train_rows[1]["metrics"]["judge_cost_usd"]
    assert (model_dir / "trajectories" / "val" / "0002.jsonl").exists()


async def test_a_train_call_without_reward_spread_says_it_skipped_and_writes_no_row(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    backend = LocalBackend(path=tmp_path / ".art", in_process=True)
    model = art.TrainableModel(
        name="flat", project="history", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG, report_to=[]
    )
    await model.register(backend)
    try:
        groups = await art.gather_trajectory_groups(
            [art.TrajectoryGroup(rollout(model, 1, fail=False) for _ in range(3))], pbar_desc=None
        )  # every reward is the default 0.0: nothing for GRPO to learn from
        result = await model.train(groups, progress=False)
        assert result.skipped and result.step == 0 and result.metrics["groups_skipped_zero_variance"] == 1
        assert await model.get_step() == 0
    finally:
        await backend.close()
    model_dir = tmp_path / ".art" / "history" / "models" / "flat"
    history = model_dir / "history.jsonl"
    assert not history.exists() or not history.read_text().strip()
    assert not (model_dir / "checkpoints" / "0001").exists()
