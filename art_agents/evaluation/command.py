"""`art-agents eval JOB.toml --scenarios HELDOUT.jsonl --models ...` or `art-agents eval RUN_FOLDER --models ...`:
`art.evaluate` with a training job's rollout, or with an `autorl`/`mcp-rl` run's or the quickstart's own rollout and
held-out split."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from art_agents import parts

if TYPE_CHECKING:
    from art_agents.evaluation.run import Evaluation
    from art_agents.jobs import TrainJob
    from art_agents.model import TrainableModel

Registered = Callable[[], AbstractAsyncContextManager["TrainableModel"]]


def eval_job(
    source: Annotated[
        Path,
        typer.Argument(
            exists=True,
            metavar="JOB_FILE|RUN_FOLDER",
            help="The TOML job file of `art-agents train`, the --out folder of an `autorl` or `mcp-rl` run, or the "
            "quickstart's model folder (.art/quickstart/models/quickstart).",
        ),
    ],
    scenarios: Annotated[
        Path | None,
        typer.Option(
            help="JSONL file of held-out scenarios, one a line (a job file needs it; a run folder has its own).",
            show_default=False,
        ),
    ] = None,
    models: Annotated[
        str,
        typer.Option(
            help="Comma-separated: the job's or run's model name (its latest step), NAME@STEP, provider/model "
            "(LiteLLM) or MODEL@http://host/v1. Default: that model at step 0 and its latest step."
        ),
    ] = "",
    out: Annotated[
        Path | None, typer.Option(help="Run folder for eval/NAME/. Default: the job's model folder, or the run folder.")
    ] = None,
    name: Annotated[str, typer.Option(help="The evaluation's name (its folder under eval/).")] = "heldout",
    rollouts_per_scenario: Annotated[
        int, typer.Option(min=1, help="Rollouts of each scenario per model; a scenario's reward is their mean.")
    ] = 1,
    decoding: Annotated[
        str | None,
        typer.Option(
            help="rollout, greedy or sampled. Default: rollout for a job and an autorl or mcp-rl run folder (its "
            "recorded evaluation temperature); greedy for the quickstart, as its own evaluation."
        ),
    ] = None,
    judge_model: Annotated[
        str | None, typer.Option(help="Run folder: LiteLLM judge model. Default: the run's.")
    ] = None,
    judge_api_base: Annotated[str | None, typer.Option(help="Run folder: the judge's URL. Default: the run's.")] = None,
    judge_api_key: Annotated[str | None, typer.Option(help="Run folder: the judge's key (runs record none).")] = None,
    reward: Annotated[
        str | None, typer.Option(help="mcp-rl run folder: module:function (scenario, trajectory) -> float.")
    ] = None,
) -> None:
    """Evaluate and compare models on held-out scenarios with a job's or a run's rollout; saved and resumable."""
    sys.path[:0] = [str(source.resolve().parent), str(Path.cwd())]
    options: dict[str, Any] = {"name": name, "rollouts_per_scenario": rollouts_per_scenario}
    wanted = [m.strip() for m in models.split(",") if m.strip()]
    if source.is_dir():
        kind = _run_kind(source)
        if kind is None:
            typer.echo(
                f"error: {source} is neither a job file nor a run folder: pass the TOML job file of `art-agents "
                "train` (with --scenarios HELDOUT.jsonl), the --out folder of `art-agents autorl` or `art-agents "
                "mcp-rl`, or the quickstart's model folder (.art/quickstart/models/quickstart); a run folder holds "
                "task.json",
                err=True,
            )
            raise typer.Exit(2)
        judge = {"judge_model": judge_model, "judge_params": {"api_base": judge_api_base, "api_key": judge_api_key}}
        options |= {"out": out or source, "decoding": decoding or ("greedy" if kind == "quickstart" else "rollout")}
        _print(_stopping(lambda: _run_folder(source, kind, wanted, judge, reward, options)))
        return
    if scenarios is None:
        typer.echo("error: a job file needs --scenarios HELDOUT.jsonl (the held-out scenarios)", err=True)
        raise typer.Exit(2)
    from art_agents.jobs import job_model

    rollout, heldout, job = _job(source, scenarios)
    wanted = wanted or [f"{job.name}@0", job.name]
    _check_art_path(job, source, wanted)
    options |= {"out": out, "decoding": decoding or "rollout"}
    _print(_stopping(lambda: _evaluate(rollout, heldout, wanted, job.name, lambda: job_model(job), options)))


def _job(job_file: Path, scenarios: Path) -> tuple[Any, list[Any], TrainJob]:
    """The job's rollout function, the held-out scenarios and the job; exit 2 naming what is wrong."""
    from pydantic import ValidationError

    from art_agents.errors import settings_error
    from art_agents.jobs import TrainJob, load_function, load_scenarios

    try:
        job = TrainJob.from_file(job_file)
        return load_function(job.rollout), load_scenarios(scenarios), job
    except ValidationError as exc:
        typer.echo(f"error: {settings_error(exc, job_file, schema=TrainJob)}", err=True)
        raise typer.Exit(2) from exc
    except ValueError as exc:
        typer.echo(f"{job_file}: {exc}", err=True)
        raise typer.Exit(2) from exc


def _check_art_path(job: TrainJob, job_file: Path, wanted: list[str]) -> None:
    """Exit 2 before a local server creates an empty model folder for steps that were never trained there."""
    if job.backend == "local" and _asks_for(wanted, job.name) and not (job.model_folder / "model.json").is_file():
        typer.echo(
            f"error: art_path in {job_file}: {job.art_path} holds no model {job.project}/{job.name} (no "
            f"{job.model_folder}); set art_path, relative to the job file, to the folder `art-agents train` used",
            err=True,
        )
        raise typer.Exit(2)


def _stopping(job: Callable[[], Awaitable[Evaluation]]) -> Evaluation:
    from art_agents.errors import ArtError

    try:
        return asyncio.run(job())  # type: ignore[arg-type]
    except (ArtError, ValueError) as exc:
        typer.echo(f"evaluation stopped: {exc}", err=True)
        raise typer.Exit(1) from exc


def _run_kind(folder: Path) -> str | None:
    """The kind of run `folder` holds (autorl, mcp-rl, quickstart: its task.json says which), if `eval` knows it."""
    try:
        kind = json.loads((folder / "task.json").read_text(encoding="utf-8")).get("kind")
    except (OSError, ValueError, AttributeError):
        return None
    return kind if kind in parts.RUN_EVALUATIONS else None


async def _run_folder(
    folder: Path, kind: str, wanted: list[str], judge: dict[str, Any], reward: str | None, options: dict[str, Any]
) -> Evaluation:
    """The run's held-out split with its own scored rollout; by default its step 0 against its latest step."""
    from art_agents.jobs import load_function

    scorer = load_function(reward, "reward") if reward else None
    async with parts.load(parts.RUN_EVALUATIONS[kind])(folder, reward=scorer, **judge) as run:
        ours = run.name
        result = await _evaluate(run.rollout, run.heldout, wanted or [f"{ours}@0", ours], ours, run.registered, options)
        judged = getattr(run, "judged", None)  # autorl and mcp-rl runs judge RULER-scored answers side by side
        return await judged(result) if judged is not None else result


async def _evaluate(
    rollout: Any, heldout: list[Any], wanted: list[str], ours: str, registered: Registered, options: dict[str, Any]
) -> Evaluation:
    """Register the model named `ours` only when one of its steps is asked for."""
    from art_agents.evaluation.run import evaluate

    if not _asks_for(wanted, ours):
        return await evaluate(rollout, heldout, wanted, **options)
    async with registered() as model:
        return await evaluate(rollout, heldout, wanted, steps_of=model, **options)


def _asks_for(wanted: list[str], ours: str) -> bool:
    """Whether `wanted` names the model `ours` or one of its steps."""
    return any(w == ours or w.startswith(f"{ours}@") for w in wanted)


def _print(result: Evaluation) -> None:
    from art_agents.evaluation.tables import eval_text

    typer.echo(eval_text(result.summary))
    if result.folder is not None:
        typer.echo(f"saved: {result.folder}")


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_job)
