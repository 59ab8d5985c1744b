"""art-agents: train LLM agents with reinforcement learning on their own experience."""

import os

# ART's import paths (`art.dev`, `art.local`, `art.langgraph`, `art.rewards`, `art.utils`) are modules of
# art_agents/art/, which holds all of ART compatibility. With that folder on this package's path they import as
# `art_agents.local` and so on: one file each, in one place, with no twin module left in the core.
__path__.append(os.path.join(os.path.dirname(__file__), "art"))

# ruff: noqa: E402 - the imports below need the path above
from art_agents import dev, local, utils  # ART's `art.dev`, `art.local`, `art.utils`, reachable as attributes too
from art_agents.backends import Backend, LocalBackend, RemoteBackend
from art_agents.capture import current_trajectory, record_completion, record_tool_call, rollout, span
from art_agents.errors import ArtError, ServerError, SetupError, TooManyExceptions
from art_agents.evaluation import Evaluation, evaluate
from art_agents.gather import gather_trajectories, gather_trajectory_groups
from art_agents.jsonl import read_groups, write_groups
from art_agents.loop import StepRecord, train_loop
from art_agents.messages import ChatMessage
from art_agents.model import Model, TrainableModel
from art_agents.sft_config import TrainSFTConfig
from art_agents.tasks import retry
from art_agents.train_config import ModelConfig, TrainConfig
from art_agents.trajectory import (
    History,
    RolloutException,
    RolloutFailed,
    ToolCallRecord,
    Trajectory,
    TrajectoryGroup,
    Turn,
)
from art_agents.wire import TrainResult

__version__ = "0.1.0"

__all__ = [
    "ArtError",
    "Backend",
    "ChatMessage",
    "Evaluation",
    "History",
    "LocalBackend",
    "Model",
    "ModelConfig",
    "RemoteBackend",
    "RolloutException",
    "RolloutFailed",
    "ServerError",
    "SetupError",
    "StepRecord",
    "TooManyExceptions",
    "ToolCallRecord",
    "TrainConfig",
    "TrainResult",
    "TrainSFTConfig",
    "TrainableModel",
    "Trajectory",
    "TrajectoryGroup",
    "Turn",
    "__version__",
    "current_trajectory",
    "dev",
    "evaluate",
    "gather_trajectories",
    "gather_trajectory_groups",
    "local",
    "read_groups",
    "record_completion",
    "record_tool_call",
    "retry",
    "rollout",
    "span",
    "train_loop",
    "utils",
    "write_groups",
]
