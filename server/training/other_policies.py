"""The policies a step scores with besides the one it trains: the base model (adapter off) and checkpoints of the
model (the KL's `reference_step`, a teacher step), whose LoRA weights are kept in memory after the first read.

A checkpoint is scored by putting its weights in the trained adapter for the no-grad pass and the policy's back
after it: one adapter, so the trainer's forward (and any DDP wrapper around it) stays the same module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from art_agents.server.training.updates import put_back, weights_copy

Which = Literal["policy", "base"] | int


class OtherPolicies:
    """`active(which)` makes the model compute `which`: the trained policy, the base model or checkpoint N."""

    def __init__(self, model: Any, checkpoints: dict[int, str], kept: dict[str, dict[str, Any]]) -> None:
        self.model = model
        self.checkpoints = checkpoints  # step -> adapter folder, resolved by the server for this call
        self.kept = kept  # adapter folder -> its LoRA weights, kept across calls by the policy's owner

    @contextlib.contextmanager
    def active(self, which: Which) -> Iterator[None]:
        if which == "policy":
            yield
        elif which == "base":
            with self.model.disable_adapter():
                yield
        else:
            yield from self._checkpoint(which)

    def _checkpoint(self, step: int) -> Iterator[None]:
        from peft import set_peft_model_state_dict

        weights = self._weights(step)
        own = weights_copy(self.model)
        try:
            set_peft_model_state_dict(self.model, weights, adapter_name="default")
            yield
        finally:
            put_back(self.model, own)

    def _weights(self, step: int) -> dict[str, Any]:
        from peft import load_peft_weights

        path = self.checkpoints.get(step)
        if path is None or not Path(path).is_dir():
            raise FileNotFoundError(f"checkpoint {step} is not on this trainer's disk ({path}); name a saved step")
        if path not in self.kept:
            device = next(self.model.parameters()).device
            self.kept[path] = load_peft_weights(path, device=str(device))
        return self.kept[path]
