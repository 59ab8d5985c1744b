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


# The extra that installs each top-level module a command may import lazily.
EXTRA_OF_MODULE = {
    **dict.fromkeys(
        ("torch", "transformers", "peft", "trl", "accelerate", "fastapi", "uvicorn", "tokenizers", "jinja2"), "server"
    ),
    **dict.fromkeys(("langgraph", "langchain", "langchain_core", "langchain_openai"), "langgraph"),
    "litellm": "ruler",
    "mcp": "mcp",
    "langfuse": "langfuse",
    "wandb": "wandb",
    "matplotlib": "report",
    "vllm": "vllm",
    "gguf": "server",
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The one line that says which extra installs a module a command needed, or None if none does."""
    extra = EXTRA_OF_MODULE.get((exc.name or "").split(".")[0])
    if extra is None:
        return None
    return (
        f"error: this command needs the `{extra}` extra ({exc}): pip install 'art-agents[{extra}]' "
        f"(from a clone: pip install -c constraints.txt -e '.[{extra}]')"
    )


def run() -> None:
    missing = load_parts()
    if missing:
        app.info.epilog = "Not installed: " + "; ".join(missing)
    try:
        app()
    except ModuleNotFoundError as exc:
        line = missing_extra(exc)
        if line is None:
            raise
        typer.echo(line, err=True)
        raise SystemExit(1) from None
