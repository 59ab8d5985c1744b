"""Checkpoints and history of a model folder, written so a crash never leaves half a step on disk.

Layout: <model_dir>/checkpoints/<step:04d>/ holds the PEFT adapter (save_pretrained), optimizer.pt
and trainer_state.json. A checkpoint is written into checkpoints/.tmp-<step>-<pid>/ and renamed into
place, so a step folder either exists complete or not at all; `latest_step` ignores the temp folders.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from art_agents.atomic import append_line
from art_agents.server.host.processes import is_alive
from art_agents.wire import CheckpointInfo

TRAINER_STATE = "trainer_state.json"
OPTIMIZER_STATE = "optimizer.pt"


def checkpoint_path(model_dir: str | Path, step: int) -> Path:
    return Path(model_dir) / "checkpoints" / f"{step:04d}"


def save_checkpoint(
    model_dir: str | Path, step: int, peft_model: Any, optimizer_state: dict | None, trainer_state: dict
) -> Path:
    """Write checkpoint `step` atomically (temp folder + rename) and return its folder.

    An existing step is never replaced (`CheckpointExists`): a step folder, once written, is what was
    served at that step. `created_at` is added to the trainer state.
    """
    import torch

    def write(tmp: Path) -> None:
        # only the trained adapter: older checkpoints loaded for serving are not part of it
        peft_model.save_pretrained(str(tmp), save_embedding_layers=False, selected_adapters=["default"])
        if optimizer_state:
            torch.save(optimizer_state, tmp / OPTIMIZER_STATE)

    return _write_step(model_dir, step, write, trainer_state)


def copy_checkpoint(source: Path, model_dir: str | Path, step: int, trainer_state: dict) -> Path:
    """Checkpoint folder `source` (another model's) written as step `step` of this model, as atomically; its
    trainer state gains `trainer_state`."""
    state = {**json.loads((source / TRAINER_STATE).read_text(encoding="utf-8")), **trainer_state}
    return _write_step(model_dir, step, lambda tmp: shutil.copytree(source, tmp, dirs_exist_ok=True), state)


def _write_step(model_dir: str | Path, step: int, write: Callable[[Path], Any], trainer_state: dict) -> Path:
    """`write` fills a temp folder, which gets the trainer state and is renamed to step `step`'s folder."""
    final = checkpoint_path(model_dir, step)
    refuse_existing(final)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(root)
    tmp = root / f".tmp-{step}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        write(tmp)
        state = {**trainer_state, "step": step, "created_at": time.time()}
        (tmp / TRAINER_STATE).write_text(json.dumps(state, indent=2, default=str) + "\n", encoding="utf-8")
        _fsync_tree(tmp)
        refuse_existing(final)
        os.rename(tmp, final)  # fails too if a non-empty folder appeared since the check
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


class CheckpointExists(FileExistsError):
    """The step was already written (by another process): it is left as it is."""


def refuse_existing(final: Path) -> None:
    """`CheckpointExists` if the step folder `final` is already there."""
    if final.exists():
        raise CheckpointExists(
            f"checkpoint {final} already exists and is never overwritten; another process is writing this model "
            "folder: stop it, then restart this server to serve its latest step"
        )


def _steps(model_dir: str | Path) -> list[int]:
    root = Path(model_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit())


def latest_step(model_dir: str | Path) -> int | None:
    """The newest complete checkpoint's step (temp folders of interrupted saves are ignored)."""
    steps = _steps(model_dir)
    return steps[-1] if steps else None


def list_checkpoints(model_dir: str | Path) -> list[CheckpointInfo]:
    infos = []
    for step in _steps(model_dir):
        path = checkpoint_path(model_dir, step)
        try:
            created_at = float(json.loads((path / TRAINER_STATE).read_text(encoding="utf-8"))["created_at"])
        except (OSError, ValueError, KeyError):
            created_at = path.stat().st_mtime
        infos.append(CheckpointInfo(step=step, path=str(path), created_at=created_at))
    return infos


def delete_checkpoints(model_dir: str | Path, steps: list[int] | None = None) -> list[int]:
    """Delete the given steps (None: all but step 0 and the latest); the latest is never deleted."""
    existing = _steps(model_dir)
    if not existing:
        return []
    latest = existing[-1]
    doomed = (
        [s for s in existing if s not in (0, latest)] if steps is None else [s for s in existing if s in set(steps)]
    )
    deleted = []
    for step in doomed:
        if step == latest:
            continue
        _remove(model_dir, step)
        deleted.append(step)
    return deleted


def delete_all_but(model_dir: str | Path, keep: set[int]) -> list[int]:
    """Delete every checkpoint whose step is not in `keep`; the latest is never deleted."""
    existing = _steps(model_dir)
    doomed = [s for s in existing[:-1] if s not in keep]
    for step in doomed:
        _remove(model_dir, step)
    return doomed


def metric_of(row: dict[str, Any], metric: str) -> float | None:
    """A history row's value of `metric`: under `metrics` (this server's rows) or at the top (ART's flat rows)."""
    metrics = row.get("metrics")
    value = metrics.get(metric) if isinstance(metrics, dict) else None
    if value is None:
        value = row.get(metric)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return float(value)


def best_step(rows: list[dict[str, Any]], metric: str, among: list[int]) -> int | None:
    """The step of `among` whose rows have the highest mean `metric` (the later step on a tie); None if none has it.

    Higher is better, as in ART, whatever the metric: record a loss negated to keep its lowest step.
    """
    values: dict[int, list[float]] = {}
    for row in rows:
        value, step = metric_of(row, metric), row.get("step")
        if value is not None and isinstance(step, int) and step in among:
            values.setdefault(step, []).append(value)
    if not values:
        return None
    return max(values, key=lambda step: (sum(values[step]) / len(values[step]), step))


def metric_names(rows: list[dict[str, Any]]) -> list[str]:
    """Every numeric metric name the rows carry, for naming the choices in an error."""
    names = {name for row in rows if isinstance(row.get("metrics"), dict) for name in row["metrics"]}
    return sorted(name for name in names if any(metric_of(row, name) is not None for row in rows))


def discard_checkpoint(model_dir: str | Path, step: int) -> None:
    """Remove checkpoint `step` if it exists, even the latest: undoes a save whose step was never served."""
    if checkpoint_path(model_dir, step).is_dir():
        _remove(model_dir, step)


def _remove(model_dir: str | Path, step: int) -> None:
    """Rename the step folder away first, so a crash mid-delete never leaves a half checkpoint that looks complete."""
    path = checkpoint_path(model_dir, step)
    trash = path.parent / f".tmp-delete-{step}-{os.getpid()}"
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def load_optimizer_state(model_dir: str | Path, step: int) -> dict | None:
    """The AdamW state saved with checkpoint `step`, or None (step 0, or saved without one)."""
    import torch

    path = checkpoint_path(model_dir, step) / OPTIMIZER_STATE
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def append_history(model_dir: str | Path, row: dict) -> None:
    """Add one row to history.jsonl (appended, fsynced; a torn last line from a crash is dropped)."""
    append_line(Path(model_dir) / "history.jsonl", json.dumps(row, default=str))


def _remove_stale_temps(root: Path) -> None:
    """Drop temp folders left by processes that died mid-save (a kill -9 during a checkpoint)."""
    for path in root.glob(".tmp-*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not is_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
