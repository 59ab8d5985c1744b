"""Bodies of the versioned JSON routes, shared by the client and the server."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from art_agents.schema import Schema
from art_agents.train_config import ModelConfig, TrainConfig
from art_agents.trajectory import TrajectoryGroup

API_PREFIX = "/v1/art"


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
    metrics: dict[str, float]
    path: str | None = Field(None, description="The trajectories file written, if groups were given.")


def split_metrics(groups: list[TrajectoryGroup], split: str, extra: dict[str, float] | None = None) -> dict[str, float]:
    """What `model.log` records for a split: reward mean and spread, counts, exception rate, metric means.

    `{split}/reward` is the mean reward, `{split}/reward_std` the std of all rewards, `{split}/reward_std_dev`
    the mean within-group std (ART's name), `{split}/n` the trajectories, `{split}/exception_rate` the share of
    rollouts that raised, and `{split}/<name>` the mean of each trajectory metric over the trajectories that have it.
    """
    rewards = [t.reward for g in groups for t in g.trajectories]
    exceptions = sum(len(g.exceptions) for g in groups)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for trajectory in (t for g in groups for t in g.trajectories):
        for name, value in trajectory.metrics.items():
            sums[name] = sums.get(name, 0.0) + float(value)
            counts[name] = counts.get(name, 0) + 1
    metrics = {f"{split}/{name}": sums[name] / counts[name] for name in sums}
    metrics[f"{split}/n"] = float(len(rewards))
    if rewards or exceptions:
        metrics[f"{split}/exception_rate"] = exceptions / (len(rewards) + exceptions)
    if rewards:
        metrics[f"{split}/reward"] = sum(rewards) / len(rewards)
        metrics[f"{split}/reward_std"] = _std(rewards)
        spreads = [_std(g.rewards()) for g in groups if len(g.trajectories) > 1]
        metrics[f"{split}/reward_std_dev"] = sum(spreads) / len(spreads) if spreads else 0.0
    for name, value in (extra or {}).items():
        metrics[name if "/" in name else f"{split}/{name}"] = float(value)
    return {name: value for name, value in metrics.items() if math.isfinite(value)}


def _std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


class TrainRequest(Schema):
    groups: list[TrajectoryGroup]
    config: TrainConfig = Field(default_factory=TrainConfig)


class TrainResult(Schema):
    step: int = Field(description="The step now served.")
    metrics: dict[str, float] = Field(default_factory=dict)
    config: TrainConfig


class TrainEvent(Schema):
    """One NDJSON line of a train response."""

    type: Literal["progress", "result", "error"]
    done: int = 0
    total: int = 0
    metrics: dict[str, float] = Field(default_factory=dict)
    result: TrainResult | None = None
    error: str | None = None
