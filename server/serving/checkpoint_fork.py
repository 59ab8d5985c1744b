"""A model started from another model's checkpoint (ART's `_experimental_fork_checkpoint`).

The checkpoint folder (adapter and optimizer state) is copied into the model's own folder under the same step
number, as ART does, and served from there: the model goes on training from it as if it had trained those
steps itself. Only a checkpoint of the same base model and LoRA shape is taken, and only into a model that has
no checkpoint at or after that step, so no step of its own lineage is ever replaced.
"""

from __future__ import annotations

import time
from pathlib import Path

from art_agents.server.errors import ServiceError
from art_agents.server.serving.served_model import ServedModel
from art_agents.server.storage import checkpoints
from art_agents.wire import ForkRequest, ForkResult, RegisterRequest

_SAME = ("lora_rank", "lora_alpha", "target_modules")  # what makes two adapters mean the same


def fork_checkpoint(served: ServedModel, request: ForkRequest, source_dir: Path) -> ForkResult:
    """Copy the chosen checkpoint of the model in `source_dir` into `served` and serve it (call it paused)."""
    project = request.from_project or served.info.project
    label = f"{project}/{request.from_model}"
    step = _pick(source_dir, label, request.not_after_step)
    _check_compatible(served, source_dir, label)
    if step <= served.step:
        raise ServiceError(
            409,
            f"model {served.info.name!r} already serves step {served.step}, so step {step} of {label} cannot be "
            "forked into it (a model's steps are never replaced); fork into a newly registered model",
        )
    forked_from = f"{label}@{step}"
    path = checkpoints.copy_checkpoint(
        checkpoints.checkpoint_path(source_dir, step), served.model_dir, step, {"forked_from": forked_from}
    )
    try:
        served.policy.load_checkpoint(path)
        served.engine.load_adapter(path)
    except Exception as exc:
        checkpoints.discard_checkpoint(served.model_dir, step)
        previous = checkpoints.checkpoint_path(served.model_dir, served.step)
        served.policy.load_checkpoint(previous)
        served.engine.load_adapter(previous)
        raise ServiceError(400, f"checkpoint {forked_from} could not be loaded ({type(exc).__name__}: {exc})") from exc
    served.engine.step = step
    row = {"step": step, "kind": "fork", "time": time.time(), "forked_from": forked_from, "metrics": {}}
    checkpoints.append_history(served.model_dir, row)
    return ForkResult(step=step, forked_from=forked_from)


def _pick(source_dir: Path, label: str, not_after: int | None) -> int:
    steps = [c.step for c in checkpoints.list_checkpoints(source_dir)] if source_dir.is_dir() else []
    if not steps:
        raise ServiceError(404, f"{label} has no checkpoints under {source_dir}; check from_model and from_project")
    chosen = [s for s in steps if not_after is None or s <= not_after]
    if not chosen:
        raise ServiceError(404, f"{label} has no checkpoint at or before step {not_after}; its steps: {steps}")
    return max(chosen)


def _check_compatible(served: ServedModel, source_dir: Path, label: str) -> None:
    meta = source_dir / "model.json"
    if not meta.exists():
        raise ServiceError(404, f"{label} has no model.json in {source_dir}: it was not registered by art-agents")
    source = RegisterRequest.model_validate_json(meta.read_text(encoding="utf-8"))
    if source.base_model != served.info.base_model:
        raise ServiceError(
            400, f"{label} trains base model {source.base_model!r}, not {served.info.base_model!r}; fork a sibling"
        )
    differ = [f"{k} {getattr(source.config, k)!r} vs {getattr(served.info.config, k)!r}" for k in _SAME
              if getattr(source.config, k) != getattr(served.info.config, k)]  # fmt: skip
    if differ:
        raise ServiceError(
            400, f"{label}'s LoRA differs ({', '.join(differ)}); register the new model with the same LoRA settings"
        )
