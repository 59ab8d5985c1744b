"""Run many rollouts at once with a progress bar, a failure budget and a per-group hook.

ART's keywords are accepted: `max_metrics` caps how many metric means the bar shows (reward first,
then trajectory metrics in the order first seen), `after_each` may return a list of groups (they all
join the result), and `pbar_total_completion_tokens` is a no-op (ART deprecated it; it only changed the bar).
Like ART's, a gather has no timeout of its own: wrap it in `asyncio.timeout(...)` (see docs/loop.md).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable

from art_agents.errors import TooManyExceptions
from art_agents.progress import progress_bar
from art_agents.tasks import close_unstarted, gather_or_cancel
from art_agents.trajectory import RolloutException, Trajectory, TrajectoryGroup

AfterEach = Callable[[TrajectoryGroup], Awaitable[TrajectoryGroup | list[TrajectoryGroup] | None]]


def _exception_budget(max_exceptions: int | float, total: int) -> int:
    """`max_exceptions` as a count (int) or a fraction of all rollouts (float in [0, 1))."""
    if isinstance(max_exceptions, bool) or max_exceptions < 0:
        raise ValueError(f"max_exceptions must be a count >= 0 or a fraction in [0, 1); got {max_exceptions!r}")
    if isinstance(max_exceptions, float) and max_exceptions < 1:
        return math.floor(max_exceptions * total)
    return int(max_exceptions)


class _OverBudget(Exception):
    """Raised inside the gather; its TooManyExceptions is built once the other rollouts have stopped."""


class _Progress:
    """The counts behind the bar, which the TooManyExceptions message repeats, so the two always agree."""

    def __init__(self, total: int, desc: str | None, max_metrics: int | None = None) -> None:
        self.bar = progress_bar(desc or "", unit="rollout", total=total, show=desc not in (None, False))
        self.total = total
        self.max_metrics = max_metrics
        self.sums: dict[str, float] = {"reward": 0.0}
        self.counts: dict[str, int] = {"reward": 0}
        self.finished = 0
        self.exceptions: list[RolloutException] = []

    def count(self, group: TrajectoryGroup) -> None:
        """Count a finished group's rollouts and failures (before `after_each`, so the budget stops early)."""
        self.finished += len(group.trajectories) + len(group.exceptions)
        self.exceptions += group.exceptions

    def show(self, scored: list[TrajectoryGroup], rollouts: int) -> None:
        """Move the bar on, with the means of the groups as `after_each` gave them back (scored, say)."""
        for trajectory in (t for group in scored for t in group.trajectories):
            for name, value in {"reward": trajectory.reward, **trajectory.metrics}.items():
                self.sums[name] = self.sums.get(name, 0.0) + float(value)
                self.counts[name] = self.counts.get(name, 0) + 1
        names = list(self.sums)[: self.max_metrics]
        shown = {n: f"{self.sums[n] / self.counts[n]:.3f}" if self.counts[n] else "nan" for n in names}
        self.bar.set_postfix({**shown, "exceptions": len(self.exceptions)}, refresh=False)
        self.bar.update(rollouts)

    def over_budget(self, max_exceptions: int | float) -> TooManyExceptions:
        first = self.exceptions[0]
        advice = (
            "no rollout succeeded, so raising max_exceptions would not help: fix that error"
            if len(self.exceptions) == self.finished
            else "fix the rollout, or raise max_exceptions to tolerate occasional failures"
        )
        return TooManyExceptions(
            f"{len(self.exceptions)} of {self.finished} finished rollouts raised ({self.total} in all), more than "
            f"max_exceptions={max_exceptions!r} allows; first: {first.type}: {first.message}; {advice}"
        )


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

    An error every rollout would hit (model not registered, server down, unknown model, missing
    dependency: see `art_agents.fatal`) is raised at once instead, and the other rollouts are cancelled.
    `after_each` runs on each finished group (scoring it with RULER, say) and may return a
    replacement, a list of groups, or None to drop the group. Groups keep their input order.
    `pbar_desc=None` hides the progress bar (see `art_agents.progress` for when it shows);
    `max_metrics` caps the metric means it shows. `pbar_total_completion_tokens` is accepted for ART code
    and does nothing.
    """
    given = list(groups)
    groups = [g for g in given if isinstance(g, TrajectoryGroup)]
    try:
        if max_metrics is not None and max_metrics < 0:
            raise ValueError(f"max_metrics must be None or >= 0, got {max_metrics}")
        awaited = iter(await gather_or_cancel(g for g in given if not isinstance(g, TrajectoryGroup)))
        groups = [g if isinstance(g, TrajectoryGroup) else next(awaited) for g in given]
        total = sum(len(g.trajectories) + g.pending for g in groups)
        budget = _exception_budget(max_exceptions, total)
        progress = _Progress(total, pbar_desc, max_metrics)

        async def finish(group: TrajectoryGroup) -> list[TrajectoryGroup]:
            group = await group
            progress.count(group)
            if len(progress.exceptions) > budget:
                raise _OverBudget
            result = await after_each(group) if after_each is not None else group
            scored = [] if result is None else result if isinstance(result, list) else [result]
            progress.show(scored, len(group.trajectories) + len(group.exceptions))
            return scored

        try:
            finished = await gather_or_cancel(finish(g) for g in groups)
        except _OverBudget:
            raise progress.over_budget(max_exceptions) from None
        finally:
            progress.bar.close()
    finally:  # stopped early (bad argument, over budget, cancelled): close the rollouts that never started
        close_unstarted(given)
        for group in groups:
            group.discard_pending()
    return [group for scored in finished for group in scored]


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
