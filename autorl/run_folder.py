"""The run folder of an AutoRL or MCP•RL run: what defines the run, its data, evaluations, summary.

Everything a rerun needs lives here, so rerunning the same command continues instead of starting
over: `task.json` (what the run is about; a rerun for something else is refused), the generated
data (`scenarios.jsonl`), the held-out evaluation (`eval/heldout/`, `art.evaluate`'s files, a step evaluated once
reused) and what it was run with (`eval_settings.json`), and the server's own art path (`art/`: checkpoints,
history, token store), from which the step is resumed.
Every file is written atomically, so an interrupted run leaves the folder consistent.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from art_agents.atomic import append_line, write_text_atomic
from art_agents.errors import ArtError

M = TypeVar("M", bound=BaseModel)
# Files a run writes that `art-agents eval RUN_FOLDER` reads back: MCP•RL's scenarios (train and val); AutoRL's
# system prompt, rubric and held-out inputs.
SCENARIOS_FILE = "scenarios.jsonl"
SYSTEM_PROMPT_FILE, RUBRIC_FILE, EVAL_FILE = "system_prompt.md", "rubric.md", "eval.jsonl"


class RunFolderMismatch(ArtError):
    """The folder holds a run of something else; reusing it would mix two runs."""


class RunFolder:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def art_path(self) -> Path:
        return self.path / "art"

    def file(self, name: str) -> Path:
        return self.path / name

    def check(self, task: dict[str, Any], *, fresh: bool = False) -> bool:
        """True when the folder holds this task's run (a resume); a folder of another task, or not a run folder,
        is refused. Writes nothing: a run checks this first and claims the folder once its checks pass."""
        task_file = self.file("task.json")
        if fresh:  # `claim` deletes what is there
            return False
        if task_file.is_file():
            previous = json.loads(task_file.read_text(encoding="utf-8"))
            differing = sorted(k for k in set(previous) | set(task) if previous.get(k) != task.get(k))
            if differing:
                raise RunFolderMismatch(
                    f"{self.path} holds a run of a different task (differs in: {', '.join(differing)}); "
                    "use another --out folder, or --fresh to delete that run and start over"
                )
            return True
        if self.path.exists() and any(self.path.iterdir()):
            raise RunFolderMismatch(
                f"{self.path} is not empty and holds no task.json, so it is not a run folder; use another --out"
            )
        return False

    def claim(self, task: dict[str, Any], *, fresh: bool = False) -> bool:
        """Make the folder this task's, as `check` allows; True when it already was (a resume).

        `fresh=True` deletes a previous run first.
        """
        if fresh and self.path.exists():
            shutil.rmtree(self.path)
        if self.check(task):
            return True
        write_text_atomic(self.file("task.json"), json.dumps(task, indent=2, sort_keys=True) + "\n")
        return False

    def saved(self) -> str:
        """What the folder holds, for the error of a run that stopped: the user must know what is kept."""
        names = sorted(p.name for p in self.path.iterdir()) if self.path.is_dir() else []
        return f"saved in {self.path}: {', '.join(names)}" if names else "nothing was saved"

    def read_jsonl(self, name: str, model: type[M]) -> list[M] | None:
        path = self.file(name)
        if not path.is_file():
            return None
        rows = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        try:
            return [model.model_validate_json(line) for line in rows]
        except ValueError as exc:
            raise ArtError(f"{path} is damaged ({exc}); delete it to generate it again") from exc

    def write_jsonl(self, name: str, rows: list[BaseModel]) -> Path:
        return write_text_atomic(self.file(name), "".join(row.model_dump_json() + "\n" for row in rows))

    def append_jsonl(self, name: str, row: BaseModel) -> None:
        """One more line at the end: a log that grows by a row per step is never rewritten."""
        append_line(self.file(name), row.model_dump_json())

    def read_text(self, name: str) -> str | None:
        """The file's text without surrounding whitespace; None when there is none."""
        path = self.file(name)
        return path.read_text(encoding="utf-8").strip() if path.is_file() else None

    def write_text(self, name: str, text: str) -> Path:
        return write_text_atomic(self.file(name), text)

    def read_json(self, name: str, model: type[M]) -> M | None:
        path = self.file(name)
        if not path.is_file():
            return None
        try:
            return model.model_validate_json(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ArtError(f"{path} is damaged ({exc}); delete it to compute it again") from exc

    def write_json(self, name: str, row: BaseModel) -> Path:
        return write_text_atomic(self.file(name), row.model_dump_json(indent=2) + "\n")
