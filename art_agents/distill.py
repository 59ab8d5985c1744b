"""Distillation by rejection sampling: a teacher's rollouts scored by a reward function or RULER, the best kept,
then imitated by the student with `train_sft`.

    teacher = art.Model(name="gpt-4.1", inference_base_url=..., inference_api_key=...)  # any OpenAI endpoint
    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(rollout(teacher, s) for _ in range(4)) for s in scenarios),
        after_each=lambda group: ruler_score_group(group, "openai/o4-mini"),  # or rewards set in rollout()
    )
    await student.train_sft(keep_best(groups, min_reward=0.8), art.TrainSFTConfig(epochs=3))

The same rollout code runs for the teacher and the student (it takes a `Model`). The teacher's replies are not in
the student's token store, so the server tokenizes them with the student's chat template (`turns_retokenized`).

In RL another model's turns are context, not trained; `adopted` makes a teacher's rollout the student's to train in
a group beside the student's own rollouts (off-policy guidance: `art_agents.autorl.guidance`).
"""

from __future__ import annotations

from collections.abc import Iterable

from art_agents.trajectory import Trajectory, TrajectoryGroup, Turn


def keep_best(
    groups: Iterable[TrajectoryGroup], min_reward: float, *, per_group: int | None = None
) -> list[Trajectory]:
    """The trajectories rewarded at least `min_reward`, best first in each group (at most `per_group` of each);
    failed rollouts are dropped whatever their reward."""
    kept: list[Trajectory] = []
    for group in groups:
        good = sorted(
            (t for t in group.trajectories if not t.failed and t.reward >= min_reward), key=lambda t: -t.reward
        )
        kept += good[:per_group]
    return kept


def adopted(trajectory: Trajectory) -> Trajectory:
    """`trajectory` (a teacher's rollout) with its turns the student's: unnamed and without a completion id, so the
    server re-tokenizes them with the student's chat template and trains them, where a teacher's named turns would
    stay untrained context. Marked `metadata["teacher"]` so it can be told apart in a group."""
    turns = [Turn(history=turn.history, index=turn.index) for turn in trajectory.turns]
    return trajectory.model_copy(update={"turns": turns, "metadata": trajectory.metadata | {"teacher": True}})
