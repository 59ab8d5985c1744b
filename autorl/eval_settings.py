"""`eval_settings.json`: how an `autorl` or `mcp-rl` run evaluates, so `art-agents eval RUN_FOLDER` needs no flag.

Beside `task.json` rather than in it: `task.json` says which run a folder holds (a rerun with other values there is
refused as another run), while a rerun may well change its judge's endpoint. Each invocation writes the settings it
evaluates with; flags of `art-agents eval` override them. API keys are never written: the judge's comes from the
environment (or `--judge-api-key`), as it did for the run.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field

from art_agents.autorl.run_config import RunConfig
from art_agents.autorl.run_folder import RunFolder
from art_agents.autorl.scoring import RewardFn
from art_agents.errors import ArtError
from art_agents.schema import Schema

SETTINGS_FILE = "eval_settings.json"
SECRET_KEYS = ("api_key", "headers", "env")


class EvalSettings(Schema):
    """The judge, the scoring and every rollout setting of a run's own held-out evaluation."""

    judge_model: str | None = Field(None, description="LiteLLM model string of the RULER judge; None: a reward.")
    judge_params: dict[str, Any] = Field(default_factory=dict, description="Its LiteLLM keywords, API key left out.")
    rubric: str | None = Field(None, description="The rubric the judge scores by.")
    reward: str | None = Field(None, description="`module:function` that scored instead of RULER.")
    python_reward: bool = Field(False, description="Scored by a function given in Python, which no file can name.")
    rollout: dict[str, Any] = Field(
        default_factory=dict,
        description="The rollout's settings at the evaluation temperature (Tool/TextRolloutConfig).",
    )
    system_prompt_file: str | None = Field(None, description="AutoRL: the system prompt's file in the run folder.")
    mcp_server: dict[str, Any] | None = Field(None, description="MCP•RL: the server, its headers and env left out.")
    seed: int = Field(0, description="Seeds the order a pairwise judge sees two answers in.")

    @classmethod
    def of(cls, config: RunConfig, rollout: Schema, *, reward: RewardFn | None = None, **fields: Any) -> Self:
        """The settings of a run evaluating with `config`'s judge and `rollout` (already at its eval temperature)."""
        reward_name = getattr(config, "reward", None)
        return cls(
            judge_model=None if reward is not None else config.judge_model,
            judge_params=_public(config.judge_params),
            reward=reward_name,
            python_reward=reward is not None and reward_name is None,
            rollout=rollout.model_dump(mode="json"),
            seed=config.seed,
            **fields,
        )

    def save(self, folder: RunFolder) -> None:
        folder.write_json(SETTINGS_FILE, self)

    @classmethod
    def read(cls, folder: RunFolder) -> Self:
        """The folder's settings; an older folder without them gets defaults (and needs its judge given again)."""
        return folder.read_json(SETTINGS_FILE, cls) or cls(rollout={"temperature": 0.0})

    def given(self, judge_model: str | None, judge_params: dict[str, Any], reward: RewardFn | None) -> Self:
        """These settings with the flags given over them (None: not given); the judge or reward they need checked."""
        if reward is None and judge_model is None and self.judge_model is None and self.reward is None:
            why = (
                "was scored by a reward function given in Python, which it cannot name"
                if self.python_reward
                else f"records no judge (no {SETTINGS_FILE}: a run of an older art-agents)"
            )
            raise ArtError(
                f"the run folder {why}: give --judge-model (RULER, as the run scored) or, for an mcp-rl run, "
                "--reward module:function"
            )
        params = {**self.judge_params, **{k: v for k, v in judge_params.items() if v is not None}}
        update: dict[str, Any] = {"judge_params": params}
        if judge_model is not None:
            update |= {"judge_model": judge_model, "reward": None}
        return self.model_copy(update=update)


def _public(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k not in SECRET_KEYS}
