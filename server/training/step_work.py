"""What one train call asks of a trainer, in a form another process can receive (it pickles), and the
trainer interface the server drives: the policy trainer in the server's process, or its trainer processes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from art_agents.server.training.sequences import Policy
    from art_agents.sft_config import TrainSFTConfig
    from art_agents.train_config import TrainConfig
    from art_agents.trajectory import Trajectory, TrajectoryGroup

Progress = Callable[[int, int, dict[str, float]], None]


@dataclass(frozen=True)
class StepWork:
    """An RL step on `groups`, or an SFT call on their trajectories, of `policy` at its current step; `checkpoints`
    are the adapter folders of the other steps the config scores with (a KL reference, a teacher)."""

    kind: Literal["rl", "sft"]
    config: TrainConfig | TrainSFTConfig
    policy: Policy
    groups: list[TrajectoryGroup]
    checkpoints: dict[int, str] = field(default_factory=dict)

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for group in self.groups for t in group.trajectories]


class StepTrainer(Protocol):
    """Trains the policy of a served model for one call, from the optimizer state of the step it starts at."""

    def run(self, work: StepWork, progress: Progress | None) -> dict[str, float]:
        """Train; afterwards the served model's policy holds the new weights. Returns the call's metrics."""
        ...

    def optimizer_state(self) -> dict:
        """The AdamW state to checkpoint with those weights."""
        ...
