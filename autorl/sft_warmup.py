"""SFT warmup before RL: a teacher's best tool-use rollouts, imitated by the student with `train_sft`.

A small model that never completes a task gives GRPO groups without signal; a few supervised epochs on a
stronger model's good attempts get it started. The teacher (any OpenAI-compatible endpoint) runs the same
tool rollout as the student, `sft_warmup` times per training scenario (a group, which RULER compares), the
run's scorer rewards it, `keep_best` keeps the rollouts scored at least `sft_min_reward`, and one `train_sft`
call commits the next step. Files in the run folder: `warmup/teacher.jsonl` (the scored groups, reused on a
rerun) and `warmup.json` (counts, reward mean, timings, the SFT step; `done` once that step is committed).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import Field

from art_agents.distill import keep_best
from art_agents.errors import ArtError
from art_agents.fatal import fatal_error
from art_agents.llm import KeyProblem
from art_agents.schema import Schema
from art_agents.trajectory import TrajectoryGroup

if TYPE_CHECKING:
    from art_agents.autorl.mcp_rl_config import MCPRLConfig
    from art_agents.autorl.run_folder import RunFolder
    from art_agents.autorl.scenarios import Scenario
    from art_agents.autorl.scoring import GroupScorer
    from art_agents.model import Model, TrainableModel

OPENAI_API_BASE = "https://api.openai.com/v1"
TEACHER_FILE = "warmup/teacher.jsonl"
WARMUP_FILE = "warmup.json"


class Warmup(Schema):
    """What the warmup did (saved as `warmup.json`); `done` once its SFT step is committed."""

    teacher_model: str
    rollouts_per_scenario: int
    scenarios: int
    rollouts: int = Field(description="Teacher rollouts that finished (failed ones are not counted).")
    failed: int
    kept: int
    dropped: int = Field(description="Finished rollouts scored below `min_reward`.")
    min_reward: float
    reward_mean: float
    sft_step: int = Field(description="The step the SFT call commits: RL steps come after it.")
    sft_metrics: dict[str, float] = Field(default_factory=dict)
    seconds: dict[str, float] = Field(default_factory=dict, description="teacher_rollouts, scoring, sft.")
    done: bool = False


def teacher(config: MCPRLConfig) -> Model:
    """The teacher as a prompted `Model`: `api_base` (default OpenAI's) and `api_key` (default $OPENAI_API_KEY)."""
    from art_agents.model import Model

    params = config.teacher_params
    return Model(
        name="teacher",
        inference_model_name=config.teacher_model,
        inference_base_url=params.get("api_base") or OPENAI_API_BASE,
        inference_api_key=params.get("api_key") or os.environ.get("OPENAI_API_KEY"),
    )


async def check_teacher(model: Model) -> None:
    """Fail before anything runs when the teacher has no key for OpenAI's endpoint, cannot be reached or refuses
    the key (`GET /models`)."""
    if model.inference_base_url == OPENAI_API_BASE and not model.inference_api_key:
        raise KeyProblem(
            f"the SFT warmup's teacher {model.served_name!r} needs an API key: set OPENAI_API_KEY, or pass "
            "--teacher-api-key (or --teacher-api-base for another endpoint)"
        )
    client = model.openai_client()
    try:
        await client.models.list()
    except Exception as exc:  # only the errors every rollout would hit stop the run here
        error = fatal_error(exc)
        if error is not None and getattr(exc, "status_code", None) != 404:  # some endpoints serve no /models
            raise ArtError(
                f"the SFT warmup's teacher {model.served_name!r} is not usable: {error} "
                "(set --teacher-api-base / --teacher-api-key, or drop --sft-warmup)"
            ) from exc
    finally:
        await client.close()


def pending(folder: RunFolder) -> bool:
    saved = folder.read_json(WARMUP_FILE, Warmup)
    return saved is None or not saved.done


async def sft_warmup(
    config: MCPRLConfig,
    folder: RunFolder,
    model: TrainableModel,
    rollout: Callable[[Model, Scenario], Any],
    train: list[Scenario],
    scorer: GroupScorer,
    echo: Callable[[str], None],
) -> Warmup:
    """Run the warmup, or finish or reuse the saved one; the model then serves `warmup.sft_step`."""
    saved = folder.read_json(WARMUP_FILE, Warmup)
    if saved is not None and saved.done:
        echo(f"reusing the SFT warmup of {folder.file(WARMUP_FILE)} (step {saved.sft_step})")
        return saved
    step = await model.get_step()
    if saved is not None and step >= saved.sft_step:  # committed, then interrupted before warmup.json said so
        return _save(folder, saved.model_copy(update={"done": True}))
    seconds: dict[str, float] = {}
    groups = folder.read_jsonl(TEACHER_FILE, TrajectoryGroup)
    if groups is None:
        groups = await _teacher_groups(config, rollout, train, scorer, seconds, echo)
        folder.file("warmup").mkdir(exist_ok=True)
        folder.write_jsonl(TEACHER_FILE, list(groups))
    else:
        echo(f"reusing {len(groups)} scored teacher groups from {folder.file(TEACHER_FILE)}")
    kept = keep_best(groups, config.sft_min_reward)
    finished = [t for g in groups for t in g.trajectories if not t.failed]
    if not kept:
        raise ArtError(
            f"no teacher rollout scored at least sft_min_reward={config.sft_min_reward} ({len(finished)} finished; "
            f"see {folder.file(TEACHER_FILE)}): lower sft_min_reward, use a stronger --teacher-model, or drop --sft-warmup"
        )
    warmup = Warmup(
        teacher_model=config.teacher_model or "",
        rollouts_per_scenario=config.sft_warmup,
        scenarios=len(groups),
        rollouts=len(finished),
        failed=sum(len(g.exceptions) + len(g.trajectories) for g in groups) - len(finished),
        kept=len(kept),
        dropped=len(finished) - len(kept),
        min_reward=config.sft_min_reward,
        reward_mean=sum(t.reward for t in finished) / len(finished),
        sft_step=step + 1,
        seconds=seconds,
    )
    _save(folder, warmup)  # before training: a rerun after the commit knows the step is the warmup's
    started = time.monotonic()
    result = await model.train_sft(kept, config.sft, progress=False)
    seconds = {**seconds, "sft": round(time.monotonic() - started, 3)}
    echo(
        f"SFT warmup: kept {len(kept)} of {len(finished)} teacher rollouts (reward mean {warmup.reward_mean:.3f}), "
        f"step {result.step} in {seconds['sft']:.1f} s"
    )
    done = {"sft_step": result.step, "sft_metrics": result.metrics, "seconds": seconds, "done": True}
    return _save(folder, warmup.model_copy(update=done))


async def _teacher_groups(
    config: MCPRLConfig,
    rollout: Callable[[Model, Scenario], Any],
    train: list[Scenario],
    scorer: GroupScorer,
    seconds: dict[str, float],
    echo: Callable[[str], None],
) -> list[TrajectoryGroup]:
    """`sft_warmup` teacher rollouts per training scenario, then scored group by group (timed apart)."""
    from art_agents.gather import gather_trajectory_groups

    model = teacher(config)
    echo(f"SFT warmup: {config.sft_warmup} rollouts of {model.served_name} on each of {len(train)} scenarios")
    started = time.monotonic()
    groups = await gather_trajectory_groups(
        (TrajectoryGroup(rollout(model, s) for _ in range(config.sft_warmup)) for s in train),
        pbar_desc="teacher rollouts",
        max_exceptions=config.max_exceptions,
    )
    seconds["teacher_rollouts"] = round(time.monotonic() - started, 3)
    started = time.monotonic()
    scored = await asyncio.gather(*(scorer(g) for g in groups))
    seconds["scoring"] = round(time.monotonic() - started, 3)
    echo(f"teacher rollouts {seconds['teacher_rollouts']:.1f} s, scoring {seconds['scoring']:.1f} s")
    return [g for g in scored if g is not None]


def _save(folder: RunFolder, warmup: Warmup) -> Warmup:
    folder.write_json(WARMUP_FILE, warmup)
    return warmup
