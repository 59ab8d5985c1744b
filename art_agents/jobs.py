"""Training jobs described in a file: the TOML job (`art-agents train job.toml`), and loading the rollout function,
scenarios and model it names. Shared by the training loop's `run_job` and `art-agents eval`."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from art_agents.model import TrainableModel
from art_agents.schema import Schema
from art_agents.train_config import ModelConfig, TrainConfig


class TrainJob(Schema):
    """A training run described in a TOML file (`art-agents train job.toml`)."""

    name: str
    project: str = "default"
    base_model: str
    model: ModelConfig = Field(default_factory=ModelConfig)
    rollout: str = Field(description="`package.module:function`, an async (model, scenario) -> Trajectory.")
    scenarios: Path = Field(
        description="The training scenarios: a JSONL file (relative to the job file), a scenario a line, each passed "
        "to the rollout function"
    )
    backend: Literal["local", "remote"] = "local"
    art_path: Path = Field(
        Path(".art"),
        description="The local server's folder (relative to the job file): training writes the model there and "
        "`art-agents eval` reads its steps from it.",
    )
    base_url: str | None = Field(None, description="Server URL when backend = 'remote'.")
    api_key: str | None = None
    steps: int = Field(10, ge=1)
    groups_per_step: int = Field(4, ge=1)
    rollouts_per_group: int = Field(4, ge=2)
    max_exceptions: float = Field(0.1, ge=0)
    seed: int = 0
    pipeline: bool = Field(
        False, description="Roll out the next draws while a step trains (see art_agents.loop.pipeline)."
    )
    max_steps_off_policy: int = Field(
        1, ge=0, description="With `pipeline`, how many steps behind the trained policy a draw's rollouts may be."
    )
    train: TrainConfig = Field(default_factory=TrainConfig)

    @classmethod
    def from_file(cls, path: Path) -> TrainJob:
        """Read a TOML job; relative `scenarios` and `art_path` are relative to the job file's folder."""
        import tomllib

        job = cls.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))
        folder = path.resolve().parent
        return job.model_copy(update={"scenarios": folder / job.scenarios, "art_path": folder / job.art_path})

    @property
    def model_folder(self) -> Path:
        """Where a local backend keeps the job's model: `<art_path>/<project>/models/<name>/`."""
        return self.art_path / self.project / "models" / self.name


def load_function(path: str, kind: str = "rollout") -> Callable[..., Any]:
    """`package.module:function` -> the function; errors name `kind` (rollout, reward) and the fix."""
    module_name, _, attribute = path.partition(":")
    if not attribute:
        raise ValueError(f"{kind} {path!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"{kind} {path!r}: cannot import {module_name!r} ({exc}); put the module beside the job file "
            "or in the current folder, or install it"
        ) from exc
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ValueError(f"{kind} {path!r}: {module_name} has no function {attribute!r}")
    return function  # type: ignore[no-any-return]


def load_scenarios(path: Path) -> list[Any]:
    if not path.is_file():
        raise ValueError(f"scenarios file {path} does not exist")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    try:
        return [json.loads(line) for line in lines]
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: every line must be one JSON scenario ({exc})") from exc


def job_model(job: TrainJob) -> AbstractAsyncContextManager[TrainableModel]:
    """The job's model, registered on its backend (the server at `base_url`, or a local one) while the block runs."""
    from art_agents.backends.registered import registered_model

    return registered_model(
        job.name,
        job.project,
        job.base_model,
        job.model,
        base_url=(job.base_url or "") if job.backend == "remote" else None,
        api_key=job.api_key,
        art_path=job.art_path,
    )
