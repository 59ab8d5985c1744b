"""`art-agents eval JOB.toml --scenarios HELDOUT.jsonl --models ...`: `art.evaluate` for a training job's rollout."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from art_agents.evaluation import Evaluation
    from art_agents.loop import TrainJob


def eval_job(
    job_file: Annotated[
        Path, typer.Argument(exists=True, metavar="JOB_FILE", help="The TOML job file of `art-agents train`.")
    ],
    scenarios: Annotated[Path, typer.Option(help="JSONL file of held-out scenarios, one a line.", show_default=False)],
    models: Annotated[
        str,
        typer.Option(
            help="Comma-separated: the job's model name (its latest step), NAME@STEP, provider/model (LiteLLM) or "
            "MODEL@http://host/v1. Default: the job's model at step 0 and its latest step."
        ),
    ] = "",
    out: Annotated[
        Path | None, typer.Option(help="Run folder for eval/NAME/. Default: the job's model folder.")
    ] = None,
    name: Annotated[str, typer.Option(help="The evaluation's name (its folder under eval/).")] = "heldout",
    rollouts_per_scenario: Annotated[int, typer.Option(min=1)] = 1,
    decoding: Annotated[str, typer.Option(help="rollout, greedy or sampled.")] = "rollout",
) -> None:
    """Evaluate and compare models on held-out scenarios with a job's rollout function; saved and resumable."""
    from art_agents.errors import ArtError
    from art_agents.loop import TrainJob, load_function, load_scenarios

    sys.path[:0] = [str(job_file.resolve().parent), str(Path.cwd())]
    try:
        job = TrainJob.from_file(job_file)
        rollout, heldout = load_function(job.rollout), load_scenarios(scenarios)
    except ValueError as exc:
        typer.echo(f"{job_file}: {exc}", err=True)
        raise typer.Exit(2) from exc
    wanted = [m.strip() for m in models.split(",") if m.strip()] or [f"{job.name}@0", job.name]
    try:
        result = asyncio.run(_run(job, rollout, heldout, wanted, out, name, rollouts_per_scenario, decoding))
    except (ArtError, ValueError) as exc:
        typer.echo(f"evaluation stopped: {exc}", err=True)
        raise typer.Exit(1) from exc
    _print(result)


async def _run(
    job: TrainJob, rollout: object, heldout: list[object], wanted: list[str], out: Path | None, name: str,
    rollouts_per_scenario: int, decoding: str,
) -> Evaluation:  # fmt: skip
    """Start the job's backend only when one of its steps is asked for."""
    from art_agents.backend import LocalBackend
    from art_agents.evaluation import evaluate
    from art_agents.model import TrainableModel
    from art_agents.remote import RemoteBackend

    ours = any(w == job.name or w.startswith(f"{job.name}@") for w in wanted)
    if not ours:
        return await evaluate(rollout, heldout, wanted, name=name, out=out, rollouts_per_scenario=rollouts_per_scenario,
                              decoding=decoding)  # type: ignore[arg-type]  # fmt: skip
    backend = RemoteBackend(job.base_url or "", job.api_key) if job.backend == "remote" else LocalBackend(job.art_path)
    model = TrainableModel(name=job.name, project=job.project, base_model=job.base_model, config=job.model)
    try:
        await model.register(backend)
        return await evaluate(rollout, heldout, wanted, name=name, out=out, steps_of=model,  # type: ignore[arg-type]
                              rollouts_per_scenario=rollouts_per_scenario, decoding=decoding)  # type: ignore[arg-type]  # fmt: skip
    finally:
        await backend.close()


def _print(result: Evaluation) -> None:
    from art_agents.report_page import eval_model_rows, eval_pair_rows

    for head, rows in (eval_model_rows(result.summary), eval_pair_rows(result.summary)):
        for row in rows:
            typer.echo("  ".join(f"{h}: {v}" for h, v in zip(head, row, strict=True)))
    if result.folder is not None:
        typer.echo(f"saved: {result.folder}")


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_job)
