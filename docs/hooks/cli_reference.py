"""mkdocs hook: `<!-- cli-reference -->` in a page becomes every `art-agents` command's `--help`, generated from the
commands themselves at build time, so the reference cannot drift from the code."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_reference())


def cli_reference() -> str:
    import click
    import typer
    import typer.core

    from art_agents.cli.main import app, load_parts

    load_parts()
    group = typer.main.get_command(app)
    sections = []
    rich, typer.core.HAS_RICH = typer.core.HAS_RICH, False  # click's plain help: rich would print boxes to stdout
    try:
        with click.Context(group, info_name="art-agents", terminal_width=100) as context:
            for name in sorted(group.list_commands(context)):
                command = group.get_command(context, name)
                if command is None or command.hidden:
                    continue
                with click.Context(command, info_name=name, parent=context, terminal_width=100) as sub:
                    help_text = command.get_help(sub).strip()
                sections.append(f"### `art-agents {name}`\n\n```text\n{help_text}\n```\n")
    finally:
        typer.core.HAS_RICH = rich
    return "\n".join(sections)
