"""`art-agents eval .art/quickstart/models/quickstart`: the quickstart's steps compared offline, on prompts it never
trained on, scored by its own reward (the fraction of "a" in the reply).

The quickstart keeps what this needs in its model folder (`quickstart.save_eval_task`: `task.json` names the base
model and the reward, `heldout.jsonl` holds the prompts); the steps are served from the art path around the folder.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from art_agents.backends.registered import registered_model
from art_agents.errors import ArtError
from art_agents.model import Model, TrainableModel
from art_agents.server.ops.quickstart import (
    EVAL_TASK_FILE,
    HELDOUT_FILE,
    PROJECT,
    TOY_MODEL_CONFIG,
    toy_reward,
    toy_rollout,
)
from art_agents.trajectory import Trajectory


@dataclass
class QuickstartEvaluation:
    """What `art-agents eval` needs of the quickstart's run: its rollout, held-out prompts and model."""

    folder: Path
    base_model: str
    heldout: list[dict[str, Any]]
    name: str = PROJECT

    @staticmethod
    async def rollout(model: Model, scenario: dict[str, Any]) -> Trajectory:
        """The quickstart's rollout on one held-out prompt (decoded as the evaluation asks: greedy by default)."""
        client = model.openai_client()
        try:
            return await toy_rollout(client, model, scenario["prompt"], seed=0)
        finally:
            await client.close()

    def registered(self) -> AbstractAsyncContextManager[TrainableModel]:
        """The quickstart's model on a local server over the art path that holds its folder."""
        art_path = self.folder.resolve().parents[2]  # <art_path>/<project>/models/<name>
        return registered_model(self.name, PROJECT, self.base_model, TOY_MODEL_CONFIG, art_path=art_path)


@asynccontextmanager
async def run_evaluation(
    path: Path, *, judge_model: str | None = None, judge_params: Any = None, reward: Any = None
) -> AsyncIterator[QuickstartEvaluation]:
    """The quickstart's model folder ready to evaluate; a judge or another reward is refused (it has its own)."""
    if judge_model is not None or reward is not None:
        raise ArtError(
            f"the quickstart scores with its own reward ({toy_reward.__name__}: the fraction of 'a' in the reply); "
            "drop --judge-model and --reward"
        )
    task = json.loads((path / EVAL_TASK_FILE).read_text(encoding="utf-8"))
    lines = (path / HELDOUT_FILE).read_text(encoding="utf-8").splitlines()
    yield QuickstartEvaluation(path, task["base_model"], [json.loads(line) for line in lines if line.strip()])
