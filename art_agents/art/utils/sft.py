"""ART's `art.utils.sft` helpers: demonstrations from a JSONL file, learning-rate schedules, and chunks of a
dataset for several `model.train_sft` calls, with ART's names, arguments and batch order.

A file holds one OpenAI-format conversation per line: `{"messages": [...], "tools": [...]}` (tools optional).
Unlike ART, an empty file and a malformed line are errors naming the file and line, not silently skipped.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

from art_agents.progress import progress_bar
from art_agents.sft_config import TrainSFTConfig
from art_agents.trajectory import Trajectory

if TYPE_CHECKING:
    from art_agents.model import TrainableModel

Schedule = Literal["cosine", "linear", "constant"]


class SFTChunk(NamedTuple):
    """One `train_sft` call's worth of `create_sft_dataset_iterator`: its trajectories and its slice of the schedule."""

    trajectories: list[Trajectory]
    config: TrainSFTConfig
    step: int
    epoch: int
    epoch_step: int


def create_lr_schedule(
    total_steps: int, peak_lr: float, method: Schedule = "linear", warmup_steps: int = 0, min_lr: float = 0.0
) -> list[float]:
    """One learning rate per step: a linear ramp over `warmup_steps` (the first step already above `min_lr`),
    then from `peak_lr` down to `min_lr` by `method` (constant stays at `peak_lr`)."""
    if method not in ("cosine", "linear", "constant"):
        raise ValueError(f"unknown schedule method {method!r}; use 'cosine', 'linear' or 'constant'")
    decay = total_steps - warmup_steps
    rates = []
    for step in range(max(total_steps, 0)):
        if step < warmup_steps:
            rates.append(min_lr + (peak_lr - min_lr) * (step + 1) / warmup_steps)
            continue
        progress = (step - warmup_steps) / (decay - 1) if decay > 1 else 0.0
        if method == "cosine":
            rates.append(min_lr + (peak_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress)))
        elif method == "linear":
            rates.append(peak_lr - (peak_lr - min_lr) * progress)
        else:
            rates.append(peak_lr)
    return rates


def create_sft_dataset_iterator(
    trajectories: Sequence[Trajectory],
    chunk_size: int = 10,
    epochs: int = 1,
    batch_size: int = 2,
    peak_lr: float = 2e-4,
    schedule_type: Schedule = "linear",
    warmup_ratio: float = 0.1,
    shuffle: bool = True,
    seed: int = 42,
    initial_step: int = 0,
    show_progress: bool = True,
) -> Generator[SFTChunk, None, None]:
    """Chunks of `chunk_size` batches for one `train_sft` call each; the schedule spans the whole run, so warmup
    and decay carry across calls. Epoch e is shuffled with `seed + e`; `initial_step` (in batches) resumes."""
    if chunk_size < 1 or batch_size < 1:
        raise ValueError(f"chunk_size and batch_size must be at least 1, got {chunk_size} and {batch_size}")
    size = len(trajectories)
    if size == 0:
        return
    per_epoch = math.ceil(size / batch_size)
    schedule = create_lr_schedule(per_epoch * epochs, peak_lr, schedule_type, int(per_epoch * epochs * warmup_ratio))
    per_chunk = batch_size * chunk_size
    chunks_per_epoch = math.ceil(size / per_chunk)
    bar = progress_bar("SFT", unit="step", total=len(schedule), show=show_progress, initial=initial_step)
    try:
        for epoch in range(epochs):
            order = list(trajectories)
            if shuffle:
                random.Random(seed + epoch).shuffle(order)
            for chunk in range(chunks_per_epoch):
                if epoch * chunks_per_epoch + chunk < initial_step // chunk_size:
                    continue
                items = order[chunk * per_chunk : (chunk + 1) * per_chunk]
                epoch_step = chunk * chunk_size
                step = epoch * per_epoch + epoch_step
                batches = math.ceil(len(items) / batch_size)
                config = TrainSFTConfig(learning_rate=schedule[step : step + batches], batch_size=batch_size)
                yield SFTChunk(items, config, step, epoch, epoch_step)
                bar.update(batches)
    finally:
        bar.close()


def iterate_file(
    file_path: str | Path, epochs: int = 1, shuffle_buffer_size: int = 10000, seed: int = 42, initial_skip: int = 0
) -> Generator[Trajectory, None, None]:
    """Stream the file's conversations as trajectories, `epochs` times, shuffled through a buffer of
    `shuffle_buffer_size` (seed `seed + epoch`), skipping the first `initial_skip` (to resume)."""
    path = Path(file_path)
    if path.suffix != ".jsonl":
        raise ValueError(f"{path}: only JSONL files are supported; write one conversation per line to a .jsonl file")
    yield from itertools.islice(_shuffled(path, epochs, shuffle_buffer_size, seed), initial_skip, None)


def _shuffled(path: Path, epochs: int, buffer_size: int, seed: int) -> Generator[Trajectory, None, None]:
    for epoch in range(epochs):
        rng = random.Random(seed + epoch)
        buffer: list[Trajectory] = []
        for trajectory in _conversations(path):
            buffer.append(trajectory)
            if len(buffer) >= buffer_size:
                yield buffer.pop(rng.randrange(len(buffer)))
        rng.shuffle(buffer)
        yield from buffer


def _conversations(path: Path) -> Generator[Trajectory, None, None]:
    """The file's lines as trajectories; a malformed line or an empty file is a ValueError naming the fix."""
    found = False
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                trajectory = Trajectory(messages_and_choices=row["messages"], tools=row.get("tools"))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"{path}:{number}: not a conversation ({type(exc).__name__}: {exc}); each line must be a JSON "
                    'object {"messages": [...], "tools": [...]} with OpenAI-format messages'
                ) from exc
            found = True
            yield trajectory
    if not found:
        raise _empty(path)


def _empty(path: str | Path) -> ValueError:
    return ValueError(f"{path} holds no conversations; write one JSON conversation per line to train on")


def get_file_row_count(file_path: str | Path) -> int:
    """The number of non-empty lines of a JSONL file."""
    with open(file_path, encoding="utf-8") as handle:
        return sum(1 for line in handle if line.strip())


async def train_sft_from_file(
    model: TrainableModel,
    file_path: str | Path,
    epochs: int = 1,
    batch_size: int = 2,
    peak_lr: float = 2e-4,
    schedule_type: Schedule = "linear",
    warmup_ratio: float = 0.1,
    initial_step: int = 0,
    final_step: int | None = None,
    verbose: bool = False,
    shuffle_buffer_size: int = 10000,
) -> None:
    """One `train_sft` call on the file's conversations over `epochs`, batches `initial_step` to `final_step` of
    a schedule spanning the whole file (so a run can be split into segments with evaluations between them)."""
    rows = get_file_row_count(file_path)
    if not rows:
        raise _empty(file_path)
    total = math.ceil(rows * epochs / batch_size)
    schedule = create_lr_schedule(total, peak_lr, schedule_type, int(total * warmup_ratio))[initial_step:final_step]
    if not schedule:
        return
    stream = iterate_file(file_path, epochs, shuffle_buffer_size, initial_skip=initial_step * batch_size)
    trajectories = [t for _, t in zip(range(len(schedule) * batch_size), stream, strict=False)]
    config = TrainSFTConfig(learning_rate=schedule[: math.ceil(len(trajectories) / batch_size)], batch_size=batch_size)
    await model.train_sft(trajectories, config, verbose=verbose)


__all__ = [
    "SFTChunk",
    "create_lr_schedule",
    "create_sft_dataset_iterator",
    "get_file_row_count",
    "iterate_file",
    "train_sft_from_file",
]
