"""The `art-agents` command. Each part of the package adds its own subcommands.

Parts register through a `register(app)` function (listed in `art_agents.parts.CLI_PARTS`), imported
only when the command runs, so `import art_agents` stays light and a part whose extra is missing just
has no subcommand (with a hint in `--help`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import typer
import typer.core

import art_agents
from art_agents.parts import CLI_PARTS, load


class _FlagsWithoutType:
    """typer writes a type for every option (`--help <bool>`); a flag takes no value, so its column stays empty."""

    def get_params(self, ctx: typer.Context) -> list[Any]:
        params: list[Any] = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if isinstance(param, typer.core.TyperOption) and param.is_flag and param.metavar is None:
                param.metavar = ""
        return params


class Group(_FlagsWithoutType, typer.core.TyperGroup):
    pass


class Command(_FlagsWithoutType, typer.core.TyperCommand):
    pass


app = typer.Typer(
    name="art-agents", help="Train LLM agents with RL on their own experience.", no_args_is_help=True, cls=Group
)

R = TypeVar("R")


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
    known error one line, instead of a traceback through asyncio. Warnings go to a log file, which
    also keeps an error's traceback (every attempt of an LLM call, for one); the line points to it."""
    from art_agents.errors import ArtError
    from art_agents.report.log_file import CommandLog

    with CommandLog() as log:
        try:
            result = asyncio.run(job())  # type: ignore[arg-type]
        except KeyboardInterrupt:
            typer.echo(f"\ninterrupted: {interrupted()}", err=True)
            raise typer.Exit(130) from None
        except (ArtError, ValueError) as exc:
            typer.echo(f"error: {log.error_line(exc)}", err=True)
            raise typer.Exit(1) from exc
        if log.written:
            typer.echo(f"warnings were logged: {log.path}", err=True)
        return result


def load_parts() -> list[str]:
    """Register every part's subcommands; returns hints for the parts that could not load."""
    missing: list[str] = []
    for target, hint in CLI_PARTS.items():
        try:
            register = load(target)
        except ImportError:
            missing.append(hint)
            continue
        register(app)
    for command in app.registered_commands:
        if command.cls in (None, typer.core.TyperCommand):  # typer's own, not one a part chose
            command.cls = Command
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
