"""What an export is made of: a model folder found from what the user named, one committed step of it, and
the errors and provenance record every format shares."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from art_agents.errors import ArtError
from art_agents.schema import Schema
from art_agents.server.storage.checkpoints import checkpoint_path, list_checkpoints
from art_agents.wire import RegisterRequest

Format = Literal["lora", "merged", "gguf"]
FORMATS: tuple[Format, ...] = ("lora", "merged", "gguf")


class ExportError(ArtError, ValueError):
    """An export refused before or while writing; the message names the problem and the fix."""


class ExportInfo(Schema):
    """What an export folder holds and where it came from (`export.json`)."""

    name: str
    project: str
    step: int
    base_model: str
    gguf_file: str | None = None
    format: Format
    quantization: str | None = None
    exported_at: float


@dataclass(frozen=True)
class Source:
    """One committed step of a model folder: what an export is made of."""

    model_dir: Path
    request: RegisterRequest
    step: int

    @property
    def checkpoint(self) -> Path:
        return checkpoint_path(self.model_dir, self.step)

    @property
    def served_as(self) -> str:
        return f"{self.request.name}@{self.step}"

    @property
    def gguf_name(self) -> str:
        return f"{self.request.name}-step{self.step}.gguf"


def find_model_dir(folder: Path, model: str | None = None) -> Path:
    """The model folder that `folder` names: itself, or the one model of a project, server or run folder."""
    from art_agents.report.command import model_dirs, runs_under

    if (folder / "model.json").is_file():
        found = [folder]
    elif not folder.is_dir():
        raise ExportError(
            f"{folder} is not a folder; give a model folder (with model.json), or a project, server or run folder"
        )
    else:
        found = model_dirs(folder) or runs_under(folder)
    chosen = [d for d in found if model is None or d.name == model]
    if not chosen:
        named = f" named {model!r}" if model else ""
        also = f" (models here: {', '.join(d.name for d in found)})" if found else ""
        raise ExportError(
            f"{folder} holds no trained model{named}{also}; give a model folder (<art_path>/<project>/models/<name>, "
            "with model.json), or a project, server or run folder with --model NAME"
        )
    if len(chosen) > 1:
        names = ", ".join(str(d) for d in chosen)
        raise ExportError(
            f"{folder} holds {len(chosen)} models ({names}); pick one with --model NAME or give its folder"
        )
    return chosen[0]


def open_source(folder: str | Path, step: int | None = None, model: str | None = None) -> Source:
    """The model folder and committed step to export (the latest when `step` is None)."""
    model_dir = find_model_dir(Path(folder), model)
    request = RegisterRequest.model_validate_json((model_dir / "model.json").read_text(encoding="utf-8"))
    steps = [info.step for info in list_checkpoints(model_dir)]
    if not steps:
        raise ExportError(f"{model_dir} has no checkpoints yet; register the model (step 0) or train it first")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise ExportError(f"{model_dir} has no checkpoint {step}; its steps are {_ranges(steps)}: pick one with --step")
    return Source(model_dir, request, step)


def _ranges(steps: list[int]) -> str:
    """`0-4, 7` for steps [0, 1, 2, 3, 4, 7]: a long run's steps in one short line."""
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][-1] + 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)
