"""The `art-agents` command: `main` holds the app and its entry point `run` (pyproject's console script
`art_agents.cli:run`); the parts above the core add their subcommands through `art_agents.parts.CLI_PARTS`;
`train` is `art-agents train`."""

from art_agents.cli.main import app, load_parts, run

__all__ = ["app", "load_parts", "run"]
