"""Where a model's rollouts and steps go besides the server's `history.jsonl`: W&B, Langfuse, OpenPipe.

A `TrainableModel` names its reporters in `report_to` (or the `ART_AGENTS_REPORT_TO` variable, comma
separated; `none` turns all off). Langfuse and OpenPipe are also on by themselves when their own
variables are set (`LANGFUSE_PUBLIC_KEY` and `LANGFUSE_SECRET_KEY`; `OPENPIPE_API_KEY`), since that
is how their users configure them.
Every train and log call hands each reporter one `StepRecord` after the server answered: the groups
then carry their final rewards and judge scores. A reporter never breaks training: its failure is
a warning, and the step stands.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from art_agents.errors import ArtError
from art_agents.parts import REPORTERS, load

if TYPE_CHECKING:
    from art_agents.train_config import ModelConfig
    from art_agents.trajectory import TrajectoryGroup

REPORT_TO_ENV = "ART_AGENTS_REPORT_TO"
LANGFUSE_KEYS = ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY")
OPENPIPE_KEY = "OPENPIPE_API_KEY"
# Reporters on by themselves, unless `report_to` is given, when all of their own variables are set.
CONFIGURED_BY = {"langfuse": LANGFUSE_KEYS, "openpipe": (OPENPIPE_KEY,)}


@dataclass(frozen=True)
class StepRecord:
    """One train or log call as the server recorded it, with the wall-clock span of the call."""

    split: str  # "train" for a train call, else the split given to log()
    step: int  # the history row's step: the new checkpoint for train, the logged step for log
    groups: Sequence[TrajectoryGroup]
    metrics: dict[str, float]
    started_at: float
    finished_at: float


class ReportedModel(Protocol):
    """What a reporter reads from its model. A TrainableModel satisfies it; a Protocol keeps this module below it."""

    @property
    def name(self) -> str: ...
    @property
    def project(self) -> str: ...
    @property
    def base_model(self) -> str: ...
    @property
    def server_config(self) -> ModelConfig: ...


class Reporter(Protocol):
    """Receives every step of one model; built once per model at registration."""

    def record(self, record: StepRecord) -> None: ...

    def close(self) -> None:
        """Flush what is queued; called when the backend closes."""
        ...


def reporter_names(report_to: Sequence[str] | None) -> list[str]:
    """The reporters to build: `report_to` if given, else the environment's, plus those configured by their variables."""
    if report_to is None:
        report_to = [n.strip() for n in os.environ.get(REPORT_TO_ENV, "").split(",") if n.strip()]
        report_to += [
            name
            for name, keys in CONFIGURED_BY.items()
            if name not in report_to and all(os.environ.get(key) for key in keys)
        ]
    names = [name.lower() for name in report_to]
    if "none" in names:
        return []
    unknown = sorted(set(names) - set(REPORTERS))
    if unknown:
        raise ArtError(
            f"unknown reporter {', '.join(unknown)} in report_to; choose from {', '.join(REPORTERS)} or none"
        )
    return list(dict.fromkeys(names))


def create_reporters(names: Sequence[str], model: ReportedModel) -> list[Reporter]:
    """Build the named reporters (classes in `art_agents.integrations`), naming the extra to install when a library
    is missing."""
    reporters: list[Reporter] = []
    for name in names:
        try:
            reporter_class = load(REPORTERS[name])
        except ImportError as exc:
            raise ArtError(
                f"report_to={name!r} needs the {name} extra ({exc}): pip install 'art-agents[{name}]' "
                f"(from a clone: pip install -c constraints.txt -e '.[{name}]')"
            ) from exc
        reporters.append(reporter_class(model))
    return reporters


def send(reporters: Sequence[Reporter], record: StepRecord) -> None:
    """Hand the record to every reporter; a failing one warns and the others still get it."""
    for reporter in reporters:
        try:
            reporter.record(record)
        except Exception as exc:
            warnings.warn(
                f"{type(reporter).__name__} could not record step {record.step} ({type(exc).__name__}: {exc}); "
                "training goes on and history.jsonl has the step",
                RuntimeWarning,
                stacklevel=2,
            )


def close(reporters: Sequence[Reporter]) -> None:
    for reporter in reporters:
        try:
            reporter.close()
        except Exception as exc:
            warnings.warn(f"{type(reporter).__name__} could not flush ({exc})", RuntimeWarning, stacklevel=2)
