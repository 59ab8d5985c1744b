"""MCP•RL: point at an MCP server, invent tasks from its tools, train a model to use them.

`run_mcp_rl(config)` is the whole pipeline behind `art-agents mcp-rl`: read the server's tools,
generate scenarios (or reuse the saved ones), evaluate the base model on the val split, train with
RULER rewards (or the user's reward function), evaluate again, and summarise. Everything lives in
the run folder, so rerunning the same command resumes at the last saved step.
"""

from __future__ import annotations

import functools
import json
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from art_agents.autorl.evaluation import EvalReport, evaluate
from art_agents.autorl.run_folder import RunFolder
from art_agents.autorl.scenarios import (
    Scenario,
    ScenarioDraft,
    describe_server,
    generate_scenarios,
    split_scenarios,
)
from art_agents.autorl.scoring import TOOL_USE_RUBRIC, GroupScorer, RewardFn
from art_agents.autorl.tool_rollout import ToolRolloutConfig, server_rollout
from art_agents.errors import ArtError
from art_agents.loop import StepRecord, load_function, train_loop
from art_agents.model import TrainableModel
from art_agents.schema import Schema
from art_agents.train_config import ModelConfig, TrainConfig

Echo = Callable[[str], None]


class MCPRLConfig(Schema):
    """An MCP•RL run; the TOML form of `art-agents mcp-rl` uses these names."""

    server: list[str] | str | None = Field(None, description="Command line of a stdio MCP server.")
    url: str | None = Field(None, description="Streamable HTTP URL of an MCP server (instead of `server`).")
    headers: dict[str, str] = Field(default_factory=dict, description="HTTP headers for `url` (auth).")
    shared_session: bool = Field(
        False, description="One MCP session for all rollouts; only for servers without side effects."
    )
    tool_timeout_s: float = Field(30.0, gt=0, description="Per tool call.")
    base_model: str = Field(description="Hub id or local folder of the model to train.")
    name: str = "mcp-agent"
    project: str = "mcp-rl"
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=lambda: TrainConfig(learning_rate=1e-4))
    rollout: ToolRolloutConfig = Field(default_factory=ToolRolloutConfig)
    judge_model: str | None = Field(None, description="LiteLLM model string of the RULER judge.")
    judge_params: dict[str, Any] = Field(default_factory=dict, description="Extra LiteLLM keywords (api_base...).")
    rubric: str = TOOL_USE_RUBRIC
    reward: str | None = Field(None, description="`module:function` (scenario, trajectory) -> float, instead of RULER.")
    generator_model: str | None = Field(None, description="Writes the scenarios; defaults to the judge model.")
    generator_params: dict[str, Any] = Field(default_factory=dict)
    scenarios: int = Field(24, ge=1, description="Training scenarios to generate.")
    val_scenarios: int = Field(8, ge=1, description="Held-out scenarios, never trained on.")
    steps: int = Field(10, ge=1, description="Total training steps of the run (a rerun continues to this).")
    groups_per_step: int = Field(4, ge=1)
    group_size: int = Field(4, ge=2, description="Rollouts per scenario in a group.")
    eval_temperature: float = Field(0.0, ge=0, description="Sampling temperature of evaluation (0 = greedy).")
    max_exceptions: float = Field(0.1, ge=0, description="Failed rollouts tolerated per step (count or fraction).")
    seed: int = 0
    out: Path = Field(Path("mcp-rl-run"), description="Run folder: scenarios, evaluations, checkpoints.")
    base_url: str | None = Field(None, description="A running art-agents server; default: start a local one.")
    api_key: str | None = None

    @model_validator(mode="after")
    def _one_server(self) -> MCPRLConfig:
        if (self.server is None) == (self.url is None):
            raise ValueError("give exactly one MCP server: a command (`server`, --server) or a URL (`url`, --url)")
        return self

    @classmethod
    def load(cls, path: Path | None, flags: dict[str, Any]) -> MCPRLConfig:
        """Settings from a TOML file (optional) with command-line `flags` over it (None = not given).

        A relative `out` in the file is relative to the file's folder.
        """
        data = tomllib.loads(path.read_text(encoding="utf-8")) if path else {}
        config = cls.model_validate(_merge(data, flags))
        if path and "out" in data and flags.get("out") is None and not Path(data["out"]).is_absolute():
            config = config.model_copy(update={"out": path.resolve().parent / data["out"]})
        return config

    def mcp_server(self) -> Any:
        from art_agents.integrations.mcp import MCPServer

        return MCPServer.parse(
            self.server,
            url=self.url,
            headers=self.headers,
            shared=self.shared_session,
            tool_timeout_s=self.tool_timeout_s,
        )

    def generation_params(self) -> tuple[str, dict[str, Any]]:
        if self.generator_model is not None:
            return self.generator_model, self.generator_params
        if self.judge_model is None:
            raise ArtError(
                "scenarios must be generated: give --generator-model (or --judge-model, which it defaults to)"
            )
        return self.judge_model, self.generator_params or self.judge_params


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` over `base`, nested tables merged; None values and empty tables leave `base` alone."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict):
            nested = _merge(merged.get(key) or {}, value)
            if nested:
                merged[key] = nested
        elif value is not None:
            merged[key] = value
    return merged


class Generation(Schema):
    """What writing the scenarios cost (saved beside them)."""

    generator_model: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    duplicates_dropped: int


class MCPRLSummary(Schema):
    out: Path
    step: int
    before: EvalReport
    after: EvalReport
    steps: list[StepRecord] = Field(default_factory=list, description="Steps trained by this invocation.")
    judge_cost_usd: float = Field(0.0, description="Judge cost of this invocation (training and evaluation).")
    generation: Generation | None = None

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
        return "\n".join(lines)


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
    record = Generation(
        generator_model=generator,
        calls=len(generated.calls),
        prompt_tokens=generated.prompt_tokens,
        completion_tokens=generated.completion_tokens,
        cost_usd=generated.cost_usd,
        duplicates_dropped=generated.duplicates_dropped,
    )
    folder.write_json("generation.json", record)
    folder.write_jsonl("scenarios.jsonl", list(scenarios))  # last: its presence means generation finished
    return scenarios


def _task(config: MCPRLConfig) -> dict[str, Any]:
    """What identifies the run: a rerun with other values here is another run."""
    return {
        "kind": "mcp-rl",
        "server": config.server if config.url is None else config.url,
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
    from art_agents.backend import LocalBackend, RemoteBackend

    if reward is None and config.reward:
        reward = load_function(config.reward, "reward")
    if reward is None and config.judge_model is None:
        raise ValueError("give --judge-model (RULER rewards) or --reward module:function")
    folder = RunFolder(config.out)
    if folder.claim(_task(config), fresh=fresh):
        echo(f"resuming the run in {folder.path}")
    server = config.mcp_server()
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
        backend = RemoteBackend(config.base_url, config.api_key) if config.base_url else LocalBackend(folder.art_path)
        model = TrainableModel(
            name=config.name, project=config.project, base_model=config.base_model, config=config.model
        )
        try:
            await model.register(backend)
            step = await model.get_step()
            before = await _evaluation(config, folder, model, server, val, scorer, step=0, current=step, echo=echo)
            records: list[StepRecord] = []
            if step < config.steps:
                if step:
                    echo(f"continuing at step {step} of {config.steps}")
                records = await train_loop(
                    model,
                    functools.partial(server_rollout, server=server, config=config.rollout),
                    train,
                    steps=config.steps - step,
                    groups_per_step=config.groups_per_step,
                    rollouts_per_group=config.group_size,
                    train_config=config.train,
                    after_each=scorer,
                    max_exceptions=config.max_exceptions,
                    seed=config.seed,
                )
                for record in records:
                    echo(f"step {record.step}: reward {record.reward_mean:.3f} over {record.rollouts} rollouts")
            step = await model.get_step()
            after = await _evaluation(config, folder, model, server, val, scorer, step=step, current=step, echo=echo)
        finally:
            await backend.close()
    summary = MCPRLSummary(
        out=folder.path,
        step=step,
        before=before,
        after=after,
        steps=records,
        judge_cost_usd=scorer.cost_usd,
        generation=folder.read_json("generation.json", Generation),
    )
    folder.write_json("summary.json", summary)
    return summary


async def _evaluation(
    config: MCPRLConfig,
    folder: RunFolder,
    model: TrainableModel,
    server: Any,
    val: list[Scenario],
    scorer: GroupScorer,
    *,
    step: int,
    current: int,
    echo: Echo,
) -> EvalReport:
    """The saved evaluation of `step`, or a new one of the model now served (which must be that step)."""
    name = f"eval/step_{step:04d}.json"
    saved = folder.read_json(name, EvalReport)
    if saved is not None:
        return saved
    if step != current:
        raise ArtError(
            f"{folder.path} has checkpoints up to step {current} but no evaluation of step {step}; "
            "rerun with --fresh to start over"
        )
    rollout_config = config.rollout.model_copy(update={"temperature": config.eval_temperature})
    report = await evaluate(
        val,
        lambda s: server_rollout(model, s, server, rollout_config),
        scorer,
        step=step,
        pbar_desc=f"eval step {step}",
    )
    folder.write_json(name, report)
    echo(f"eval at step {step}: {json.dumps({k: round(v, 3) for k, v in _headline(report).items()})}")
    return report


def _headline(report: EvalReport) -> dict[str, float]:
    return {
        "score": report.score,
        "completed": report.completion_rate,
        "tool_errors": report.tool_error_rate,
        "failed": float(report.failed),
    }
