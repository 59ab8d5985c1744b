"""An `autorl` or `mcp-rl` run's held-out evaluation through `art.evaluate`: the one path that the run's own
step-0 vs step-N evaluation and `art-agents eval RUN_FOLDER` both take, so the two print the same table.

The rollout is the run's own (`text_rollout` under the saved system prompt, or `server_rollout` against the run's
MCP server) with the rollout settings at the evaluation temperature, scored as training scores: each rollout a
group of its own for the judge (RULER by the run's rubric) or the reward function. Where RULER scores, each model's
answers are also judged side by side against the first model's (`art_agents.autorl.versus_base`). What
`eval RUN_FOLDER` needs beyond the folder's data is in its `eval_settings.json` (`art_agents.autorl.eval_settings`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from art_agents.autorl.eval_settings import EvalSettings
from art_agents.autorl.run_config import RunConfig, registered_model
from art_agents.autorl.run_folder import EVAL_FILE, RUBRIC_FILE, SCENARIOS_FILE, SYSTEM_PROMPT_FILE, RunFolder
from art_agents.autorl.scoring import GroupScorer, RewardFn
from art_agents.errors import ArtError, SetupError
from art_agents.evaluation.run import Evaluation, evaluate
from art_agents.model import Model, TrainableModel
from art_agents.ruler.judge import RulerError
from art_agents.trajectory import Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from art_agents.autorl.text_rollout import TextRolloutConfig
    from art_agents.autorl.tool_rollout import ToolRolloutConfig
    from art_agents.integrations.mcp import MCPServer

Rollout = Callable[[Model, Any], Awaitable[Trajectory]]
HELDOUT = "heldout"  # the evaluation's name: its files are eval/heldout/ in the run folder


@dataclass
class RunEvaluation:
    """What `art.evaluate` needs from a run: the scored rollout, the held-out scenarios, the run's model; and what
    its pairwise judge needs: each scenario's request, the instructions the model answered under."""

    folder: RunFolder
    rollout: Rollout
    heldout: list[Any]
    config: RunConfig
    scorer: GroupScorer
    requests: dict[str, str]
    instructions: str | None = None

    @property
    def name(self) -> str:
        return self.config.name

    def registered(self) -> AbstractAsyncContextManager[TrainableModel]:
        """The run's model on a local server over the folder's art path, for its steps."""
        return registered_model(self.config, self.folder)

    async def judged(self, evaluation: Evaluation) -> Evaluation:
        """`evaluation` with RULER-judged win rates against its first model, where RULER scored (rewards relative)."""
        if self.scorer.reward is not None:
            return evaluation
        from art_agents.autorl.versus_base import judge_versus_first

        return await judge_versus_first(
            evaluation, self.requests, self.scorer, instructions=self.instructions, seed=self.config.seed
        )

    async def steps(self, model: TrainableModel, steps: Sequence[int]) -> Evaluation:
        """The run's own evaluation of its `steps` (saved under eval/heldout/: a step evaluated before is reused)."""
        return await self.compare([f"{model.name}@{step}" for step in steps], model, f"eval step {steps[-1]}")

    async def compare(
        self, models: Sequence[str], steps_of: TrainableModel | None = None, pbar_desc: str | None = None
    ) -> Evaluation:
        """`models` on the held-out scenarios, saved in the run folder's eval/heldout/, judged where RULER scored."""
        evaluation = await evaluate(
            self.rollout,
            self.heldout,
            models,
            name=HELDOUT,
            out=self.folder.path,
            steps_of=steps_of,
            pbar_desc=pbar_desc,
        )
        return await self.judged(evaluation)


def scored_alone(run_one: Rollout, scorer: GroupScorer) -> Rollout:
    """`run_one` with its trajectory scored as training scores it (a group of one). A judge that cannot score stops
    the evaluation (a `SetupError`) instead of counting as the model's failed rollout."""

    async def rollout(model: Model, scenario: Any) -> Trajectory:
        trajectory = await run_one(model, scenario)
        try:
            group = await scorer(TrajectoryGroup([trajectory]))
        except RulerError as exc:
            raise SetupError(str(exc)) from exc
        if group is None or not group.trajectories:
            raise ArtError(f"the judge gave no score for scenario {getattr(scenario, 'id', scenario)}")
        return group.trajectories[0]

    return rollout


def held_out_evaluation(
    folder: RunFolder,
    config: RunConfig,
    heldout: list[Any],
    scorer: GroupScorer,
    rollout: TextRolloutConfig | ToolRolloutConfig,
    *,
    system_prompt: str | None = None,
    server: MCPServer | None = None,
) -> RunEvaluation:
    """AutoRL's evaluation (one answer per held-out input under `system_prompt`) or, given the `server`, MCP•RL's
    (one tool-use rollout per held-out scenario against it)."""
    if server is None:
        from art_agents.autorl.text_rollout import text_rollout

        run_one: Rollout = functools.partial(text_rollout, system_prompt=system_prompt or "", config=rollout)
        requests = {i.id: i.input for i in heldout}
    else:
        from art_agents.autorl.tool_rollout import server_rollout

        run_one = functools.partial(server_rollout, server=server, config=rollout)
        requests = {s.id: s.task for s in heldout}
    return RunEvaluation(folder, scored_alone(run_one, scorer), heldout, config, scorer, requests, system_prompt)


@asynccontextmanager
async def run_evaluation(
    path: Path, *, judge_model: str | None = None, judge_params: Any = None, reward: RewardFn | None = None
) -> AsyncIterator[RunEvaluation]:
    """The run in `path` ready to evaluate as it evaluated itself (its `eval_settings.json`, the flags over it); an
    MCP•RL run's server runs while the context is open."""
    folder = RunFolder(path)
    task = json.loads(folder.file("task.json").read_text(encoding="utf-8"))
    settings = EvalSettings.read(folder).given(judge_model, judge_params or {}, reward)
    config = RunConfig(base_model=task["base_model"], name=task["name"], project=task["project"], seed=settings.seed)
    if reward is None and settings.reward is not None and settings.judge_model is None:
        from art_agents.jobs import load_function

        reward = load_function(settings.reward, "reward")
    if task["kind"] == "autorl":
        yield _autorl(folder, config, settings)
        return
    from art_agents.autorl.scenarios import Scenario
    from art_agents.autorl.scoring import TOOL_USE_RUBRIC
    from art_agents.autorl.tool_rollout import ToolRolloutConfig
    from art_agents.integrations.mcp import MCPServer

    scenarios = _required(folder, folder.read_jsonl(SCENARIOS_FILE, Scenario), SCENARIOS_FILE)
    heldout = [s for s in scenarios if s.split == "val"]
    scorer = GroupScorer(
        {s.id: s for s in heldout}, reward=reward, judge_model=settings.judge_model,
        rubric=settings.rubric or TOOL_USE_RUBRIC, judge_params=settings.judge_params,
    )  # fmt: skip
    recorded = settings.mcp_server
    server = MCPServer.model_validate(recorded) if recorded else MCPServer.parse(task["server"])
    async with server:
        rollout = ToolRolloutConfig.model_validate(settings.rollout)
        yield held_out_evaluation(folder, config, heldout, scorer, rollout, server=server)


def _autorl(folder: RunFolder, config: RunConfig, settings: EvalSettings) -> RunEvaluation:
    from art_agents.autorl.task_data import TaskInput
    from art_agents.autorl.text_rollout import TextRolloutConfig

    heldout = _required(folder, folder.read_jsonl(EVAL_FILE, TaskInput), EVAL_FILE)
    prompt_file = settings.system_prompt_file or SYSTEM_PROMPT_FILE
    system_prompt = _required(folder, folder.read_text(prompt_file), prompt_file)
    rubric = settings.rubric or _required(folder, folder.read_text(RUBRIC_FILE), RUBRIC_FILE)
    scorer = GroupScorer(
        {i.id: i for i in heldout}, judge_model=settings.judge_model, rubric=rubric, judge_params=settings.judge_params
    )
    rollout = TextRolloutConfig.model_validate(settings.rollout)
    return held_out_evaluation(folder, config, heldout, scorer, rollout, system_prompt=system_prompt)


def _required(folder: RunFolder, value: Any, name: str) -> Any:
    if value is None:
        raise ArtError(f"{folder.path} has no {name}: the run stopped before writing it; rerun it first")
    return value
