"""The `art-agents` command. Each part of the package adds its own subcommands.

Parts register through a `register(app)` function in their `cli` module, imported only when the
command runs, so `import art_agents` stays light and a part whose extra is missing just has no
subcommand (with a hint in `--help`).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer

import art_agents

app = typer.Typer(name="art-agents", help="Train LLM agents with RL on their own experience.", no_args_is_help=True)

R = TypeVar("R")

PART_COMMANDS = {
    "art_agents.server.cli": "serve, doctor, tiny-model (extra: server)",
    "art_agents.reporting": "report",
    "art_agents.train_command": "train",
    "art_agents.autorl.cli": "autorl, mcp-rl",
}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"art-agents {art_agents.__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Train LLM agents with RL on their own experience."""


def run_job(job: Callable[[], Awaitable[R]], interrupted: Callable[[], str]) -> R:
    """Run a command's async job: Ctrl-C prints `interrupted()` (what is saved, how to resume) and a
    known error one line, instead of a traceback through asyncio."""
    from art_agents.errors import ArtError

    try:
        return asyncio.run(job())  # type: ignore[arg-type]
    except KeyboardInterrupt:
        typer.echo(f"\ninterrupted: {interrupted()}", err=True)
        raise typer.Exit(130) from None
    except (ArtError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


def load_parts() -> list[str]:
    """Register every part's subcommands; returns hints for the parts that could not load."""
    missing: list[str] = []
    for module_name, hint in PART_COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.append(hint)
            continue
        module.register(app)
    return missing


def run() -> None:
    from art_agents.errors import MissingExtra
    from art_agents.extras import extra_of, missing_extra

    missing = load_parts()
    if missing:
        app.info.epilog = "Not installed: " + "; ".join(missing)
    try:
        app()
    except MissingExtra as exc:
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(1) from None
    except ModuleNotFoundError as exc:  # an import no command checked for
        extra = extra_of(exc)
        if extra is None:
            raise
        typer.echo(f"error: {missing_extra('this command', extra, exc)}", err=True)
        raise SystemExit(1) from None
