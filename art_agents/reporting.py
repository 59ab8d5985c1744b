"""`art-agents report`: what each model's training did, read from its `history.jsonl`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from art_agents.jsonl import read_history

if TYPE_CHECKING:
    from rich.table import Table

# Server folders a command creates by default: `.art` (serve, quickstart, train), `<run>/art` (autorl, mcp-rl).
RUN_PATTERNS = ("*/*/models/*/model.json", "*/*/*/models/*/model.json")
SHOWN = ("reward_mean", "reward_std", "loss", "groups_skipped_zero_variance", "turns_retokenized", "train_s")


def model_dirs(art_path: Path) -> list[Path]:
    return sorted(p.parent for p in art_path.glob("*/models/*/model.json"))


def runs_under(folder: Path) -> list[Path]:
    """Model folders of every server folder in `folder` or one level down (`.art`, `autorl-run/art`, ...),
    the most recently trained last."""
    found = {p.parent for pattern in RUN_PATTERNS for p in folder.glob(pattern)}
    return sorted(found, key=_last_change)


def _last_change(model_dir: Path) -> float:
    history = model_dir / "history.jsonl"
    return (history if history.exists() else model_dir / "model.json").stat().st_mtime


def report(
    art_path: Annotated[
        Path | None,
        typer.Option(help="A server folder. Default: the most recent run in or one folder below this one."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Only this model name.")] = None,
) -> None:
    """Print a model's per-step training metrics (by default the most recently trained one here)."""
    from rich.console import Console

    console = Console()
    searched = model_dirs(art_path) if art_path is not None else runs_under(Path.cwd())
    dirs = [d for d in searched if model is None or d.name == model]
    if not dirs:
        where = f"under {art_path}" if art_path is not None else "in this folder or the folders in it"
        console.print(
            f"no trained models {where}{f' named {model!r}' if model else ''}; --art-path names a server folder"
        )
        raise typer.Exit(1)
    if art_path is None:  # a search: show the latest run, name the others
        *others, latest = dirs
        dirs = [latest]
        for other in others:
            console.print(f"also here: {other} (--art-path {other.parent.parent.parent} --model {other.name})")
    for model_dir in dirs:
        console.print(_table(model_dir))


def _table(model_dir: Path) -> Table:
    from rich.table import Table

    table = Table(title=f"{model_dir.parent.parent.name}/{model_dir.name} ({model_dir})")
    table.add_column("step", justify="right")
    for name in SHOWN:
        table.add_column(name, justify="right")
    for row in sorted(read_history(model_dir), key=lambda row: row.get("step", 0)):
        metrics = row.get("metrics", {})
        table.add_row(str(row.get("step")), *(_fmt(metrics.get(name)) for name in SHOWN))
    return table


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
