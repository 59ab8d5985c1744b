"""`art-agents report`: what each model's training did, read from its `history.jsonl`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

SHOWN = ("reward_mean", "reward_std", "loss", "groups_skipped_zero_variance", "turns_retokenized", "train_s")


def read_history(model_dir: Path) -> list[dict[str, Any]]:
    """History rows in step order; a torn last line (a crash mid-write) is skipped, not fatal."""
    path = model_dir / "history.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return sorted(rows, key=lambda row: row.get("step", 0))


def model_dirs(art_path: Path) -> list[Path]:
    return sorted(p.parent for p in art_path.glob("*/models/*/model.json"))


def report(
    art_path: Annotated[Path, typer.Option(help="The server's art path.")] = Path(".art"),
    model: Annotated[str | None, typer.Option(help="Only this model name.")] = None,
) -> None:
    """Print each model's per-step training metrics."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    dirs = [d for d in model_dirs(art_path) if model is None or d.name == model]
    if not dirs:
        console.print(f"no models under {art_path} (looked for */models/*/model.json)")
        raise typer.Exit(1)
    for model_dir in dirs:
        table = Table(title=f"{model_dir.parent.parent.name}/{model_dir.name}")
        table.add_column("step", justify="right")
        for name in SHOWN:
            table.add_column(name, justify="right")
        for row in read_history(model_dir):
            metrics = row.get("metrics", {})
            table.add_row(str(row.get("step")), *(_fmt(metrics.get(name)) for name in SHOWN))
        console.print(table)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
