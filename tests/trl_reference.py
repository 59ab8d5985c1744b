"""Reference GRPO loss computed by TRL's own code, for checking our trainer against it (TRL 1.16).

`trl_grpo_loss` calls the real, unbound `trl.GRPOTrainer._compute_loss(self, model, inputs)`
(trl/trainer/grpo_trainer.py:3020) on a stand-in made with `object.__new__(GRPOTrainer)`, so
`GRPOTrainer.__init__` never runs. The stand-in sets only what `_compute_loss` and
`_get_per_token_logps_and_entropies` read: `model`, `loss_type`, `epsilon_low`, `epsilon_high`,
`beta`, `max_completion_length`, `importance_sampling_level`, `top_entropy_quantile=1.0`,
`off_policy_mask_threshold=None`, `aux_loss_enabled=False`, `_entropy_bonus_enabled=False`,
`use_vllm`/`vllm_importance_sampling_correction` (True only when an `importance_sampling_ratio` is
given), `current_gradient_accumulation_steps=1`, `_metrics`, `state.global_step`,
`args(report_to=[], delta=None, use_bias_correction_kl, steps_per_generation=1)` and a
single-process `accelerator` stub (identity gather/reduce, null autocast, `num_processes=1`).

TRL behaviour a caller must match:
- Log-probs: TRL 1.16 no longer materialises logits. `__init__` patches the (PEFT base) model with
  `trl.trainer.utils.add_fused_lm_head(..., temperature=T)` (grpo_trainer.py:1068) and
  `_get_per_token_logps_and_entropies` (:1419) calls `model(input_ids, attention_mask,
  labels=..., fused_lm_head=True)`, taking `log_probs[:, -C:]` (C = completion width). This equals
  `selective_log_softmax(logits[:, -C-1:-1] / T, completion_ids)`. We apply the same patch for the
  duration of the call, then restore `forward`. No `position_ids` are passed (plain arange even with
  left padding). Padded completion positions are scored but masked out.
- Inputs: prompts left-padded, completions right-padded (grpo_trainer.py:2441-2462); `mask =
  completion_mask` (times `tool_mask` if present). `old_per_token_logps=None` means
  `per_token_logps.detach()` (ratio 1, gradient = advantage-weighted log-prob gradient).
- ratio = exp(logp - old); loss_tok = -min(ratio*A, clamp(ratio, 1-eps_low, 1+eps_high)*A);
  plus `beta * kl * ratio` when beta != 0 (k3 KL exp(ref-logp)-(ref-logp)-1, times ratio when
  use_bias_correction_kl). Aggregation (:3152-3183), with GA = grad-accum steps (1 here):
  grpo: mean_i(sum_t loss*mask / max(sum_t mask, 1)) / GA;
  dr_grpo: sum(loss*mask) / (B * max_completion_length) / GA;
  dapo: sum(loss*mask) / (num_items_in_batch.clamp(1) / num_processes * GA / steps_per_generation),
  where num_items_in_batch = sum of the loss mask over the whole *generation* batch gathered
  over all processes (:2498). Defaults here: the local `completion_mask.sum()`.
- Advantages are inline in `_generate_and_score_completions` (not callable alone), so no
  `trl_advantages` is provided. Default path (`multi_objective_aggregation="sum_then_normalize"`,
  :2761-2788): r = weighted nansum of reward funcs; A = r - group nanmean; `scale_rewards`
  ("group" default; True->"group", False->"none", grpo_config.py:1078): A /= (std + 1e-4) with
  std = `nanstd` = UNBIASED (Bessel, count-1; trl/trainer/utils.py:1021-1043) per group, or over
  the whole batch for "batch"; "none" leaves A unscaled. NaN advantages -> 0 (:2810).
  `trl_nanstd` re-exports TRL's nanstd.
- vLLM IS correction (:2660-2707, applied at :3146): ratio = exp((old - sampling) * mask) per
  token, or exp(sum_t) per sequence for "sequence_*" modes (default "sequence_mask");
  *_truncate clamps to [vllm_importance_sampling_clip_min, clip_max] (default None, 3.0);
  *_mask zeroes ratios outside. `per_token_loss *= importance_sampling_ratio` before the KL term.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from types import SimpleNamespace

import torch
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head, nanstd, pad, selective_log_softmax

trl_selective_log_softmax = selective_log_softmax
trl_nanstd = nanstd

__all__ = ["trl_grpo_loss", "trl_nanstd", "trl_pad_batch", "trl_selective_log_softmax"]


class _OneProcessAccelerator:
    num_processes = 1
    is_main_process = True
    sync_gradients = True

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.reshape(-1) if tensor.dim() == 0 else tensor

    gather_for_metrics = gather

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return tensor

    def pad_across_processes(self, tensor: torch.Tensor, dim: int = 0, pad_index: float = 0) -> torch.Tensor:
        return tensor


@contextlib.contextmanager
def _fused_lm_head(model: torch.nn.Module, temperature: float) -> Iterator[None]:
    """TRL's fused-LM-head patch (as GRPOTrainer.__init__ applies it), undone on exit."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    missing = object()
    previous = base.__dict__.get("forward", missing)
    add_fused_lm_head(base, temperature=temperature, outputs=("log_probs", "entropy"))
    try:
        yield
    finally:
        if previous is missing:
            del base.forward
        else:
            base.forward = previous


def trl_pad_batch(
    prompts: list[list[int]], completions: list[list[int]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prompt_ids, prompt_mask, completion_ids, completion_mask) padded with TRL's `pad`, as TRL does."""
    p = [torch.tensor(x) for x in prompts]
    c = [torch.tensor(x) for x in completions]
    return (
        pad(p, padding_value=pad_token_id, padding_side="left"),
        pad([torch.ones_like(x) for x in p], padding_value=0, padding_side="left"),
        pad(c, padding_value=pad_token_id, padding_side="right"),
        pad([torch.ones_like(x) for x in c], padding_value=0, padding_side="right"),
    )


def trl_grpo_loss(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    loss_type: str,
    temperature: float,
    prompt_mask: torch.Tensor | None = None,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    old_per_token_logps: torch.Tensor | None = None,
    max_completion_length: int = 1024,
    ref_per_token_logps: torch.Tensor | None = None,
    use_bias_correction_kl: bool = True,
    num_items_in_batch: int | None = None,
    importance_sampling_ratio: torch.Tensor | None = None,
    importance_sampling_level: str = "token",
    metrics_out: dict[str, list[float]] | None = None,
) -> torch.Tensor:
    """GRPO loss from TRL's `GRPOTrainer._compute_loss` (differentiable wrt `model`'s parameters).

    `prompt_ids` (B, P) left-padded (`prompt_mask` defaults to all ones); `completion_ids`/`_mask`
    (B, C) right-padded; `advantages` (B,). `num_items_in_batch` (dapo normaliser) defaults to
    `completion_mask.sum()`. `metrics_out`, if given, is filled with TRL's logged metrics.
    """
    if beta != 0.0 and ref_per_token_logps is None:
        raise ValueError("beta != 0 needs ref_per_token_logps")
    trainer = object.__new__(GRPOTrainer)
    use_is = importance_sampling_ratio is not None
    trainer.__dict__.update(
        model=model,
        loss_type=loss_type,
        epsilon_low=epsilon,
        epsilon_high=epsilon if epsilon_high is None else epsilon_high,
        beta=beta,
        max_completion_length=max_completion_length,
        importance_sampling_level=importance_sampling_level,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
        use_vllm=use_is,
        vllm_importance_sampling_correction=use_is,
        current_gradient_accumulation_steps=1,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        state=SimpleNamespace(global_step=0),
        args=SimpleNamespace(
            report_to=[], delta=None, use_bias_correction_kl=use_bias_correction_kl, steps_per_generation=1
        ),
        accelerator=_OneProcessAccelerator(),
    )
    n_items = completion_mask.sum() if num_items_in_batch is None else torch.tensor(num_items_in_batch)
    inputs: dict[str, torch.Tensor] = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids) if prompt_mask is None else prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "num_items_in_batch": n_items,
    }
    optional = {
        "old_per_token_logps": old_per_token_logps,
        "ref_per_token_logps": ref_per_token_logps,
        "importance_sampling_ratio": importance_sampling_ratio,
    }
    inputs.update({k: v for k, v in optional.items() if v is not None})
    with _fused_lm_head(model, temperature):
        loss = GRPOTrainer._compute_loss(trainer, model, inputs)
    if metrics_out is not None:
        metrics_out.update(trainer._metrics["train" if model.training else "eval"])
    return loss
