"""Whether trained LoRA weights can serve, checked before a step is committed.

The trainer refuses a non-finite loss or gradient norm, but both are measured before the update: an absurd
learning rate gives a finite loss and then weights whose logits overflow, and every completion on such a step
would fail. So after training, and before the commit, the trainable weights must be finite and a forward pass on a
few tokens must give finite logits.
"""

from __future__ import annotations

from typing import Any

PROBE_TEXT = "Hello! How are you today?"


class UnservableWeights(FloatingPointError):
    """Training produced weights that cannot serve; the step is not committed."""


def check_servable(model: Any, tokenizer: Any, learning_rate: float | list[float]) -> None:
    """Raise `UnservableWeights`, naming the learning rate, if `model`'s trainable weights or its logits on a few
    tokens are not finite."""
    import torch

    bad = [name for name, p in model.named_parameters() if p.requires_grad and not torch.isfinite(p).all()]
    if bad:
        problem = f"{len(bad)} trained weight tensors are not finite (first: {bad[0]})"
    else:
        ids = tokenizer.encode(PROBE_TEXT, add_special_tokens=False)[:8] or [0]
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([ids], device=device)).logits
        finally:
            model.train(was_training)
        if torch.isfinite(logits).all():
            return
        problem = "the trained weights give non-finite logits"
    raise UnservableWeights(
        f"{problem} after training with learning_rate={_rate(learning_rate)}; lower the learning rate"
    )


def _rate(learning_rate: float | list[float]) -> str:
    """A rate or a schedule (SFT's per-batch list), by its largest value."""
    if isinstance(learning_rate, list):
        return f"{max(learning_rate):g} (the schedule's largest)"
    return f"{learning_rate:g}"
