"""The settings of one `train_sft` call, with their defaults and why (RL's are in train_config.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, model_validator

from art_agents.schema import Schema
from art_agents.train_config import Rate


def _rate_or_schedule(value: Any) -> str:
    """Which form a learning rate takes, so that a bad one gets that form's error only, not one per form."""
    return "schedule" if isinstance(value, list) else "rate"


class TrainSFTConfig(Schema):
    """Supervised fine-tuning settings for one `train_sft` call (ART's `art.TrainSFTConfig`, and more)."""

    model_config = ConfigDict(extra="forbid")

    learning_rate: Annotated[
        Annotated[Rate, Tag("rate")] | Annotated[list[Rate], Tag("schedule"), Field(min_length=1)],
        Discriminator(_rate_or_schedule),
    ] = Field(
        5e-5,
        description=(
            "AdamW learning rate: one number for every batch, or one per batch in order (a schedule such as "
            "`art_agents.utils.sft.create_lr_schedule` builds), as many as the call has batches. A LoRA "
            "usually wants more than this full fine-tuning default: 1e-4, or 1e-3 for a small model learning a format "
            "(docs/sft.md)."
        ),
    )
    batch_size: int | Literal["auto"] = Field(
        "auto", description="Trajectories per optimizer step; 'auto' (ART's default) is all of them in one step."
    )
    epochs: int = Field(1, ge=1, le=10000, description="Passes over the trajectories in this call.")
    shuffle: bool = Field(False, description="Shuffle the trajectories before each epoch (seeded by `seed + epoch`).")
    seed: int = 0
    train_on: Literal["all_assistant", "last_assistant"] = Field(
        "all_assistant",
        description="Which assistant turns carry the loss: every one of each trajectory, or only its last.",
    )
    micro_batch_size: int = Field(8, ge=1, description="Sequences per forward/backward pass; gradients accumulate.")
    truncate_to_context: bool = Field(
        False, description="A conversation longer than the context is refused by name (a 400); True cuts it instead."
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")

    @model_validator(mode="after")
    def _batch_size(self) -> TrainSFTConfig:
        if self.batch_size != "auto" and self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1 or 'auto', got {self.batch_size}")
        return self

    def batches(self, count: int) -> list[list[int]]:
        """Trajectory indices of each optimizer step, epoch after epoch (shuffled per epoch when asked)."""
        import random

        size = count if self.batch_size == "auto" else self.batch_size
        batches = []
        for epoch in range(self.epochs):
            order = list(range(count))
            if self.shuffle:
                random.Random(self.seed + epoch).shuffle(order)
            batches += [order[start : start + size] for start in range(0, count, size)]
        return batches

    def learning_rates(self, steps: int) -> list[float]:
        """The learning rate of each of `steps` optimizer steps; a schedule of another length is refused."""
        if not isinstance(self.learning_rate, list):
            return [self.learning_rate] * steps
        if len(self.learning_rate) != steps:
            raise ValueError(
                f"learning_rate lists {len(self.learning_rate)} rates but this call has {steps} batches "
                "(trajectories / batch_size x epochs); give one rate per batch or a single number"
            )
        return list(self.learning_rate)
