"""An evaluation on disk: `eval/<name>/<model>.jsonl` (a line per finished scenario) and `eval/<name>/summary.json`.

The jsonl files are appended a line at a time, so an interrupted evaluation keeps every scenario it finished and a
rerun skips them (a scenario whose rollouts all failed is tried again). The summary is rewritten whole at the end.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

from pydantic import Field, ValidationError

from art_agents.atomic import append_line, write_text_atomic
from art_agents.evaluation.comparison import PairComparison
from art_agents.schema import Schema
from art_agents.trajectory import Trajectory

EVAL_FOLDER = "eval"
SUMMARY = "summary.json"
UNKNOWN_COST = "None: LiteLLM has no price for this model (our own steps, local models), so the cost is unknown."


class ScenarioRun(Schema):
    """One scenario's rollouts for one model: a line of `eval/<name>/<model>.jsonl`."""

    scenario_id: str
    index: int = Field(description="The scenario's position in the list evaluated.")
    rewards: list[float] = Field(description="One per rollout that finished.")
    errors: list[str] = Field(default_factory=list, description="One per rollout that raised, as 'Type: message'.")
    metrics: dict[str, float] = Field(default_factory=dict, description="Means over the finished rollouts.")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = Field(0.0, description="Mean wall seconds of a rollout.")
    cost_usd: float | None = Field(None, description=UNKNOWN_COST)
    trajectories: list[Trajectory] = Field(default_factory=list)

    @property
    def reward(self) -> float | None:
        """The scenario's reward: the mean over its finished rollouts; None when none finished."""
        return statistics.fmean(self.rewards) if self.rewards else None


class ModelSummary(Schema):
    """One model over all scenarios."""

    model: str
    file: str = Field(description="Its jsonl file, beside the summary.")
    step: int | None = Field(None, description="The checkpoint evaluated, for a model of ours.")
    scenarios: int
    failed_scenarios: int = Field(description="Scenarios where no rollout finished; left out of the means.")
    failed_rollouts: int
    mean_reward: float | None
    ci_low: float | None = Field(None, description="2.5% bound of the bootstrap over scenarios of the mean reward.")
    ci_high: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = Field(0.0, description="Mean wall seconds of a rollout.")
    cost_usd: float | None = Field(None, description=UNKNOWN_COST)
    first_error: str | None = None


class EvalSummary(Schema):
    """`eval/<name>/summary.json`: every model and every pair of models."""

    name: str
    created_at: float = Field(default_factory=time.time)
    scenarios: int
    rollouts_per_scenario: int
    decoding: str
    models: list[ModelSummary]
    comparisons: list[PairComparison] = Field(description="Each model against each model listed before it.")


def eval_folder(run_folder: Path, name: str) -> Path:
    return run_folder / EVAL_FOLDER / name


def read_runs(path: Path) -> dict[str, ScenarioRun]:
    """The finished scenarios of a jsonl by id (the last line wins); a line torn by a crash is skipped."""
    runs: dict[str, ScenarioRun] = {}
    if not path.exists():
        return runs
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            run = ScenarioRun.model_validate_json(line)
        except ValidationError:
            continue
        runs[run.scenario_id] = run
    return runs


def append_run(path: Path, run: ScenarioRun) -> None:
    append_line(path, run.model_dump_json())


def write_summary(folder: Path, summary: EvalSummary) -> Path:
    return write_text_atomic(folder / SUMMARY, summary.model_dump_json(indent=2) + "\n")


def read_summaries(run_folder: Path) -> list[EvalSummary]:
    """Every evaluation's summary under a run folder, oldest first; an unreadable one is skipped."""
    summaries = []
    for path in sorted((run_folder / EVAL_FOLDER).glob(f"*/{SUMMARY}")):
        try:
            summaries.append(EvalSummary.model_validate_json(path.read_text(encoding="utf-8")))
        except (OSError, ValidationError):
            continue
    return sorted(summaries, key=lambda s: s.created_at)


def finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
