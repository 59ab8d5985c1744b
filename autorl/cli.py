"""`art-agents autorl` and `art-agents mcp-rl`: train from a task description, or from an MCP server."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from art_agents.cli.main import run_job
from art_agents.errors import settings_error
from art_agents.extras import require_extra

if TYPE_CHECKING:
    from art_agents.autorl.generation import Generation
    from art_agents.autorl.run_config import RunConfig

Opt = typer.Option
LEARNING_RATE_HELP = (
    "LoRA learning rate (default 5e-4, TrainConfig's; 1e-4 to 5e-5 for models of billions of parameters)."
)
PIPELINE_HELP = "Roll out the next steps while one trains, at most --max-steps-off-policy behind (default off)."
Pipeline = Annotated[bool | None, Opt("--pipeline/--no-pipeline", help=PIPELINE_HELP)]
Fresh = Annotated[bool, Opt("--fresh", help="Delete the run folder's previous run and start over.")]
RulerHints = Annotated[
    bool | None,
    Opt(
        "--ruler-hints/--no-ruler-hints",
        help="RULER's explanation of each rollout becomes its hint: training self-distils from the judge's words "
        "(TrainConfig.self_distill 1.0 unless set).",
    ),
]
REQUIRED = "Required (here or in --config)."
KEY_HELP = (
    "API key of the {role}. Default: its provider's variable (OPENAI_API_KEY for openai/...); a --{role}-api-base "
    "of your own needs none. A missing key stops the run before it starts."
)
BaseModel = Annotated[str | None, Opt(help=f"Hub id or local folder of the model to train. {REQUIRED}")]
JudgeApiBase = Annotated[str | None, Opt(help="OpenAI-compatible URL of the judge (your own server).")]
JudgeApiKey = Annotated[str | None, Opt(help=KEY_HELP.format(role="judge"))]
GeneratorApiBase = Annotated[str | None, Opt(help="OpenAI-compatible URL of the generator (your own server).")]
GeneratorApiKey = Annotated[str | None, Opt(help=KEY_HELP.format(role="generator"))]
StepsOffPolicy = Annotated[int | None, Opt(help="With --pipeline, how many steps stale a rollout may be (default 1).")]
# mcp-rl's own options
McpServer = Annotated[
    str | None,
    Opt(
        help='Command of a stdio MCP server, e.g. "uvx mcp-server-time" (uvx comes with uv: pip install uv). '
        "This or --url is required (here or in --config)."
    ),
]
RulerJudge = Annotated[
    str | None,
    Opt(help="LiteLLM model string of the RULER judge, e.g. openai/gpt-4.1-mini. This or --reward is required."),
]
Reward = Annotated[str | None, Opt(help="module:function (scenario, trajectory) -> float, instead of RULER.")]
RLSteps = Annotated[int | None, Opt(help="RL training steps (default 10; an SFT warmup adds one before them).")]
SftWarmup = Annotated[
    int | None, Opt(help="Before RL, fine-tune on the teacher's best of N rollouts per training scenario.")
]
GuideBelow = Annotated[
    float | None,
    Opt(help="During RL, a group whose best reward is below this gets the teacher's rollout (default off)."),
]
Temperature = Annotated[float | None, Opt(help="Sampling temperature the RL rollouts start at (default 1.0).")]
AdaptTemperature = Annotated[
    bool | None,
    Opt(
        "--adapt-temperature/--fixed-temperature",
        help="After a draw whose groups all tie, lower the temperature if they failed alike, raise it back if they "
        "succeeded alike (default on; a small model at 1.0 often fails every attempt alike).",
    ),
]
# autorl's own options
Task = Annotated[
    str | None, Opt(help="What the model should learn to do, in plain words. This or --task-file is required.")
]
Judge = Annotated[str | None, Opt(help=f"LiteLLM model string of the judge, e.g. openai/gpt-4.1-mini. {REQUIRED}")]
RetireAfter = Annotated[int | None, Opt(help="Draws without signal before an input is retired (default 2).")]
DryRun = Annotated[
    bool,
    Opt("--dry-run", help="Only generate (or show) the prompt, rubric and inputs; edit them, then run without it."),
]
C = TypeVar("C", bound="RunConfig")
R = TypeVar("R")


def _litellm_params(api_base: str | None, api_key: str | None) -> dict[str, Any]:
    return {"api_base": api_base, "api_key": api_key}


def _settings(kind: type[C], path: Path | None, flags: dict[str, Any], command: Callable[..., None]) -> C:
    """The run's settings, or exit 2 naming what is wrong in them."""
    import tomllib

    from pydantic import ValidationError

    sys.path[:0] = [str(Path.cwd())] + ([str(path.resolve().parent)] if path else [])  # for --reward modules
    try:
        return kind.load(path, flags)
    except tomllib.TOMLDecodeError as exc:
        typer.echo(f"error: {path}: {exc}", err=True)
        raise typer.Exit(2) from exc
    except ValidationError as exc:
        typer.echo(f"error: {settings_error(exc, path, command)}", err=True)
        raise typer.Exit(2) from exc


def _require_extras(settings: RunConfig, purpose: str) -> None:
    """Before anything starts: LiteLLM for the judge and generator, and the server a LocalBackend runs
    (only looked up: both are imported later, `litellm` alone takes seconds)."""
    require_extra("ruler", purpose=purpose, load=False)
    if settings.base_url is None:
        require_extra("server", purpose=f"{purpose} (the local server it starts; or set base_url)", load=False)


def _run(job: Callable[[], Awaitable[R]], out: Path) -> R:
    return run_job(job, lambda: f"every finished step is saved in {out}. Rerun the same command to continue.")


def mcp_rl(
    config: Annotated[Path | None, Opt(exists=True, help="TOML file with these settings; flags override it.")] = None,
    server: McpServer = None,
    url: Annotated[str | None, Opt(help="Streamable HTTP URL of an MCP server, instead of --server.")] = None,
    header: Annotated[list[str] | None, Opt(metavar="NAME=VALUE", help="HTTP header for --url; repeatable.")] = None,
    shared_session: Annotated[bool | None, Opt(help="One MCP session for all rollouts (read-only servers).")] = None,
    base_model: BaseModel = None,
    judge_model: RulerJudge = None,
    judge_api_base: JudgeApiBase = None,
    judge_api_key: JudgeApiKey = None,
    generator_model: Annotated[str | None, Opt(help="Writes the scenarios; default: the judge model.")] = None,
    generator_api_base: GeneratorApiBase = None,
    generator_api_key: GeneratorApiKey = None,
    reward: Reward = None,
    steps: RLSteps = None,
    group_size: Annotated[int | None, Opt(help="Rollouts per scenario (default 4).")] = None,
    groups_per_step: Annotated[int | None, Opt(help="Scenarios per step (default 4).")] = None,
    pipeline: Pipeline = None,
    ruler_hints: RulerHints = None,
    max_steps_off_policy: StepsOffPolicy = None,
    sft_warmup: SftWarmup = None,
    teacher_model: Annotated[str | None, Opt(help="Model name of the warmup's teacher at its endpoint.")] = None,
    teacher_api_base: Annotated[str | None, Opt(help="OpenAI-compatible URL of the teacher (default OpenAI).")] = None,
    teacher_api_key: Annotated[str | None, Opt(help="api_key for the teacher (default $OPENAI_API_KEY).")] = None,
    guide_below: GuideBelow = None,
    scenarios: Annotated[int | None, Opt(help="Training scenarios to generate (default 24).")] = None,
    val_scenarios: Annotated[int | None, Opt(help="Held-out scenarios (default 8).")] = None,
    max_turns: Annotated[int | None, Opt(help="Model calls per rollout (default 6).")] = None,
    max_tokens: Annotated[int | None, Opt(help="Tokens per model call (default 256).")] = None,
    temperature: Temperature = None,
    adapt_temperature: AdaptTemperature = None,
    learning_rate: Annotated[float | None, Opt(help=LEARNING_RATE_HELP)] = None,
    out: Annotated[Path | None, Opt(help="Run folder (default mcp-rl-run).")] = None,
    fresh: Fresh = False,
) -> None:
    """Train a model to use an MCP server's tools: scenarios, rollouts, RULER, GRPO, evaluation.

    Rerun the same command to continue an interrupted run.
    """
    from art_agents.autorl.mcp_rl import MCPRLConfig, run_mcp_rl

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
        "pipeline": pipeline,
        "ruler_hints": ruler_hints,
        "max_steps_off_policy": max_steps_off_policy,
        "sft_warmup": sft_warmup,
        "teacher_model": teacher_model,
        "teacher_params": _litellm_params(teacher_api_base, teacher_api_key),
        "guide_below": guide_below,
        "scenarios": scenarios,
        "val_scenarios": val_scenarios,
        "rollout": {"max_turns": max_turns, "max_tokens": max_tokens, "temperature": temperature},
        "temperature_schedule": {"adapt": adapt_temperature},
        "train": {"learning_rate": learning_rate},
        "out": out,
    }
    settings = _settings(MCPRLConfig, config, flags, mcp_rl)
    require_extra("mcp", purpose="art-agents mcp-rl")  # imported: it fails inside the session's own task
    _require_extras(settings, "art-agents mcp-rl")
    _echo_summary(_run(lambda: run_mcp_rl(settings, fresh=fresh, echo=typer.echo), settings.out))


def autorl(
    config: Annotated[Path | None, Opt(exists=True, help="TOML file with these settings; flags override it.")] = None,
    task: Task = None,
    task_file: Annotated[Path | None, Opt(exists=True, help="A file holding the task description.")] = None,
    base_model: BaseModel = None,
    judge_model: Judge = None,
    judge_api_base: JudgeApiBase = None,
    judge_api_key: JudgeApiKey = None,
    generator_model: Annotated[str | None, Opt(help="Writes inputs, prompt and rubric; default: the judge.")] = None,
    generator_api_base: GeneratorApiBase = None,
    generator_api_key: GeneratorApiKey = None,
    steps: Annotated[int | None, Opt(help="Total training steps (default 10).")] = None,
    group_size: Annotated[int | None, Opt(help="Rollouts per input (default 4).")] = None,
    groups_per_step: Annotated[int | None, Opt(help="Inputs per step (default 4).")] = None,
    pipeline: Pipeline = None,
    ruler_hints: RulerHints = None,
    max_steps_off_policy: StepsOffPolicy = None,
    inputs: Annotated[int | None, Opt(help="Training inputs to generate (default 32).")] = None,
    eval_inputs: Annotated[int | None, Opt(help="Held-out inputs (default 12).")] = None,
    eval_every: Annotated[int | None, Opt(help="Evaluate every N steps (default 5).")] = None,
    retire_after: RetireAfter = None,
    max_tokens: Annotated[int | None, Opt(help="Tokens per answer (default 256).")] = None,
    learning_rate: Annotated[float | None, Opt(help=LEARNING_RATE_HELP)] = None,
    out: Annotated[Path | None, Opt(help="Run folder (default autorl-run).")] = None,
    fresh: Fresh = False,
    dry_run: DryRun = False,
) -> None:
    """Train a model on a task described in words: invented inputs, a generated rubric, RULER, GRPO.

    Rerun the same command to continue an interrupted run.
    """
    from art_agents.autorl.from_description import AutoRLConfig, prepare_run, run_autorl

    if task is not None and task_file is not None:
        raise typer.BadParameter("give --task or --task-file, not both")
    flags: dict[str, Any] = {
        "task": task_file.read_text(encoding="utf-8") if task_file else task,
        "base_model": base_model,
        "judge_model": judge_model,
        "judge_params": _litellm_params(judge_api_base, judge_api_key),
        "generator_model": generator_model,
        "generator_params": _litellm_params(generator_api_base, generator_api_key),
        "steps": steps,
        "group_size": group_size,
        "groups_per_step": groups_per_step,
        "pipeline": pipeline,
        "ruler_hints": ruler_hints,
        "max_steps_off_policy": max_steps_off_policy,
        "inputs": inputs,
        "eval_inputs": eval_inputs,
        "eval_every": eval_every,
        "retire_after": retire_after,
        "rollout": {"max_tokens": max_tokens},
        "train": {"learning_rate": learning_rate},
        "out": out,
    }
    settings = _settings(AutoRLConfig, config, flags, autorl)
    _require_extras(settings, "art-agents autorl")
    if dry_run:
        _run(lambda: _show_prepared(prepare_run, settings, fresh), settings.out)
        return
    _echo_summary(_run(lambda: run_autorl(settings, fresh=fresh, echo=typer.echo), settings.out))


async def _show_prepared(prepare_run: Callable[..., Awaitable[Any]], settings: Any, fresh: bool) -> None:
    """`--dry-run`: generate (or load) the system prompt, rubric and inputs, and show them for editing."""
    folder, data = await prepare_run(settings, fresh=fresh, echo=typer.echo)
    typer.echo(f"\nsystem prompt ({folder.file('system_prompt.md')}):\n{data.setup.system_prompt}")
    typer.echo(f"\nrubric ({folder.file('rubric.md')}):\n{data.setup.rubric}")
    typer.echo(f"\n{len(data.pool)} training inputs, e.g.:")
    for item in data.pool[:5]:
        typer.echo(f"  [difficulty {item.difficulty}] {item.input[:200]}")
    typer.echo(f"\n{len(data.eval_inputs)} held-out inputs. Generator cost so far: {_cost(data.generation)}.")
    typer.echo("Edit the files above if you like, then run the same command without --dry-run.")


def _echo_summary(summary: Any) -> None:
    typer.echo(summary.table())
    typer.echo(f"run folder: {summary.out}")


def _cost(generation: Generation | None) -> str:
    if generation is None:
        return "$0.0000 (nothing was generated)"
    if not generation.cost_known:
        return f"unknown (LiteLLM has no price for {generation.generator_model})"
    return f"${generation.cost_usd:.4f}"


def register(app: typer.Typer) -> None:
    app.command("autorl")(autorl)
    app.command("mcp-rl")(mcp_rl)
