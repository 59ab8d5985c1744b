"""Group-relative advantages: each rollout is scored against the other attempts at the same task."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from art_agents.trajectory import TrajectoryGroup


@dataclass
class GroupAdvantages:
    """Advantage per (group, trajectory) of the groups that train, and the groups skipped."""

    values: dict[tuple[int, int], float] = field(default_factory=dict)
    kept: set[int] = field(default_factory=set)
    skipped: list[int] = field(default_factory=list)


STD_EPSILON = 1e-4  # TRL's: reward differences far below it do not become +-1 advantages


def group_advantages(groups: list[TrajectoryGroup], *, scale_rewards: bool, min_group_std: float) -> GroupAdvantages:
    """A = r - mean(group), divided by (std + 1e-4) when `scale_rewards` (GRPO), left as is otherwise (Dr. GRPO).

    As TRL: the std is the sample std (n - 1), and the epsilon keeps tiny reward differences small.
    A group whose std is at or below `min_group_std` (or of one rollout) carries no learning signal,
    so it is skipped and counted instead of being trained on as noise.
    """
    result = GroupAdvantages()
    for g, group in enumerate(groups):
        rewards = group.rewards()
        if not rewards:
            result.skipped.append(g)
            continue
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) if len(rewards) > 1 else 0.0
        if std <= min_group_std:
            result.skipped.append(g)
            continue
        result.kept.add(g)
        for t, reward in enumerate(rewards):
            result.values[(g, t)] = (reward - mean) / (std + STD_EPSILON) if scale_rewards else reward - mean
    return result
