"""The policy the trainer owns: the base model with the trainable LoRA, whose checkpoints engines serve.

Training never touches an engine's model. Between steps the policy's adapter holds the served step's weights;
a step trains it, writes checkpoint N+1 from it, and the engine loads that checkpoint. On the engine's device
the base weights are the engine's own tensors (`with_base_of`), so a second copy is never held in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from art_agents.server.models.lora_model import load_lora_weights, load_peft_model, with_base_of
from art_agents.train_config import ModelConfig


@dataclass
class PolicyModel:
    model: Any  # a peft.PeftModel whose adapter "default" is trained
    tokenizer: Any
    kept: dict[str, dict[str, Any]] = field(default_factory=dict)  # checkpoints a step scores with, by folder

    @classmethod
    def load(cls, base_model: str, config: ModelConfig, tokenizer: Any, shared_base: Any | None) -> PolicyModel:
        """Over `shared_base` (an engine's `base_weights()`, same device) when there is one, else loaded anew: on the
        CPU in bf16 when trainer processes train it (the server's copy only holds the LoRA between steps)."""
        if shared_base is not None:
            return cls(with_base_of(shared_base), tokenizer)
        if config.trainer_processes:
            config = config.model_copy(update={"device": "cpu", "dtype": "bfloat16"})
        model, _ = load_peft_model(base_model, config)
        return cls(model, tokenizer)

    @property
    def context_tokens(self) -> int | None:
        """The model's context length (None if its config does not say): no sequence may be longer."""
        return getattr(self.model.config, "max_position_embeddings", None)

    def load_checkpoint(self, path: Path) -> None:
        """Set the trained adapter to a checkpoint's weights (opening a model, rolling back a step)."""
        load_lora_weights(self.model, path)
