"""ART's `art.utils` helpers: `iterate_dataset` walks a dataset in shuffled batches over epochs;
`retry` calls a flaky function again with a growing delay. `art_agents.utils.sft` holds ART's SFT helpers.

The same batches and order as ART's: every epoch (the first too) is shuffled with the epoch number as
seed, batches hold `groups_per_step` items (the last of an epoch may hold fewer), `step` counts batches
over all epochs, and `initial_step` skips the batches before it so a resumed run picks up where it
stopped. One difference: ART reseeds Python's global `random` (`random.seed(epoch)`) as a side effect;
this uses a generator of its own, so the caller's random state is left alone. Another: the progress
bar follows `art_agents.progress` (drawn on a terminal, wiped when done).
"""

from __future__ import annotations

import math
import random
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from art_agents.progress import progress_bar
from art_agents.tasks import retry

T = TypeVar("T")


@dataclass
class DatasetBatch(Generic[T]):
    """One batch of `iterate_dataset`: its items, its step over all epochs, its epoch and its step in the epoch."""

    items: list[T]
    step: int
    epoch: int
    epoch_step: int


def iterate_dataset(
    dataset: Sequence[T],
    groups_per_step: int = 1,
    num_epochs: int = 1,
    initial_step: int = 0,
    use_tqdm: bool = True,
) -> Generator[DatasetBatch[T], None, None]:
    """Yield `DatasetBatch`es of `groups_per_step` items, epoch after epoch, from step `initial_step` on."""
    if groups_per_step < 1:
        raise ValueError(f"groups_per_step must be at least 1, got {groups_per_step}")
    if num_epochs < 0 or initial_step < 0:
        raise ValueError(f"num_epochs and initial_step must be >= 0, got {num_epochs} and {initial_step}")
    size = len(dataset)
    if size == 0:
        return
    steps_per_epoch = math.ceil(size / groups_per_step)
    total = steps_per_epoch * num_epochs
    bar = progress_bar("Iterating dataset", unit="batch", total=total, show=use_tqdm, initial=min(initial_step, total))
    try:
        for epoch in range(num_epochs):
            order = list(range(size))
            random.Random(epoch).shuffle(order)  # the permutation ART's random.seed(epoch); random.shuffle gives
            for epoch_step in range(steps_per_epoch):
                step = epoch * steps_per_epoch + epoch_step
                if step < initial_step:
                    continue
                start = epoch_step * groups_per_step
                items = [dataset[i] for i in order[start : start + groups_per_step]]
                yield DatasetBatch(items=items, step=step, epoch=epoch, epoch_step=epoch_step)
                bar.update(1)
    finally:
        bar.close()


__all__ = ["DatasetBatch", "iterate_dataset", "retry"]
