"""Run many rollouts at once with a progress bar, a failure budget and a per-group hook.

ART's keywords are accepted: `max_metrics` caps how many metric means the bar shows (reward first,
then trajectory metrics in the order first seen), `after_each` may return a list of groups (they all
join the result), and `pbar_total_completion_tokens` is a no-op (ART deprecated it; it only changed the bar).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterable

from art_agents.errors import TooManyExceptions
from art_agents.trajectory import RolloutException, Trajectory, TrajectoryGroup

AfterEach = Callable[[TrajectoryGroup], Awaitable[TrajectoryGroup | list[TrajectoryGroup] | None]]


def _exception_budget(max_exceptions: int | float, total: int) -> int:
    """`max_exceptions` as a count (int) or a fraction of all rollouts (float in [0, 1))."""
    if isinstance(max_exceptions, bool) or max_exceptions < 0:
        raise ValueError(f"max_exceptions must be a count >= 0 or a fraction in [0, 1); got {max_exceptions!r}")
    if isinstance(max_exceptions, float) and max_exceptions < 1:
        return math.floor(max_exceptions * total)
    return int(max_exceptions)


class _Progress:
    def __init__(self, total: int, desc: str | None, max_metrics: int | None = None) -> None:
        from tqdm import tqdm  # text bars: tqdm.auto widgets show blank or stuck at 0% in stored notebooks

        self.bar = tqdm(total=total, desc=desc, unit="rollout", disable=desc is None)
        self.max_metrics = max_metrics
        self.sums: dict[str, float] = {"reward": 0.0}
        self.counts: dict[str, int] = {"reward": 0}
        self.exceptions = 0

    def update(self, group: TrajectoryGroup, rollouts: int) -> None:
        for trajectory in group.trajectories:
            for name, value in {"reward": trajectory.reward, **trajectory.metrics}.items():
                self.sums[name] = self.sums.get(name, 0.0) + float(value)
                self.counts[name] = self.counts.get(name, 0) + 1
        self.exceptions += len(group.exceptions)
        names = list(self.sums)[: self.max_metrics]
        shown = {n: f"{self.sums[n] / self.counts[n]:.3f}" if self.counts[n] else "nan" for n in names}
        self.bar.set_postfix({**shown, "exceptions": self.exceptions}, refresh=False)
        self.bar.update(rollouts)

    def close(self) -> None:
        self.bar.close()


async def gather_trajectory_groups(
    groups: Iterable[TrajectoryGroup | Awaitable[TrajectoryGroup]],
    *,
    pbar_desc: str | None = "gather",
    pbar_total_completion_tokens: bool = False,
    max_exceptions: int | float = 0,
    max_metrics: int | None = None,
    after_each: AfterEach | None = None,
) -> list[TrajectoryGroup]:
    """Finish every group concurrently; failed rollouts are counted, not fatal, up to a budget.

    `after_each` runs on each finished group (scoring it with RULER, say) and may return a
    replacement, a list of groups, or None to drop the group. Groups keep their input order.
    `pbar_desc=None` hides the progress bar; `max_metrics` caps the metric means it shows.
    `pbar_total_completion_tokens` is accepted for ART code and does nothing.
    """
    if max_metrics is not None and max_metrics < 0:
        raise ValueError(f"max_metrics must be None or >= 0, got {max_metrics}")
    given = list(groups)
    try:
        groups = list(await asyncio.gather(*(_as_group(g) for g in given)))
    except BaseException:
        for group in given:
            if isinstance(group, TrajectoryGroup):
                group.discard_pending()
        raise
    total = sum(len(g.trajectories) + g.pending for g in groups)
    budget = _exception_budget(max_exceptions, total)
    progress = _Progress(total, pbar_desc, max_metrics)

    async def finish(group: TrajectoryGroup) -> TrajectoryGroup | list[TrajectoryGroup] | None:
        rollouts = len(group.trajectories) + group.pending
        group = await group
        progress.update(group, rollouts)
        if progress.exceptions > budget:
            first = next(iter(group.exceptions), None)
            raise TooManyExceptions(
                f"{progress.exceptions} rollouts raised, more than max_exceptions={max_exceptions!r} allows "
                f"(of {total}); first: {first.type + ': ' + first.message if first else 'see earlier groups'}. "
                "Fix the rollout, or raise max_exceptions to tolerate failures"
            )
        return await after_each(group) if after_each is not None else group

    tasks = [asyncio.ensure_future(finish(g)) for g in groups]
    try:
        finished = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:  # over budget (or cancelled): stop the other rollouts instead of orphaning them
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for group in groups:
            group.discard_pending()
        raise
    finally:
        progress.close()
    return [g for item in finished if item is not None for g in (item if isinstance(item, list) else [item])]


async def _as_group(group: TrajectoryGroup | Awaitable[TrajectoryGroup]) -> TrajectoryGroup:
    return group if isinstance(group, TrajectoryGroup) else await group


async def gather_trajectories(
    trajectories: Iterable[Awaitable[Trajectory]],
    *,
    pbar_desc: str | None = "gather",
    pbar_total_completion_tokens: bool = False,
    max_exceptions: int | float = 0,
    max_metrics: int | None = None,
) -> list[Trajectory | RolloutException]:
    """Run ungrouped rollouts concurrently; failures come back in place as RolloutException.

    Each awaitable must give one Trajectory (ART also takes awaitables of lists of trajectories; here
    such a rollout counts as failed, naming the type it returned).
    """
    groups = [TrajectoryGroup([t]) for t in trajectories]
    finished = await gather_trajectory_groups(
        groups, pbar_desc=pbar_desc, max_exceptions=max_exceptions, max_metrics=max_metrics
    )
    return [(g.trajectories or g.exceptions)[0] for g in finished]
