"""The sampling temperature of RL rollouts, adapted when a draw gives GRPO nothing to compare.

A small model sampled at 1.0 can fail every attempt alike: SmolLM2-135M on an `mcp-server-time` task made a valid
tool call in 0 of 16 rollouts at 1.0, 1 at 0.8 and 8 at 0.5. Every group then ties, the draw trains nothing, and
the next draw at the same temperature fails the same way. So after a draw that trained nothing, the temperature
moves: down by `factor` when the draw's rewards were low (the attempts failed alike: sample closer to what the model
does best), back up towards the starting temperature when they were high (the attempts succeeded alike: explore).
A draw with a spread in any group keeps the temperature it had.
"""

from __future__ import annotations

from pydantic import Field

from art_agents.schema import Schema


class TemperatureSchedule(Schema):
    """How the rollouts' temperature adapts (`MCPRLConfig.temperature_schedule`, the TOML table
    `[temperature_schedule]`); `adapt=False` keeps `rollout.temperature` throughout."""

    adapt: bool = Field(
        True, description="Lower the temperature after a draw that tied low, raise it after one that tied high."
    )
    floor: float = Field(
        0.3, ge=0, description="The lowest temperature it lowers to (a start below it is not lowered)."
    )
    factor: float = Field(0.7, gt=0, lt=1, description="Each move multiplies (down) or divides (up) by this.")
    midpoint: float = Field(
        0.5, description="A tied draw whose mean reward is below this failed alike (lower), else succeeded (raise)."
    )


class AdaptiveTemperature:
    """The temperature of the next draw, from a start and the draws so far (`after_draw`)."""

    def __init__(self, start: float, schedule: TemperatureSchedule) -> None:
        self.start, self.schedule, self.current = start, schedule, start

    def after_draw(self, trained: bool, reward_mean: float) -> float:
        """The temperature for the next draw, given whether this one trained and its mean reward."""
        schedule = self.schedule
        if schedule.adapt and not trained:
            if reward_mean < schedule.midpoint:
                self.current = max(min(schedule.floor, self.start), round(self.current * schedule.factor, 3))
            else:
                self.current = min(self.start, round(self.current / schedule.factor, 3))
        return self.current
