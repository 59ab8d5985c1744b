"""What every optimizer step does around its loss: refuse non-finite numbers, clip and step; the trainer's
switches (activation checkpointing, timing) that both RL and SFT calls use; and a copy of the trainable weights to
put back (a failed step, a checkpoint scored in their place)."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def apply(
    optimizer: torch.optim.Optimizer, params: list[torch.Tensor], loss: float, max_grad_norm: float, what: str
) -> float:
    """Clip the accumulated gradients and take the optimizer step; returns the gradient norm. Refuses non-finite."""
    import torch

    if not math.isfinite(loss):
        raise FloatingPointError(f"{what} is {loss}; lower the learning rate or check the training data")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    if not math.isfinite(grad_norm):
        raise FloatingPointError(f"gradient norm is {grad_norm}; lower the learning rate")
    optimizer.step()
    return grad_norm


def timed(metrics: dict[str, float], started: float) -> dict[str, float]:
    """`metrics` with the call's `train_s` and, when it trained, `tokens_per_s`."""
    metrics["train_s"] = time.perf_counter() - started
    if metrics.get("optimizer_steps"):
        metrics["tokens_per_s"] = metrics["tokens_trained"] / metrics["train_s"]
    return metrics


def activation_checkpointing(model: Any, *, on: bool) -> None:
    """Non-reentrant checkpointing on or off; transformers 5 renamed it (the old names warn), 4.x has only those."""
    if not hasattr(model, "activation_checkpointing_enable"):
        if on:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_disable()
    elif on:
        model.activation_checkpointing_enable({"use_reentrant": False})
    else:
        model.activation_checkpointing_disable()


def weights_copy(model: Any) -> dict[str, torch.Tensor]:
    """A copy of this process's trainable (LoRA) tensors, to put back with `put_back`."""
    return {name: param.detach().clone() for name, param in model.named_parameters() if param.requires_grad}


def put_back(model: Any, weights: dict[str, torch.Tensor]) -> None:
    """Copy `weights_copy`'s tensors into the parameters in place (the optimizer keeps the same tensors)."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in weights:
                param.copy_(weights[name])
