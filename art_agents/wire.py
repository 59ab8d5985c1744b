"""Bodies of the versioned JSON routes, shared by the client and the server."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from art_agents.schema import Schema
from art_agents.sft_config import TrainSFTConfig
from art_agents.train_config import ModelConfig, TrainConfig
from art_agents.trajectory import Trajectory, TrajectoryGroup

API_PREFIX = "/v1/art"
ROLLOUT_HEADER = "x-art-rollout-id"  # names the trajectory a completion belongs to
# asks the server to keep the call (messages, reply, tools) for the rollout's assembly, not only its tokens
ROLLOUT_RECORD_HEADER = "x-art-rollout-record"
ROLLOUT_PATH = "/r"  # `<server>/r/<rollout id>/v1`: a base URL that records every call for that rollout
_STEP_SUFFIX = re.compile(r"@(\d+)\Z")


def _null_is_nan(value: object) -> object:
    return math.nan if value is None else value


# A figure the server reports: JSON has no NaN or infinity, so pydantic writes them as null; null reads back as NaN
# (a NaN loss in a progress event must reach the client, which then shows the server's error, not a parse failure).
Metrics = dict[str, Annotated[float, BeforeValidator(_null_is_nan)]]


def policy_step_of(model_name: str | None) -> int | None:
    """`name@12` -> 12: every completion our server answers names the step that sampled it."""
    match = _STEP_SUFFIX.search(model_name or "")
    return int(match.group(1)) if match else None


def without_step(model_name: str) -> str:
    """`name@12` -> `name`: the registered name a client may send back with its step attached."""
    return _STEP_SUFFIX.sub("", model_name)


class RegisterRequest(Schema):
    name: str
    project: str = "default"
    base_model: str
    config: ModelConfig = Field(default_factory=ModelConfig)


class ModelInfo(Schema):
    name: str
    project: str
    base_model: str
    step: int
    config: ModelConfig


class StepInfo(Schema):
    step: int


class CheckpointInfo(Schema):
    step: int
    path: str
    created_at: float


# The metric ART's `delete_checkpoints()` keeps the best step by; `model.log(groups, split="val")` records it.
DEFAULT_BEST_METRIC = "val/reward"


class DeleteCheckpointsRequest(Schema):
    steps: list[int] | None = Field(
        None,
        description=(
            "Steps to delete. None (with no best_checkpoint_metric) keeps the latest, step 0 and, when history.jsonl "
            f"has {DEFAULT_BEST_METRIC!r} rows, the best step by it."
        ),
    )
    best_checkpoint_metric: str | None = Field(
        None,
        description=(
            "Keep only the latest step and the step whose history rows have the highest mean of this metric "
            "(ART's semantics: higher is better), deleting the rest. Refused when no kept checkpoint has the metric."
        ),
    )


class ForkRequest(Schema):
    """Start a model from another model's checkpoint (ART's `_experimental_fork_checkpoint`)."""

    from_model: str = Field(description="The model whose checkpoint is copied (same base model and LoRA shape).")
    from_project: str | None = Field(None, description="Its project; None: the forked model's own.")
    not_after_step: int | None = Field(
        None, ge=0, description="Copy its latest checkpoint at or before this step; None: its latest."
    )


class ForkResult(Schema):
    step: int = Field(description="The step the model now serves: the copied checkpoint keeps its step number.")
    forked_from: str = Field(description="`project/model@step` of the checkpoint copied.")


class LogRequest(Schema):
    """Evaluation groups recorded without training: a trajectories file and a history row for the split."""

    split: str = Field("val", description="A name such as val or test; the folder under trajectories/.")
    groups: list[TrajectoryGroup] = Field(default_factory=list)
    metrics: dict[str, float] = Field(
        default_factory=dict, description="Extra metrics for the row; a name without '/' is prefixed by the split."
    )
    step: int | None = Field(None, ge=0, description="The step the row is recorded at; None is the served step.")


class LogResult(Schema):
    step: int
    split: str
    metrics: Metrics
    path: str | None = Field(None, description="The trajectories file written, if groups were given.")


def split_metrics(groups: list[TrajectoryGroup], split: str, extra: dict[str, float] | None = None) -> dict[str, float]:
    """What `model.log` records for a split: `reward_stats` and the mean of each trajectory metric, as `<split>/...`.

    `{split}/reward` is the mean reward and `{split}/reward_std_dev` ART's name for the within-group std;
    `{split}/<name>` is the mean of each trajectory metric over the trajectories that have it.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for trajectory in (t for g in groups for t in g.trajectories):
        for name, value in trajectory.metrics.items():
            sums[name] = sums.get(name, 0.0) + float(value)
            counts[name] = counts.get(name, 0) + 1
    metrics = {f"{split}/{name}": sums[name] / counts[name] for name in sums}
    stats = reward_stats(groups)
    if "reward_mean" in stats:
        stats["reward"] = stats.pop("reward_mean")
        stats["reward_std_dev"] = stats["reward_std_within_group"]
    metrics.update({f"{split}/{name}": value for name, value in stats.items()})
    for name, value in (extra or {}).items():
        metrics[name if "/" in name else f"{split}/{name}"] = float(value)
    return {name: value for name, value in metrics.items() if math.isfinite(value)}


def reward_stats(groups: list[TrajectoryGroup]) -> dict[str, float]:
    """One definition, for train and log rows alike, of what a step's rewards looked like and what judging cost.

    `reward_std` spreads over all rewards, `reward_std_within_group` is the mean std inside groups of two or
    more (what GRPO learns from), `exception_rate` the share of rollouts that raised, `judge_cost_usd` the
    sum of RULER's per-trajectory cost shares (a group's shares sum to its cost), left out when a judged
    trajectory has no cost (LiteLLM had no price for its judge) rather than undercounted.
    """
    trajectories = [t for g in groups for t in g.trajectories]
    exceptions = sum(len(g.exceptions) for g in groups)
    stats = {"n": float(len(trajectories))}
    if trajectories or exceptions:
        stats["exception_rate"] = exceptions / (len(trajectories) + exceptions)
    if trajectories:
        rewards = [t.reward for t in trajectories]
        spreads = [_std(g.rewards()) for g in groups if len(g.trajectories) > 1]
        stats["reward_mean"] = sum(rewards) / len(rewards)
        stats["reward_std"] = _std(rewards)
        stats["reward_std_within_group"] = sum(spreads) / len(spreads) if spreads else 0.0
    judged = [t for t in trajectories if "ruler_score" in t.metrics or "ruler_cost_usd" in t.metrics]
    if judged and all("ruler_cost_usd" in t.metrics for t in judged):
        stats["judge_cost_usd"] = sum(float(t.metrics["ruler_cost_usd"]) for t in judged)
    return stats


def _std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


class TrainRequest(Schema):
    groups: list[TrajectoryGroup]
    config: TrainConfig = Field(default_factory=TrainConfig)
    metrics: dict[str, float] = Field(
        default_factory=dict,
        description="The caller's figures for the step's history row (the pipelined loop's `pipeline/...` waits).",
    )


class TrainResult(Schema):
    step: int = Field(description="The step now served.")
    skipped: bool = Field(
        False,
        description="No group had a reward spread, so nothing trained: no checkpoint, no history row, `step` unchanged.",
    )
    metrics: Metrics = Field(default_factory=dict)
    config: TrainConfig


class TrainEvent(Schema):
    """One NDJSON line of a train response."""

    type: Literal["progress", "result", "error"]
    done: int = 0
    total: int = 0
    metrics: Metrics = Field(default_factory=dict)
    result: TrainResult | None = None
    error: str | None = None


class TrainSFTRequest(Schema):
    """Demonstrations to imitate: each trajectory's assistant replies are the targets."""

    trajectories: list[Trajectory]
    config: TrainSFTConfig = Field(default_factory=TrainSFTConfig)


class TrainSFTResult(Schema):
    step: int = Field(description="The step now served (an SFT call always commits one).")
    metrics: Metrics = Field(default_factory=dict)
    config: TrainSFTConfig


class TrainSFTEvent(TrainEvent):
    """One NDJSON line of a train_sft response."""

    result: TrainSFTResult | None = None  # type: ignore[assignment]


class RolloutCall(Schema):
    """One model call the server answered for a rollout, in chat form whatever protocol it came in."""

    protocol: Literal["chat", "responses", "messages", "completions"]
    messages: list[dict[str, Any]]
    message: dict[str, Any]
    tools: list[dict[str, Any]] | None = None
    completion_id: str
    model: str
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    latency_s: float = 0.0
    started_at: float | None = None  # the server's clock, when the request was planned


class RolloutRecord(Schema):
    """What the server holds for a rollout id: the calls it answered (kept when asked for) and whether the
    rollout-scoped URL is open."""

    id: str
    completions: int
    open: bool = False
    calls: list[RolloutCall] = Field(default_factory=list)
