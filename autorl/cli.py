"""`art-agents mcp-rl`: train a model to use an MCP server's tools, from nothing but the server."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

Opt = typer.Option


def _litellm_params(api_base: str | None, api_key: str | None) -> dict[str, Any]:
    return {"api_base": api_base, "api_key": api_key}


def mcp_rl(
    config: Annotated[Path | None, Opt(exists=True, help="TOML file with these settings; flags override it.")] = None,
    server: Annotated[str | None, Opt(help='Command of a stdio MCP server, e.g. "uvx mcp-server-time".')] = None,
    url: Annotated[str | None, Opt(help="Streamable HTTP URL of an MCP server.")] = None,
    header: Annotated[list[str] | None, Opt(help="HTTP header for --url as NAME=VALUE; repeatable.")] = None,
    shared_session: Annotated[bool | None, Opt(help="One MCP session for all rollouts (read-only servers).")] = None,
    base_model: Annotated[str | None, Opt(help="Hub id or local folder of the model to train.")] = None,
    judge_model: Annotated[str | None, Opt(help="LiteLLM model string of the RULER judge.")] = None,
    judge_api_base: Annotated[str | None, Opt(help="api_base for the judge (local servers).")] = None,
    judge_api_key: Annotated[str | None, Opt(help="api_key for the judge.")] = None,
    generator_model: Annotated[str | None, Opt(help="Writes the scenarios; default: the judge model.")] = None,
    generator_api_base: Annotated[str | None, Opt()] = None,
    generator_api_key: Annotated[str | None, Opt()] = None,
    reward: Annotated[
        str | None, Opt(help="module:function (scenario, trajectory) -> float, instead of RULER.")
    ] = None,
    steps: Annotated[int | None, Opt(help="Total training steps (default 10).")] = None,
    group_size: Annotated[int | None, Opt(help="Rollouts per scenario (default 4).")] = None,
    groups_per_step: Annotated[int | None, Opt(help="Scenarios per step (default 4).")] = None,
    scenarios: Annotated[int | None, Opt(help="Training scenarios to generate (default 24).")] = None,
    val_scenarios: Annotated[int | None, Opt(help="Held-out scenarios (default 8).")] = None,
    max_turns: Annotated[int | None, Opt(help="Model calls per rollout (default 6).")] = None,
    max_tokens: Annotated[int | None, Opt(help="Tokens per model call (default 256).")] = None,
    learning_rate: Annotated[float | None, Opt(help="Learning rate (default 1e-4).")] = None,
    out: Annotated[Path | None, Opt(help="Run folder (default mcp-rl-run).")] = None,
    fresh: Annotated[bool, Opt(help="Delete the run folder's previous run and start over.")] = False,
) -> None:
    """Train a model to use an MCP server's tools: scenarios, rollouts, RULER, GRPO, evaluation.

    Rerun the same command to continue an interrupted run.
    """
    import tomllib

    from pydantic import ValidationError

    from art_agents.autorl.mcp_rl import MCPRLConfig, run_mcp_rl
    from art_agents.errors import ArtError

    headers = dict(h.split("=", 1) for h in header or [] if "=" in h)
    if header and len(headers) != len(header):
        raise typer.BadParameter("--header takes NAME=VALUE")
    flags: dict[str, Any] = {
        "server": server,
        "url": url,
        "headers": headers or None,
        "shared_session": shared_session,
        "base_model": base_model,
        "judge_model": judge_model,
        "judge_params": _litellm_params(judge_api_base, judge_api_key),
        "generator_model": generator_model,
        "generator_params": _litellm_params(generator_api_base, generator_api_key),
        "reward": reward,
        "steps": steps,
        "group_size": group_size,
        "groups_per_step": groups_per_step,
        "scenarios": scenarios,
        "val_scenarios": val_scenarios,
        "rollout": {"max_turns": max_turns, "max_tokens": max_tokens},
        "train": {"learning_rate": learning_rate},
        "out": out,
    }
    sys.path[:0] = [str(Path.cwd())] + ([str(config.resolve().parent)] if config else [])  # for --reward modules
    try:
        settings = MCPRLConfig.load(config, flags)
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    try:
        summary = asyncio.run(run_mcp_rl(settings, fresh=fresh, echo=typer.echo))
    except KeyboardInterrupt:
        typer.echo(
            f"\ninterrupted; every finished step is saved in {settings.out}. Rerun the same command to continue.",
            err=True,
        )
        raise typer.Exit(130) from None
    except (ArtError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(summary.table())
    cost = summary.judge_cost_usd + (summary.generation.cost_usd if summary.generation else 0.0)
    typer.echo(f"judge + generator cost: ${cost:.4f}; run folder: {summary.out}")


def register(app: typer.Typer) -> None:
    app.command("mcp-rl")(mcp_rl)
