"""`art-agents train JOB.toml`: run a training job described in a file."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated

import typer


def train(
    job_file: Annotated[
        Path, typer.Argument(exists=True, metavar="JOB_FILE", help="TOML file describing the job (see docs/cli.md).")
    ],
) -> None:
    """Train a model with the standard loop from a TOML job file."""
    import tomllib

    from pydantic import ValidationError

    from art_agents.errors import ArtError, settings_error
    from art_agents.jobs import TrainJob
    from art_agents.loop.train import run_job

    # the rollout module usually sits beside the job file, or in the folder the command runs from
    sys.path[:0] = [str(job_file.resolve().parent), str(Path.cwd())]
    try:
        job = TrainJob.from_file(job_file)
    except tomllib.TOMLDecodeError as exc:
        typer.echo(f"{job_file}: {exc}", err=True)
        raise typer.Exit(2) from exc
    except ValidationError as exc:
        typer.echo(f"error: {settings_error(exc, job_file, schema=TrainJob)}", err=True)
        raise typer.Exit(2) from exc
    try:
        records = asyncio.run(run_job(job))
    except ValueError as exc:  # a rollout or scenarios file that cannot be loaded
        typer.echo(f"{job_file}: {exc}", err=True)
        raise typer.Exit(2) from exc
    except ArtError as exc:  # the server would not start, or too many rollouts failed
        typer.echo(f"training stopped: {exc}", err=True)
        raise typer.Exit(1) from exc
    for record in records:
        typer.echo(
            f"step {record.step}: reward {record.reward_mean:.3f} over {record.rollouts} rollouts "
            f"(rollout {record.rollout_s:.1f}s, train {record.train_s:.1f}s)"
            + ("" if record.advanced else "; no update: every group's rewards were equal")
        )


def register(app: typer.Typer) -> None:
    app.command("train")(train)
