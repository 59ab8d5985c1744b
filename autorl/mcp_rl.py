"""MCP•RL: point at an MCP server, invent tasks from its tools, train a model to use them.

`run_mcp_rl(config)` is the whole pipeline behind `art-agents mcp-rl`: read the server's tools,
generate scenarios (or reuse the saved ones), evaluate the base model on the val split, train with
RULER rewards (or the user's reward function), evaluate again, and summarise. Everything lives in
the run folder, so rerunning the same command resumes at the last saved step.
"""

from __future__ import annotations

import functools
import json
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from art_agents.autorl.evaluation import EvalReport, evaluate, saved_evaluation
from art_agents.autorl.generation import Generation
from art_agents.autorl.run_config import RunConfig, RunSummary, registered_model
from art_agents.autorl.run_folder import RunFolder
from art_agents.autorl.scenarios import (
    Scenario,
    ScenarioDraft,
    describe_server,
    generate_scenarios,
    split_scenarios,
)
from art_agents.autorl.scoring import TOOL_USE_RUBRIC, GroupScorer, RewardFn
from art_agents.autorl.sft_warmup import Warmup, check_teacher, pending, sft_warmup, teacher
from art_agents.autorl.tool_rollout import ToolRolloutConfig, server_rollout
from art_agents.integrations.mcp import MCPServer
from art_agents.loop import StepRecord, load_function, train_loop
from art_agents.model import TrainableModel
from art_agents.train_config import TrainSFTConfig

Echo = Callable[[str], None]
# The flat keys of `art-agents mcp-rl` and its TOML form that fill `MCPRLConfig.mcp_server`: their MCPServer.parse keyword.
FLAT_SERVER_KEYS = {
    "server": "command",
    "url": "url",
    "headers": "headers",
    "shared_session": "shared",
    "tool_timeout_s": "tool_timeout_s",
}


class MCPRLConfig(RunConfig):
    """An MCP•RL run; the TOML form of `art-agents mcp-rl` uses these names."""

    mcp_server: MCPServer = Field(
        description="The MCP server whose tools the model learns. The CLI and the TOML form give it as the flat "
        "keys `server` (a stdio command line), `url` (streamable HTTP, instead of `server`), `headers` (for `url`), "
        "`shared_session` (one session for all rollouts: servers without side effects only) and `tool_timeout_s`."
    )
    name: str = "mcp-agent"
    project: str = "mcp-rl"
    rollout: ToolRolloutConfig = Field(default_factory=ToolRolloutConfig)
    rubric: str = TOOL_USE_RUBRIC
    reward: str | None = Field(None, description="`module:function` (scenario, trajectory) -> float, instead of RULER.")
    scenarios: int = Field(24, ge=1, description="Training scenarios to generate.")
    val_scenarios: int = Field(8, ge=1, description="Held-out scenarios, never trained on.")
    out: Path = Field(Path("mcp-rl-run"), description="Run folder: scenarios, evaluations, checkpoints.")
    sft_warmup: int = Field(
        0, ge=0, description="Teacher rollouts per training scenario for an SFT warmup before RL (0: no warmup)."
    )
    teacher_model: str | None = Field(None, description="Model name of the warmup's teacher at its endpoint.")
    teacher_params: dict[str, Any] = Field(
        default_factory=dict, description="`api_base` (default OpenAI's) and `api_key` of the teacher's endpoint."
    )
    sft_min_reward: float = Field(0.5, description="Teacher rollouts scored below this are not imitated.")
    sft: TrainSFTConfig = Field(default_factory=TrainSFTConfig, description="The warmup's `train_sft` settings.")

    @model_validator(mode="before")
    @classmethod
    def _flat_server(cls, data: Any) -> Any:
        """The flat server keys of the CLI and the TOML form become `mcp_server`."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        flat = {key: data.pop(key) for key in FLAT_SERVER_KEYS if key in data}
        if "mcp_server" in data:
            if flat:
                raise ValueError(f"give `mcp_server` or the flat keys ({', '.join(flat)}), not both")
            return data
        options = {FLAT_SERVER_KEYS[key]: value for key, value in flat.items()}
        if (options.get("command") is None) == (options.get("url") is None):
            raise ValueError("give exactly one MCP server: a command (`server`, --server) or a URL (`url`, --url)")
        data["mcp_server"] = MCPServer.parse(**options)
        return data

    @model_validator(mode="after")
    def _teacher_for_warmup(self) -> MCPRLConfig:
        if self.sft_warmup and not self.teacher_model:
            raise ValueError("the SFT warmup needs a teacher: give --teacher-model (and --teacher-api-base) too")
        return self


class MCPRLSummary(RunSummary):
    steps: list[StepRecord] = Field(default_factory=list, description="Steps trained by this invocation.")
    warmup: Warmup | None = Field(None, description="The SFT warmup before RL, if the run has one.")

    def table(self) -> str:
        rows = [
            ("judge score" if self.before.judge_cost_usd or self.after.judge_cost_usd else "score", "score"),
            ("task completed", "completion_rate"),
            ("tool-call error rate", "tool_error_rate"),
            ("tool calls per rollout", "tool_calls_per_rollout"),
        ]
        lines = [
            f"{'val (' + str(self.before.scenarios) + ' scenarios)':<26}{'base':>10}{'step ' + str(self.step):>10}"
        ]
        for label, key in rows:
            lines.append(f"{label:<26}{getattr(self.before, key):>10.3f}{getattr(self.after, key):>10.3f}")
        return "\n".join(lines + self.spend_lines())


async def prepare_scenarios(
    config: MCPRLConfig, folder: RunFolder, session: Any, echo: Echo, given: Sequence[ScenarioDraft | str] | None = None
) -> list[Scenario]:
    """The saved scenarios; else the `given` ones, or new ones from the generator; split and saved."""
    saved = folder.read_jsonl("scenarios.jsonl", Scenario)
    if saved is not None:
        echo(f"reusing {len(saved)} scenarios from {folder.file('scenarios.jsonl')}")
        return saved
    if given is not None:
        drafts = [ScenarioDraft(task=g, difficulty=1) if isinstance(g, str) else g for g in given]
        scenarios = split_scenarios(drafts, config.val_scenarios, config.seed)
        folder.write_jsonl("scenarios.jsonl", list(scenarios))
        return scenarios
    generator, params = config.generation_params()
    description = describe_server(session.openai_tools(), session.instructions, await session.list_resources())
    total = config.scenarios + config.val_scenarios
    echo(f"generating {total} scenarios with {generator}")
    generated = await generate_scenarios(generator, description, total, litellm_params=params)
    scenarios = split_scenarios(generated.items, config.val_scenarios, config.seed)
    folder.write_json(
        "generation.json", Generation(generator_model=generator).plus(generated.calls, generated.duplicates_dropped)
    )
    folder.write_jsonl("scenarios.jsonl", list(scenarios))  # last: its presence means generation finished
    return scenarios


def _task(config: MCPRLConfig) -> dict[str, Any]:
    """What identifies the run: a rerun with other values here is another run."""
    return {
        "kind": "mcp-rl",
        "server": config.mcp_server.url or shlex.join(config.mcp_server.command or []),
        "base_model": config.base_model,
        "name": config.name,
        "project": config.project,
    }


async def run_mcp_rl(
    config: MCPRLConfig,
    *,
    reward: RewardFn | None = None,
    scenarios: Sequence[ScenarioDraft | str] | None = None,
    fresh: bool = False,
    echo: Echo = print,
) -> MCPRLSummary:
    """The whole MCP•RL pipeline; resumes from the run folder when it holds this run.

    `reward` (scenario, trajectory) -> float replaces RULER and `config.reward`; `scenarios`
    (tasks you already have) replace generation. Both only matter on a run's first start.
    """
    if reward is None and config.reward:
        reward = load_function(config.reward, "reward")
    if reward is None and config.judge_model is None:
        raise ValueError("give --judge-model (RULER rewards) or --reward module:function")
    folder = RunFolder(config.out)
    if folder.claim(_task(config), fresh=fresh):
        echo(f"resuming the run in {folder.path}")
    if config.sft_warmup and pending(folder):
        await check_teacher(teacher(config))
    server = config.mcp_server
    async with server:
        async with server.session() as probe:
            tasks = await prepare_scenarios(config, folder, probe, echo, scenarios)
        train = [s for s in tasks if s.split == "train"]
        val = [s for s in tasks if s.split == "val"]
        scorer = GroupScorer(
            {s.id: s for s in tasks},
            reward=reward,
            judge_model=config.judge_model,
            rubric=config.rubric,
            judge_params=config.judge_params,
        )
        rollout = functools.partial(server_rollout, server=server, config=config.rollout)
        async with registered_model(config, folder) as model:
            step = await model.get_step()
            before = await _evaluation(config, folder, model, server, val, scorer, step=0, current=step, echo=echo)
            warmup = None
            if config.sft_warmup and (step == 0 or folder.file("warmup.json").is_file()):
                warmup = await sft_warmup(config, folder, model, rollout, train, scorer, echo)
                step = await model.get_step()
            last = config.steps + (warmup.sft_step if warmup else 0)  # --steps counts RL steps
            records: list[StepRecord] = []
            if step < last:
                if step:
                    echo(f"continuing at step {step} of {last}")
                records = await train_loop(
                    model,
                    rollout,
                    train,
                    steps=last - step,
                    groups_per_step=config.groups_per_step,
                    rollouts_per_group=config.group_size,
                    train_config=config.train,
                    after_each=scorer,
                    max_exceptions=config.max_exceptions,
                    seed=config.seed,
                    after_train=_StepEcho(scorer, echo),
                )
            step = await model.get_step()
            after = await _evaluation(config, folder, model, server, val, scorer, step=step, current=step, echo=echo)
    summary = MCPRLSummary(
        out=folder.path,
        step=step,
        before=before,
        after=after,
        steps=records,
        warmup=warmup,
        judge_cost_usd=scorer.cost_usd,
        judge_cost_known=scorer.cost_known,
        judge_prompt_tokens=scorer.prompt_tokens,
        judge_completion_tokens=scorer.completion_tokens,
        generation=folder.read_json("generation.json", Generation),
    )
    folder.write_json("summary.json", summary)
    return summary


class _StepEcho:
    """Prints each step as it ends, with the seconds of its phases: rollouts (which include scoring, done as each
    group finishes), scoring (reward function or judge) and training."""

    def __init__(self, scorer: GroupScorer, echo: Echo) -> None:
        self.scorer, self.echo, self.scored = scorer, echo, scorer.seconds

    async def __call__(self, record: StepRecord, groups: list[Any]) -> None:
        scoring, self.scored = self.scorer.seconds - self.scored, self.scorer.seconds
        state = "" if record.advanced else " (no reward spread: nothing trained)"
        self.echo(
            f"step {record.step}{state}: reward {record.reward_mean:.3f} over {record.rollouts} rollouts; seconds: "
            f"rollouts {record.rollout_s:.1f} (scoring {scoring:.1f}), train {record.train_s:.1f}"
        )


async def _evaluation(
    config: MCPRLConfig,
    folder: RunFolder,
    model: TrainableModel,
    server: MCPServer,
    val: list[Scenario],
    scorer: GroupScorer,
    *,
    step: int,
    current: int,
    echo: Echo,
) -> EvalReport:
    rollout_config = config.rollout.model_copy(update={"temperature": config.eval_temperature})

    async def compute() -> EvalReport:
        began = time.perf_counter()
        report = await evaluate(
            val,
            lambda s: server_rollout(model, s, server, rollout_config),
            scorer,
            step=step,
            pbar_desc=f"eval step {step}",
        )
        headline = json.dumps({k: round(v, 3) for k, v in _headline(report).items()})
        echo(f"eval at step {step}: {headline} ({time.perf_counter() - began:.1f} s)")
        return report

    return await saved_evaluation(folder, step, current, compute)


def _headline(report: EvalReport) -> dict[str, float]:
    return {
        "score": report.score,
        "completed": report.completion_rate,
        "tool_errors": report.tool_error_rate,
        "failed": float(report.failed),
    }
