"""`art-agents train JOB.toml`: run a training job described in a file."""

from __future__ import annotations

import asyncio
import sys
import tomllib
from pathlib import Path
from typing import Annotated

import typer


def train(job_file: Annotated[Path, typer.Argument(exists=True, help="TOML file describing the job (see README).")]) -> None:
    """Train a model with the standard loop from a TOML job file."""
    from pydantic import ValidationError

    from art_agents.loop import TrainJob, run_job

    sys.path.insert(0, str(Path.cwd()))  # the rollout module usually sits beside the job file
    try:
        job = TrainJob.model_validate(tomllib.loads(job_file.read_text(encoding="utf-8")))
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        typer.echo(f"{job_file}: {exc}", err=True)
        raise typer.Exit(2) from exc
    if not job.scenarios.is_absolute():
        job.scenarios = job_file.parent / job.scenarios
    for record in asyncio.run(run_job(job)):
        typer.echo(
            f"step {record.step}: reward {record.reward_mean:.3f} over {record.rollouts} rollouts "
            f"(rollout {record.rollout_s:.1f}s, train {record.train_s:.1f}s)"
        )


def register(app: typer.Typer) -> None:
    app.command("train")(train)
