"""An `autorl` or `mcp-rl` run folder as input to `art.evaluate`: its held-out split and its own rollout.

The rollout is the one the run's step-0 vs step-N evaluation uses (`text_rollout` under the saved system prompt,
or `server_rollout` against the run's MCP server), scored as that evaluation scores: each rollout a group of its
own for the judge (RULER by the run's rubric) or the reward function. The judge is not in the folder, so it is
given again.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from art_agents.autorl.run_config import RunConfig, registered_model
from art_agents.autorl.run_folder import RunFolder
from art_agents.autorl.scoring import TOOL_USE_RUBRIC, GroupScorer, RewardFn
from art_agents.errors import ArtError
from art_agents.model import Model, TrainableModel
from art_agents.trajectory import Trajectory, TrajectoryGroup

Rollout = Callable[[Model, Any], Awaitable[Trajectory]]


@dataclass
class RunEvaluation:
    """What `art.evaluate` needs from a run: the rollout, the held-out scenarios and the run's own model."""

    folder: RunFolder
    rollout: Rollout
    heldout: list[Any]
    config: RunConfig

    @property
    def name(self) -> str:
        return self.config.name

    def registered(self) -> AbstractAsyncContextManager[TrainableModel]:
        """The run's model on a local server over the folder's art path, for its steps."""
        return registered_model(self.config, self.folder)


def _scored(run_one: Rollout, scorer: GroupScorer) -> Rollout:
    """`run_one` with its trajectory scored as the run's evaluation scores it (a group of one)."""

    async def rollout(model: Model, scenario: Any) -> Trajectory:
        group = await scorer(TrajectoryGroup([await run_one(model, scenario)]))
        if group is None or not group.trajectories:
            raise ArtError(f"the judge gave no score for scenario {getattr(scenario, 'id', scenario)}")
        return group.trajectories[0]

    return rollout


@asynccontextmanager
async def run_evaluation(
    path: Path, *, judge_model: str | None, judge_params: dict[str, Any], reward: RewardFn | None = None
) -> AsyncIterator[RunEvaluation]:
    """The run in `path` ready to evaluate; an MCP•RL run's server runs while the context is open."""
    folder = RunFolder(path)
    task = json.loads(folder.file("task.json").read_text(encoding="utf-8"))
    config = RunConfig(base_model=task["base_model"], name=task["name"], project=task["project"])
    if reward is None and judge_model is None:
        raise ArtError("give --judge-model (RULER, as the run scored) or, for an mcp-rl run, --reward module:function")
    if task["kind"] == "autorl":
        from art_agents.autorl.from_description import EVAL_FILE, RUBRIC_FILE, SYSTEM_PROMPT_FILE, _read_text
        from art_agents.autorl.task_data import TaskInput
        from art_agents.autorl.text_rollout import text_rollout

        heldout = _required(folder, folder.read_jsonl(EVAL_FILE, TaskInput), EVAL_FILE)
        system_prompt = _required(folder, _read_text(folder, SYSTEM_PROMPT_FILE), SYSTEM_PROMPT_FILE)
        rubric = _required(folder, _read_text(folder, RUBRIC_FILE), RUBRIC_FILE)
        scorer = GroupScorer(
            {i.id: i for i in heldout}, judge_model=judge_model, rubric=rubric, judge_params=judge_params
        )
        run_one = functools.partial(text_rollout, system_prompt=system_prompt)
        yield RunEvaluation(folder, _scored(run_one, scorer), heldout, config)
        return
    from art_agents.autorl.mcp_rl import SCENARIOS_FILE
    from art_agents.autorl.scenarios import Scenario
    from art_agents.autorl.tool_rollout import server_rollout
    from art_agents.integrations.mcp import MCPServer

    heldout = [
        s for s in _required(folder, folder.read_jsonl(SCENARIOS_FILE, Scenario), SCENARIOS_FILE) if s.split == "val"
    ]
    scorer = GroupScorer(
        {s.id: s for s in heldout}, reward=reward, judge_model=judge_model, rubric=TOOL_USE_RUBRIC,
        judge_params=judge_params,
    )  # fmt: skip
    server = MCPServer.parse(task["server"])
    async with server:
        run_one = functools.partial(server_rollout, server=server)
        yield RunEvaluation(folder, _scored(run_one, scorer), heldout, config)


def _required(folder: RunFolder, value: Any, name: str) -> Any:
    if value is None:
        raise ArtError(f"{folder.path} has no {name}: the run stopped before writing it; rerun it first")
    return value
