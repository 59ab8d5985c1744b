"""`art-agents report`: what each model's training did, read from its `history.jsonl`, as a table and an HTML page."""

from __future__ import annotations

import webbrowser
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from art_agents.jsonl import read_history
from art_agents.report.tables import format_value

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

# Server folders a command creates by default: `.art` (serve, quickstart, train), `<run>/art` (autorl, mcp-rl).
RUN_PATTERNS = ("*/*/models/*/model.json", "*/*/*/models/*/model.json")
MODEL_PATTERNS = ("*/models/*/model.json", "models/*/model.json")  # in a server folder, in a project folder
SHOWN = ("reward_mean", "reward_std", "loss", "groups_skipped_zero_variance", "turns_retokenized", "train_s")
SPLIT_REWARD = {"reward_mean": "reward", "reward_std": "reward_std"}  # a split row's names for the reward columns


def model_dirs(folder: Path) -> list[Path]:
    """The model folders of a server folder (`<art_path>/*/models/*`) or of one project in it (`<project>/models/*`)."""
    return sorted({p.parent for pattern in MODEL_PATTERNS for p in folder.glob(pattern)})


def runs_under(folder: Path) -> list[Path]:
    """Model folders of every server folder in `folder` or one level down (`.art`, `autorl-run/art`, ...),
    the most recently trained last."""
    found = {p.parent for pattern in RUN_PATTERNS for p in folder.glob(pattern)}
    return sorted(found, key=_last_change)


def _last_change(model_dir: Path) -> float:
    history = model_dir / "history.jsonl"
    return (history if history.exists() else model_dir / "model.json").stat().st_mtime


def report(
    run_dir: Annotated[
        Path | None,
        typer.Argument(
            metavar="RUN_DIR",
            help="A model folder, a server folder, or a folder with runs in it (searched like the default).",
            show_default=False,
        ),
    ] = None,
    art_path: Annotated[
        Path | None,
        typer.Option(help="A server folder. Default: the most recent run in or one folder below this one."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Only this model name.")] = None,
    html: Annotated[
        Path | None,
        typer.Option(help="Write the HTML page here (one model only). Default: report.html in the model folder."),
    ] = None,
    open_page: Annotated[bool, typer.Option("--open", help="Open the HTML page in the default browser.")] = False,
) -> None:
    """Print a model's per-step training metrics and write an HTML page with charts and its trajectories
    (by default for the most recently trained model here)."""
    from rich.console import Console

    console = Console()
    if run_dir is not None and art_path is not None:
        raise typer.BadParameter("give RUN_DIR or --art-path, not both")
    folder = run_dir if run_dir is not None else art_path
    searched, search = _models_in(folder)
    dirs = [d for d in searched if model is None or d.name == model]
    if not dirs:
        where = f"under {folder}" if folder is not None else "in this folder or the folders in it"
        console.print(
            f"no trained models {where}{f' named {model!r}' if model else ''}; "
            "RUN_DIR names a model folder, a server folder or a folder with runs in it",
            markup=False,
        )
        raise typer.Exit(1)
    if search:  # show the latest run, name the others
        *others, latest = dirs
        dirs = [latest]
        for other in others:
            console.print(f"also here: {other} (--art-path {other.parent.parent.parent} --model {other.name})")
    if html is not None and len(dirs) > 1:
        raise typer.BadParameter(f"{len(dirs)} models are shown but --html names one file; pick one with --model")
    for model_dir in dirs:
        console.print(_table(model_dir))
        for table in _eval_tables(model_dir):
            console.print(table)
    _write_pages(console, dirs, html, open_page)


def _models_in(folder: Path | None) -> tuple[list[Path], bool]:
    """The model folders RUN_DIR names, and whether they were searched for (then only the latest is shown)."""
    if folder is None:
        return runs_under(Path.cwd()), True
    if (folder / "model.json").exists():
        return [folder], False
    found = model_dirs(folder)
    return (found, False) if found else (runs_under(folder), True)


def _write_pages(console: Console, dirs: list[Path], html: Path | None, open_page: bool) -> None:
    """Write each model's page; without matplotlib say which extra draws it (the table is already out)."""
    from art_agents.errors import MissingExtra
    from art_agents.report.page import write_report

    for model_dir in dirs:
        try:
            page = write_report(model_dir, html)
        except MissingExtra as exc:
            console.print(str(exc), markup=False, soft_wrap=True)
            return
        console.print(f"report: {page}", markup=False, highlight=False, soft_wrap=True)
        if open_page and not webbrowser.open(page.resolve().as_uri()):
            console.print(
                f"--open: no web browser was found here; open {page.resolve()} in one (or copy it to a machine with "
                "one), or set BROWSER to a browser's command",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )


def _table(model_dir: Path) -> Table:
    from rich.table import Table

    table = Table(title=f"{model_dir.parent.parent.name}/{model_dir.name} ({model_dir})")
    table.add_column("step", justify="right")
    for name in SHOWN:  # a word a line, underscores kept: it fits 80 columns without cutting a name (`reward_m…`)
        table.add_column(name.replace("_", "_\n"), justify="right")
    for row in sorted(read_history(model_dir), key=lambda row: row.get("step", 0)):
        metrics = row.get("metrics", {})
        split = row.get("split")
        if split:  # an evaluation (`model.log`): its reward under the reward columns
            metrics = {**metrics, **{name: metrics.get(f"{split}/{alias}") for name, alias in SPLIT_REWARD.items()}}
        label = split or row.get("kind", "rl")  # an RL step goes unlabelled: most rows are one
        step = f"{row.get('step')}" + ("" if label == "rl" else f" {label}")
        table.add_row(step, *(format_value(metrics.get(name)) for name in SHOWN))
    return table


def _eval_tables(model_dir: Path) -> list[Table]:
    """Each evaluation under the model's eval/ folder: its models, then its pairs (as on the report page)."""
    from art_agents.evaluation.files import read_summaries
    from art_agents.evaluation.tables import eval_tables

    return [table for summary in read_summaries(model_dir) for table in eval_tables(summary)]


def register(app: typer.Typer) -> None:
    app.command("report")(report)
