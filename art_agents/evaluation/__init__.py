"""Evaluation (`art.evaluate`): one rollout function over held-out scenarios for several models, with paired
bootstrap intervals, saved under the run folder and charted by `art-agents report`.

A flat face over its modules: `run` (`evaluate`, `Evaluation`, the periodic evaluation `train_loop` runs),
`targets` (which models, and how to reach them), `files` (what is written under `eval/`), `comparison` (the
statistics), `charts` (the figures) and `command` (`art-agents eval`).
"""

from art_agents.evaluation.comparison import JudgedWins, PairComparison, compare_pair, mean_ci, paired_ci
from art_agents.evaluation.files import (
    EVAL_FOLDER,
    EvalSummary,
    ModelSummary,
    ScenarioRun,
    eval_folder,
    read_runs,
    read_summaries,
)
from art_agents.evaluation.run import Evaluation, PeriodicEvaluation, evaluate
from art_agents.evaluation.targets import EvalTarget, ModelSpec

__all__ = [
    "EVAL_FOLDER",
    "EvalSummary",
    "EvalTarget",
    "Evaluation",
    "JudgedWins",
    "ModelSpec",
    "ModelSummary",
    "PairComparison",
    "PeriodicEvaluation",
    "ScenarioRun",
    "compare_pair",
    "eval_folder",
    "evaluate",
    "mean_ci",
    "paired_ci",
    "read_runs",
    "read_summaries",
]
