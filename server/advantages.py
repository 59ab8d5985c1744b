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


def group_advantages(groups: list[TrajectoryGroup], *, scale_rewards: bool, min_group_std: float) -> GroupAdvantages:
    """A = r - mean(group), divided by the group's std when `scale_rewards` (GRPO) and left as is otherwise (Dr. GRPO).

    The std is the population std (ddof=0), defined for any group size. A group whose std is at or
    below `min_group_std` carries no learning signal (every advantage would be ~0), so it is skipped
    and counted instead of being trained on as noise.
    """
    result = GroupAdvantages()
    for g, group in enumerate(groups):
        rewards = group.rewards()
        if not rewards:
            result.skipped.append(g)
            continue
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        if std <= min_group_std:
            result.skipped.append(g)
            continue
        result.kept.add(g)
        for t, reward in enumerate(rewards):
            result.values[(g, t)] = (reward - mean) / std if scale_rewards else reward - mean
    return result
