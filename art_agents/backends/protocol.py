"""The Backend Protocol: what a TrainableModel needs from wherever it lives.

`RemoteBackend` (`art_agents.backends.remote`) talks to an `art-agents serve` anywhere; `LocalBackend`
(`art_agents.backends.local`) starts one on this machine and talks to it the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from art_agents.backends.remote import RegisteredModel
    from art_agents.sft_config import TrainSFTConfig
    from art_agents.train_config import TrainConfig
    from art_agents.trajectory import Trajectory, TrajectoryGroup
    from art_agents.wire import CheckpointInfo, LogResult, ModelInfo, TrainResult, TrainSFTResult


@runtime_checkable
class Backend(Protocol):
    """What a TrainableModel needs from wherever it lives (`RemoteBackend` and `LocalBackend` are two)."""

    base_url: str
    api_key: str | None

    async def register(self, model: RegisteredModel) -> ModelInfo: ...
    async def get_step(self, model: RegisteredModel) -> int: ...
    async def train(
        self,
        model: RegisteredModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig | None = None,
        *,
        progress: bool = True,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
        metrics: Mapping[str, float] | None = None,
    ) -> TrainResult: ...
    async def train_sft(
        self,
        model: RegisteredModel,
        trajectories: list[Trajectory],
        config: TrainSFTConfig | None = None,
        *,
        progress: bool = True,
        verbose: bool = False,
    ) -> TrainSFTResult: ...
    async def log(
        self,
        model: RegisteredModel,
        groups: list[TrajectoryGroup],
        split: str = "val",
        *,
        metrics: dict[str, float] | None = None,
        step: int | None = None,
    ) -> LogResult: ...
    async def list_checkpoints(self, model: RegisteredModel) -> list[CheckpointInfo]: ...
    async def delete_checkpoints(
        self, model: RegisteredModel, steps: list[int] | None = None, *, best_checkpoint_metric: str | None = None
    ) -> list[int]: ...
    async def close(self) -> None: ...
