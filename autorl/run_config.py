"""Settings shared by the AutoRL and MCP•RL runs, and their TOML form with command-line flags over it."""

from __future__ import annotations

import tomllib
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Self

from pydantic import Field, model_validator

from art_agents.autorl.generation import Generation, spend_text
from art_agents.autorl.run_folder import RunFolder
from art_agents.backends.registered import registered_model as core_registered_model
from art_agents.errors import ArtError
from art_agents.evaluation.files import EvalSummary
from art_agents.llm import check_key
from art_agents.model import TrainableModel
from art_agents.schema import Schema
from art_agents.train_config import ModelConfig, TrainConfig


class RunConfig(Schema):
    """What every zero-data run needs: the model, the judge, the generator, the loop, the run folder."""

    base_model: str = Field(description="Hub id or local folder of the model to train.")
    name: str = "agent"
    project: str = "autorl"
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    judge_model: str | None = Field(None, description="LiteLLM model string of the RULER judge.")
    judge_params: dict[str, Any] = Field(default_factory=dict, description="Extra LiteLLM keywords (api_base...).")
    ruler_hints: bool = Field(
        False,
        description=(
            "RULER's explanation of each rollout becomes its hint, and training self-distils from it "
            "(`train.self_distill`, 1.0 unless set): every token learns from what the judge said, not only the score."
        ),
    )
    generator_model: str | None = Field(None, description="Writes the training data; defaults to the judge model.")
    generator_params: dict[str, Any] = Field(default_factory=dict)
    steps: int = Field(10, ge=1, description="Total training steps of the run (a rerun continues to this).")
    groups_per_step: int = Field(4, ge=1)
    group_size: int = Field(4, ge=2, description="Rollouts per input in a group.")
    eval_temperature: float = Field(0.0, ge=0, description="Sampling temperature of evaluation (0 = greedy).")
    max_exceptions: float = Field(0.1, ge=0, description="Failed rollouts tolerated per step (count or fraction).")
    pipeline: bool = Field(
        False, description="Roll out the next steps while one trains (see art_agents.loop.pipeline)."
    )
    max_steps_off_policy: int = Field(
        1, ge=0, description="With `pipeline`, how many steps behind the trained policy a step's rollouts may be."
    )
    seed: int = 0
    out: Path = Field(Path("autorl-run"), description="Run folder: generated data, evaluations, checkpoints.")
    base_url: str | None = Field(None, description="A running art-agents server; default: start a local one.")
    api_key: str | None = None

    @model_validator(mode="after")
    def _hints_distil(self) -> Self:
        if self.ruler_hints and not self.judge_model:
            raise ValueError("ruler_hints uses RULER's explanations; give a judge (--judge-model)")
        if self.ruler_hints and not self.train.self_distill:
            self.train = self.train.model_copy(update={"self_distill": 1.0})
        return self

    @classmethod
    def load(cls, path: Path | None, flags: dict[str, Any]) -> Self:
        """Settings from a TOML file (optional) with command-line `flags` over it (None = not given).

        A relative `out` in the file is relative to the file's folder.
        """
        data = tomllib.loads(path.read_text(encoding="utf-8")) if path else {}
        config = cls.model_validate(merge_settings(data, flags))
        if path and "out" in data and flags.get("out") is None and not Path(data["out"]).is_absolute():
            config = config.model_copy(update={"out": path.resolve().parent / data["out"]})
        return config

    def loop_options(self) -> dict[str, Any]:
        """`train_loop`'s keywords that come from these settings as they are."""
        return {
            "groups_per_step": self.groups_per_step,
            "rollouts_per_group": self.group_size,
            "train_config": self.train,
            "max_exceptions": self.max_exceptions,
            "seed": self.seed,
            "pipeline": self.pipeline,
            "max_steps_off_policy": self.max_steps_off_policy,
        }

    def check_keys(self, *, judge: bool, generator: bool) -> None:
        """Before anything is written or started: the judge (when `judge`) and the generator (when `generator`)
        have the API keys their providers need (KeyProblem, naming the variable and the flag)."""
        if judge and self.judge_model is not None:
            check_key(self.judge_model, self.judge_params, role="judge", option="--judge-api-key")
        if generator:
            model, params = self.generation_params()
            check_key(model, params, role="generator", option="--generator-api-key")

    def generation_params(self) -> tuple[str, dict[str, Any]]:
        """The generator's model string and LiteLLM keywords (the judge's when no generator is given)."""
        if self.generator_model is not None:
            return self.generator_model, self.generator_params
        if self.judge_model is None:
            raise ArtError("data must be generated: give --generator-model (or --judge-model, which it defaults to)")
        return self.judge_model, self.generator_params or self.judge_params


class RunSummary(Schema):
    """What a run ends with (saved as `summary.json`): its held-out evaluation of step 0 and the last step, and
    the cost."""

    out: Path
    step: int
    evaluation: EvalSummary = Field(description="As `eval/heldout/summary.json`: what `art-agents eval` prints.")
    judge_cost_usd: float = Field(0.0, description="Judge cost of this invocation (training and evaluation).")
    judge_cost_known: bool = Field(True, description="False when the judge is missing from LiteLLM's price map.")
    judge_prompt_tokens: int = 0
    judge_completion_tokens: int = 0
    generation: Generation | None = Field(None, description="What generating the run's data has cost, all runs.")

    def table(self) -> str:
        """The evaluation's tables, as `art-agents eval RUN_FOLDER` prints them, then what the judge and generator
        cost."""
        from art_agents.evaluation.tables import eval_text

        return "\n".join([eval_text(self.evaluation), *self.spend_lines()])

    def spend_lines(self) -> list[str]:
        """The judge's and the generator's tokens and cost, as LiteLLM reported them."""
        lines = [
            spend_text(
                "judge (this run)",
                self.judge_prompt_tokens,
                self.judge_completion_tokens,
                self.judge_cost_usd,
                self.judge_cost_known,
            )
        ]
        if self.generation is not None:
            g = self.generation
            lines.append(spend_text("generator", g.prompt_tokens, g.completion_tokens, g.cost_usd, g.cost_known))
        return lines


def registered_model(config: RunConfig, folder: RunFolder) -> AbstractAsyncContextManager[TrainableModel]:
    """The run's model, registered on `config.base_url` or on a local server keeping its files in `folder`."""
    return core_registered_model(
        config.name,
        config.project,
        config.base_model,
        config.model,
        base_url=config.base_url or None,
        api_key=config.api_key,
        art_path=folder.art_path,
    )


def merge_settings(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` over `base`, nested tables merged; None values and empty tables leave `base` alone."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict):
            nested = merge_settings(merged.get(key) or {}, value)
            if nested:
                merged[key] = nested
        elif value is not None:
            merged[key] = value
    return merged
