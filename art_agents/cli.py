"""The `art-agents` command. Each part of the package adds its own subcommands.

Parts register through a `register(app)` function in their `cli` module, imported only when the
command runs, so `import art_agents` stays light and a part whose extra is missing just has no
subcommand (with a hint in `--help`).
"""

from __future__ import annotations

import importlib
from typing import Annotated

import typer

import art_agents

app = typer.Typer(name="art-agents", help="Train LLM agents with RL on their own experience.", no_args_is_help=True)

PART_COMMANDS = {
    "art_agents.server.cli": "serve, tiny-model (extra: server)",
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
    missing = load_parts()
    if missing:
        app.info.epilog = "Not installed: " + "; ".join(missing)
    app()
