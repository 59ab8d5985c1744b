"""The settings of an MCP•RL run (`art-agents mcp-rl` and its TOML form), apart from the pipeline that runs them
so the parts of the pipeline (the SFT warmup among them) can read them without importing it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from art_agents.autorl.run_config import RunConfig
from art_agents.autorl.scoring import TOOL_USE_RUBRIC
from art_agents.autorl.temperature import TemperatureSchedule
from art_agents.autorl.tool_rollout import ToolRolloutConfig
from art_agents.integrations.mcp import MCPServer
from art_agents.sft_config import TrainSFTConfig

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
    temperature_schedule: TemperatureSchedule = Field(
        default_factory=TemperatureSchedule,
        description="How the RL rollouts' temperature (starting at `rollout.temperature`) adapts to draws that tie.",
    )
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
    guide_below: float | None = Field(
        None,
        description=(
            "Off-policy guidance during RL (needs `teacher_model`): a group whose best reward is below this gets the "
            "teacher's rollout of its task in place of its worst one, kept if it then scores best (see "
            "`art_agents.autorl.guidance`). None: off. With a 0-1 task reward, 1.0 guides every group none solved."
        ),
    )

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
        if self.ruler_hints and self.reward:
            raise ValueError("ruler_hints needs RULER's scoring; drop --reward or --ruler-hints")
        if self.guide_below is not None and not self.teacher_model:
            raise ValueError("guidance (--guide-below) needs a teacher: give --teacher-model (and --teacher-api-base)")
        return self
