"""Bodies of the versioned JSON routes, shared by the client and the server."""

from __future__ import annotations

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


class DeleteCheckpointsRequest(Schema):
    steps: list[int] | None = Field(None, description="Steps to delete; None keeps only the latest (and step 0).")


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
