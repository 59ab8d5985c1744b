"""MCP•RL: point at an MCP server, invent tasks from its tools, train a model to use them.

`run_mcp_rl(config)` is the whole pipeline behind `art-agents mcp-rl`: read the server's tools,
generate scenarios (or reuse the saved ones), evaluate the base model on the val split, train with
RULER rewards (or the user's reward function), evaluate again, and summarise. Everything lives in
the run folder, so rerunning the same command resumes at the last saved step.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import Field

from art_agents.autorl.eval_settings import EvalSettings
from art_agents.autorl.generation import Generation, GenerationError
from art_agents.autorl.guidance import Guide
from art_agents.autorl.mcp_rl_config import MCPRLConfig
from art_agents.autorl.run_config import RunSummary, registered_model
from art_agents.autorl.run_eval import RunEvaluation, held_out_evaluation
from art_agents.autorl.run_folder import SCENARIOS_FILE, RunFolder
from art_agents.autorl.scenarios import (
    Scenario,
    ScenarioDraft,
    describe_server,
    generate_scenarios,
    split_scenarios,
)
from art_agents.autorl.scoring import GroupScorer, RewardFn
from art_agents.autorl.sft_warmup import Warmup, check_teacher, pending, sft_warmup, teacher
from art_agents.autorl.temperature import AdaptiveTemperature
from art_agents.autorl.tool_rollout import server_rollout
from art_agents.evaluation.run import Evaluation
from art_agents.jobs import load_function
from art_agents.loop.train import StepRecord, train_loop
from art_agents.model import TrainableModel

Echo = Callable[[str], None]


class MCPRLSummary(RunSummary):
    steps: list[StepRecord] = Field(default_factory=list, description="Steps trained by this invocation.")
    warmup: Warmup | None = Field(None, description="The SFT warmup before RL, if the run has one.")


async def prepare_scenarios(
    config: MCPRLConfig, folder: RunFolder, session: Any, echo: Echo, given: Sequence[ScenarioDraft | str] | None = None
) -> list[Scenario]:
    """The saved scenarios; else the `given` ones, or new ones from the generator; split and saved."""
    saved = folder.read_jsonl(SCENARIOS_FILE, Scenario)
    if saved is not None:
        echo(f"reusing {len(saved)} scenarios from {folder.file(SCENARIOS_FILE)}")
        return saved
    if given is not None:
        drafts = [ScenarioDraft(task=g, difficulty=1) if isinstance(g, str) else g for g in given]
        scenarios = split_scenarios(drafts, config.val_scenarios, config.seed)
        folder.write_jsonl(SCENARIOS_FILE, list(scenarios))
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
    folder.write_jsonl(SCENARIOS_FILE, list(scenarios))  # last: its presence means generation finished
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
    folder = RunFolder(config.out)
    reward = await _preflight(config, folder, reward, scenarios, fresh)
    server = config.mcp_server
    async with server:
        async with server.session() as probe:  # the server starts (a missing command fails here)
            if folder.claim(_task(config), fresh=fresh):
                echo(f"resuming the run in {folder.path}")
            try:
                tasks = await prepare_scenarios(config, folder, probe, echo, scenarios)
            except GenerationError as exc:
                raise exc.saved(folder.saved()) from exc
        train = [s for s in tasks if s.split == "train"]
        val = [s for s in tasks if s.split == "val"]
        scorer = GroupScorer(
            {s.id: s for s in tasks},
            reward=reward,
            judge_model=config.judge_model,
            rubric=config.rubric,
            judge_params=config.judge_params,
            hints=config.ruler_hints,
        )
        temperature = AdaptiveTemperature(config.rollout.temperature, config.temperature_schedule)
        eval_rollout = config.rollout.model_copy(update={"temperature": config.eval_temperature})
        held_out = held_out_evaluation(folder, config, val, scorer, eval_rollout, server=server)
        recorded = server.model_dump(mode="json", exclude={"headers", "env"})
        EvalSettings.of(config, eval_rollout, reward=reward, rubric=config.rubric, mcp_server=recorded).save(folder)

        async def rollout(model: Any, scenario: Scenario) -> Any:
            """The tool rollout at the temperature of the moment (the teacher's warmup runs at the starting one)."""
            settings = config.rollout.model_copy(update={"temperature": temperature.current})
            return await server_rollout(model, scenario, server, settings)

        async with registered_model(config, folder) as model:
            await _evaluation(held_out, model, 0, echo)
            warmup, records = await _train(config, folder, model, rollout, train, scorer, temperature, echo)
            step = await model.get_step()
            final = await _evaluation(held_out, model, step, echo)
    summary = MCPRLSummary(
        out=folder.path,
        step=step,
        evaluation=final.summary,
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


async def _preflight(
    config: MCPRLConfig,
    folder: RunFolder,
    reward: RewardFn | None,
    scenarios: Sequence[ScenarioDraft | str] | None,
    fresh: bool,
) -> RewardFn | None:
    """Every check before the folder is claimed: a reward or a judge, the keys it needs, the teacher; the reward."""
    if reward is None and config.reward:
        reward = load_function(config.reward, "reward")
    if reward is None and config.judge_model is None:
        raise ValueError("give --judge-model (RULER rewards) or --reward module:function")
    resuming = folder.check(_task(config), fresh=fresh)
    generating = scenarios is None and not (resuming and folder.file(SCENARIOS_FILE).is_file())
    config.check_keys(judge=reward is None, generator=generating)
    if (config.sft_warmup and not (resuming and not pending(folder))) or config.guide_below is not None:
        await check_teacher(teacher(config))
    return reward


async def _train(
    config: MCPRLConfig,
    folder: RunFolder,
    model: TrainableModel,
    rollout: Callable[..., Any],
    train: list[Scenario],
    scorer: GroupScorer,
    temperature: AdaptiveTemperature,
    echo: Echo,
) -> tuple[Warmup | None, list[StepRecord]]:
    """The SFT warmup (if asked and not done) and the RL steps still to train, from the model's current step."""
    step = await model.get_step()
    warmup = None
    if config.sft_warmup and (step == 0 or folder.file("warmup.json").is_file()):
        warmup = await sft_warmup(config, folder, model, rollout, train, scorer, echo)
        step = await model.get_step()
    last = config.steps + (warmup.sft_step if warmup else 0)  # --steps counts RL steps
    if step >= last:
        return warmup, []
    if step:
        echo(f"continuing at step {step} of {last}")
    guide = None if config.guide_below is None else Guide(teacher(config), rollout, scorer, config.guide_below)
    records = await train_loop(
        model,
        rollout,
        train,
        steps=last - step,
        after_each=guide or scorer,
        after_train=_StepEcho(scorer, temperature, echo),
        **config.loop_options(),
    )
    return warmup, records


class _StepEcho:
    """Prints each step as it ends, with the temperature its rollouts were sampled at (and the next draw's, when a
    draw without a reward spread moves it) and the seconds of its phases: rollouts (which include scoring, done as
    each group finishes), scoring (reward function or judge) and training. The temperature joins the record's metrics."""

    def __init__(self, scorer: GroupScorer, temperature: AdaptiveTemperature, echo: Echo) -> None:
        self.scorer, self.temperature, self.echo, self.scored = scorer, temperature, echo, scorer.seconds

    async def __call__(self, record: StepRecord, groups: list[Any]) -> None:
        scoring, self.scored = self.scorer.seconds - self.scored, self.scorer.seconds
        sampled = [t.metrics["temperature"] for g in groups for t in g.trajectories if "temperature" in t.metrics]
        used = sum(sampled) / len(sampled) if sampled else self.temperature.current
        record.metrics["rollout/temperature"] = used
        guided = sum(bool(t.metadata.get("teacher")) for g in groups for t in g.trajectories)
        if guided:
            record.metrics["rollout/guided_groups"] = guided
        following = self.temperature.after_draw(record.advanced, record.reward_mean)
        moved = f", next draw at {following:g}" if following != used else ""
        state = "" if record.advanced else " (no reward spread: nothing trained)"
        state += f" ({guided} groups guided by the teacher)" if guided else ""
        self.echo(
            f"step {record.step}{state}: reward {record.reward_mean:.3f} over {record.rollouts} rollouts at "
            f"temperature {used:g}{moved}; seconds: rollouts {record.rollout_s:.1f} (scoring {scoring:.1f}), "
            f"train {record.train_s:.1f}"
        )


async def _evaluation(held_out: RunEvaluation, model: TrainableModel, step: int, echo: Echo) -> Evaluation:
    """Step 0 against `step` on the held-out scenarios, as `art-agents eval RUN_FOLDER` evaluates them."""
    began = time.perf_counter()
    evaluation = await held_out.steps(model, sorted({0, step}))
    last = evaluation.summary.models[-1]
    figures = {"reward": last.mean_reward or 0.0, **last.metrics, "failed": float(last.failed_scenarios)}
    keys = ("reward", "completed", "tool_calls", "tool_errors", "failed")
    headline = json.dumps({k: round(figures[k], 3) for k in keys if k in figures})
    echo(f"eval at step {step}: {headline} ({time.perf_counter() - began:.1f} s)")
    return evaluation
