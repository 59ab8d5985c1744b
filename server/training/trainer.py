"""One GRPO step on a PEFT LoRA model from trajectory groups: advantages, exact-token sequences, update.

The trainer updates the policy's PeftModel (training/policy_model.py), never the engine's: the engine serves
the last checkpoint until the new one is published. If anything fails mid-step the policy's LoRA weights and
optimizer state are restored, so it stays equal to the checkpoint being served.

The policy trained is the one that sampled: logits divided by each token's sampling temperature,
untruncated (top-p only narrowed which tokens were drawn). Old logprobs: the importance ratio is
taken against the policy at the start of the step. With `num_iterations == 1` the start-of-step
logprobs equal the first forward pass, so they are that pass detached (ratio 1, exact policy
gradient, no extra forward); with more iterations they are computed once, without gradients, before
the first update. Dropout is off while training (as TRL's `disable_dropout`), so those passes agree.
The sampler's own logprobs are on the same basis; their mean absolute gap to the trainer's is
`logprob_gap_sampler` (~0 for this server's engine at the current step; it grows with a stale
adapter or another engine), and `TrainConfig.tis_cap` corrects for it by truncated importance sampling.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from art_agents.server.training.advantages import group_advantages
from art_agents.server.training.batches import chunks, collate, empty_sequence
from art_agents.server.training.logprobs import ScaledLogits, token_logprobs
from art_agents.server.training.loss import BatchTotals, policy_loss
from art_agents.server.training.other_policies import OtherPolicies, Which
from art_agents.server.training.ranks import Ranks
from art_agents.server.training.self_distill import Hints, teacher_logprobs
from art_agents.server.training.sequences import (
    Policy,
    TrainingInputError,
    TrainSequence,
    build_sequences,
    check_groups,
    sft_sequences,
)
from art_agents.server.training.shared_prefix import PrefixSharing, sharing_for
from art_agents.server.training.step_metrics import first_pass_sums
from art_agents.server.training.step_work import Progress, StepWork
from art_agents.server.training.updates import activation_checkpointing, apply, put_back, timed, weights_copy
from art_agents.wire import reward_stats

if TYPE_CHECKING:
    import torch

    from art_agents.server.storage.token_store import TokenStore
    from art_agents.sft_config import TrainSFTConfig
    from art_agents.train_config import TrainConfig
    from art_agents.trajectory import Trajectory, TrajectoryGroup


# What a step adds up over its micro-batches (and ranks) for its metrics.
SUMS = ("loss", "clipped_tokens", "kl_sum", "gap_sum", "gap_kl_sum", "gap_tokens", "entropy_sum", "masked_tokens", "distill_gap_sum", "hinted_tokens")  # fmt: skip


class PolicyTrainer:
    """GRPO, or supervised fine-tuning, on the trainable (LoRA) parameters of `peft_model` with torch AdamW.

    `ranks` places it in a group of trainer processes that share each step (training/ranks.py); the
    default trains alone.
    """

    def __init__(
        self,
        peft_model: Any,
        tokenizer: Any,
        store: TokenStore,
        optimizer_state: dict | None = None,
        ranks: Ranks | None = None,
        kept_adapters: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        from trl.trainer.utils import disable_dropout_in_model

        disable_dropout_in_model(peft_model)  # train and no-grad passes must compute the same policy
        self.model = peft_model
        self.tokenizer = tokenizer
        self.store = store
        self.ranks = ranks or Ranks()
        self._forward = self.ranks.forward_of(peft_model)
        self._sharing: PrefixSharing | None = sharing_for(peft_model, self.ranks.sharding)
        self._optimizer: torch.optim.Optimizer | None = None
        self._initial_state = optimizer_state
        self._kept = {} if kept_adapters is None else kept_adapters  # checkpoints' weights, kept across calls
        self._others = OtherPolicies(peft_model, {}, self._kept)

    def run(self, work: StepWork, progress: Progress | None) -> dict[str, float]:
        """`train` or `train_sft`, as `work` asks."""
        if work.kind == "rl":
            rl_config: TrainConfig = work.config  # type: ignore[assignment]
            return self.train(work.groups, rl_config, progress, policy=work.policy, checkpoints=work.checkpoints)
        return self.train_sft(work.trajectories, work.config, progress, policy=work.policy)  # type: ignore[arg-type]

    def optimizer_state(self) -> dict:
        """The AdamW state to checkpoint (what was given at construction until the first step)."""
        if self._optimizer is None:
            return copy.deepcopy(self._initial_state) if self._initial_state else {}
        return self._optimizer.state_dict()

    def train(
        self,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        progress: Progress | None = None,
        *,
        policy: Policy | None = None,
        checkpoints: dict[int, str] | None = None,
    ) -> dict[str, float]:
        """One train call: `config.num_iterations` optimizer steps on the groups; returns the step's metrics.

        `policy` names the model and its current step: other models' turns are left out and turns
        sampled more than `config.max_staleness` steps ago are refused. `checkpoints` are the adapter folders of
        the steps `config` scores with (`config.named_steps()`).
        """
        started = time.perf_counter()
        check_groups(groups)
        self._others.checkpoints = checkpoints or {}
        advantages = group_advantages(groups, scale_rewards=config.scale_rewards, min_group_std=config.min_group_std)
        hints = Hints.of(groups, self.tokenizer) if config.self_distill else Hints()
        values, kept = hints.trained(advantages, config)
        sequences, stats = build_sequences(groups, self.store, self.tokenizer, values, kept, policy)
        metrics: dict[str, float] = {
            **reward_stats(groups),
            "groups_total": float(len(groups)),
            "groups_skipped_zero_variance": float(len(advantages.skipped)),
            **({"trajectories_hinted": float(len(hints.ids))} if config.self_distill else {}),
            "sequences": float(len(sequences)),
            "tokens_trained": float(sum(s.trained_tokens for s in sequences)),
            **stats.as_metrics(),
            "optimizer_steps": 0.0,
            "skipped": 1.0,
            "loss": 0.0,
            "grad_norm": 0.0,
        }
        if sequences:
            metrics.update(self._restoring(lambda: self._optimize(sequences, config, progress, hints)))
        return timed(metrics, started)

    def train_sft(
        self,
        trajectories: list[Trajectory],
        config: TrainSFTConfig,
        progress: Progress | None = None,
        *,
        policy: Policy,
    ) -> dict[str, float]:
        """One train_sft call: cross-entropy on the assistant tokens, one optimizer step per batch of trajectories.

        Each batch's loss is the mean over its assistant tokens; the call's `loss` is the mean over its batches.
        """
        started = time.perf_counter()
        last_only = config.train_on == "last_assistant"
        sequences, stats = sft_sequences(trajectories, self.store, self.tokenizer, policy, last_only)
        of: dict[int, list[TrainSequence]] = {}
        for sequence in sequences:
            of.setdefault(sequence.trajectory, []).append(sequence)
        batches = [[s for t in indices for s in of.get(t, [])] for indices in config.batches(len(trajectories))]
        rates = config.learning_rates(len(batches))
        if not any(s.trained_tokens for s in sequences):
            raise TrainingInputError(
                "no assistant token is left to train on: every reply was cut at the context; shorten the "
                "conversations or drop truncate_to_context"
            )
        metrics: dict[str, float] = {
            "trajectories": float(len(trajectories)),
            "sequences": float(len(sequences)),
            "tokens_trained": float(sum(s.trained_tokens for batch in batches for s in batch)),
            **stats.as_metrics(),
            "learning_rate": sum(rates) / len(rates),
            **self._restoring(lambda: self._imitate(batches, rates, config, progress)),
        }
        return timed(metrics, started)

    def _imitate(
        self, batches: list[list[TrainSequence]], rates: list[float], config: TrainSFTConfig, progress: Progress | None
    ) -> dict[str, float]:
        optimizer = self._optimizer_for(rates[0], config.weight_decay)
        params = [p for p in self.model.parameters() if p.requires_grad]
        shares = [self._share(chunks(b, config.micro_batch_size)) for b in batches]
        total, done = sum(len(chunk) for share in shares for chunk in share), 0
        losses: list[float] = []
        grad_norm = 0.0
        with self._updating(optimizer, checkpointing=False):
            for batch_sequences, share, rate in zip(batches, shares, rates, strict=True):
                tokens = sum(s.trained_tokens for s in batch_sequences)
                if not tokens:  # every reply was truncated away: nothing to imitate in this batch
                    continue
                for group in optimizer.param_groups:
                    group["lr"] = rate
                optimizer.zero_grad(set_to_none=True)  # each step on its own batch's gradients only
                loss_sum = 0.0
                for c, chunk in enumerate(share):
                    batch = collate(chunk, self._pad_id(), params[0].device)
                    with self.ranks.syncing(c == len(share) - 1):
                        logps, logits = token_logprobs(
                            self._forward,
                            batch["input_ids"],
                            batch["attention_mask"],
                            mask=batch["mask"],
                            sharing=self._sharing,
                        )
                        del logits
                        loss = -(logps * batch["mask"]).sum() / tokens
                        (loss * self.ranks.world).backward()
                    loss_sum += float(loss.detach())
                    done += len(chunk)
                    if progress is not None:
                        progress(done, total, {"loss": loss_sum})
                [loss_sum] = self.ranks.summed([loss_sum])
                grad_norm = apply(optimizer, params, loss_sum, config.max_grad_norm, "the SFT loss")
                losses.append(loss_sum)
        return {
            "loss": sum(losses) / len(losses) if losses else 0.0,
            "loss_first": losses[0] if losses else 0.0,
            "loss_last": losses[-1] if losses else 0.0,
            "grad_norm": grad_norm,
            "optimizer_steps": float(len(losses)),
        }

    def _optimize(
        self, sequences: list[TrainSequence], config: TrainConfig, progress: Progress | None, hints: Hints
    ) -> dict[str, float]:
        optimizer = self._optimizer_for(config.learning_rate, config.weight_decay)
        params = [p for p in self.model.parameters() if p.requires_grad]
        device = params[0].device
        trajectories = {(s.group, s.trajectory) for s in sequences if s.trained_tokens}
        totals = BatchTotals(trajectories=len(trajectories), tokens=sum(s.trained_tokens for s in sequences))

        share = self._share(chunks(sequences, config.micro_batch_size, config.micro_batch_tokens))
        batches = [collate(chunk, self._pad_id(), device) for chunk in share]
        teacher = self._teacher_logprobs(share, batches, hints, config) if config.self_distill else None
        with self._updating(optimizer, checkpointing=config.gradient_checkpointing):
            metrics = self._grpo_iterations(optimizer, params, batches, totals, config, progress, teacher)
        if hints.too_long:
            metrics["hints_too_long"] = float(hints.too_long)
        return metrics

    def _teacher_logprobs(
        self, share: list[list[TrainSequence]], batches: list[dict[str, Any]], hints: Hints, config: TrainConfig
    ) -> list[torch.Tensor]:
        """The teacher's logprobs of each micro-batch's tokens with the hints in view (NaN where a row has none)."""
        import torch

        teacher: Which = "policy" if config.teacher == "self" else config.teacher
        self.model.eval()
        with torch.no_grad(), self._others.active(teacher):
            return [
                teacher_logprobs(
                    chunk,
                    batch["input_ids"].shape[1],
                    hints,
                    lambda hinted: self._logprobs(hinted)[0],
                    pad_id=self._pad_id(),
                    bos_id=self.tokenizer.bos_token_id,
                    context=getattr(self.model.config, "max_position_embeddings", None),
                    device=batch["input_ids"].device,
                )
                for chunk, batch in zip(share, batches, strict=True)
            ]

    def _share(self, micro_batches: list[list[TrainSequence]]) -> list[list[TrainSequence]]:
        """This process's micro-batches of a step (all of them when it trains alone)."""
        return self.ranks.share(micro_batches, [empty_sequence(self._pad_id())])

    def _grpo_iterations(
        self,
        optimizer: torch.optim.Optimizer,
        params: list[torch.Tensor],
        batches: list[dict[str, Any]],
        totals: BatchTotals,
        config: TrainConfig,
        progress: Progress | None,
        teacher: list[torch.Tensor] | None = None,
    ) -> dict[str, float]:
        old = self._no_grad_logprobs(batches, "policy") if config.num_iterations > 1 else None
        reference: Which = "base" if config.reference_step is None else config.reference_step
        ref = self._no_grad_logprobs(batches, reference) if config.beta > 0 else None
        total_work, done = sum(b["input_ids"].shape[0] for b in batches) * config.num_iterations, 0
        sums = dict.fromkeys(SUMS, 0.0)
        gap_max = 0.0
        grad_norm = 0.0
        self.model.train()
        for iteration in range(config.num_iterations):
            optimizer.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for b, batch in enumerate(batches):
                with self.ranks.syncing(b == len(batches) - 1):
                    logps, logits = self._logprobs(batch)
                    old_logps = logps.detach() if old is None else old[b]
                    if iteration == 0:
                        gap_max = max(gap_max, first_pass_sums(sums, batch, old_logps, logits))
                    del logits  # not kept through backward: the graph holds only what it needs
                    loss, batch_sums = policy_loss(
                        logps,
                        old_logps,
                        batch["advantages"],
                        batch["mask"],
                        config,
                        totals,
                        None if ref is None else ref[b],
                        trajectory_tokens=batch["trajectory_tokens"],
                        sampler_logps=batch["sampler_logprobs"],
                        teacher_logps=None if teacher is None else teacher[b],
                    )
                    (loss * self.ranks.world).backward()  # DDP and FSDP average over the ranks: sum instead
                loss_sum += float(loss.detach())
                sums["clipped_tokens"] += batch_sums["clipped_tokens"]
                if iteration == 0:
                    sums["kl_sum"] += batch_sums.get("kl_sum", 0.0)
                    for key in ("masked_tokens", "distill_gap_sum", "hinted_tokens"):
                        sums[key] += batch_sums.get(key, 0.0)
                done += batch["input_ids"].shape[0]
                if progress is not None:
                    progress(done, total_work, {"loss": loss_sum})
            [loss_sum] = self.ranks.summed([loss_sum])
            grad_norm = apply(optimizer, params, loss_sum, config.max_grad_norm, "the GRPO loss")
            if iteration == 0:
                sums["loss"] = loss_sum
        local = [key for key in sums if key != "loss"]  # the loss was summed over the ranks for _apply
        sums.update(zip(local, self.ranks.summed([sums[key] for key in local]), strict=True))
        trained = max(totals.tokens, 1)
        metrics = {
            "loss": sums["loss"],
            "grad_norm": grad_norm,
            "optimizer_steps": float(config.num_iterations),
            "skipped": 0.0,
            "clip_fraction": sums["clipped_tokens"] / (trained * config.num_iterations),
            "entropy": sums["entropy_sum"] / trained,
            "logprob_gap_sampler": sums["gap_sum"] / sums["gap_tokens"] if sums["gap_tokens"] else math.nan,
            "logprob_gap_sampler_max": self.ranks.largest(gap_max) if sums["gap_tokens"] else math.nan,
            "kl_sampler": sums["gap_kl_sum"] / sums["gap_tokens"] if sums["gap_tokens"] else math.nan,
            "learning_rate": config.learning_rate,
        }
        if config.beta > 0:
            metrics["kl"] = sums["kl_sum"] / trained
        if config.icepop is not None:
            metrics["mismatch_masked"] = sums["masked_tokens"] / trained
        if config.self_distill:
            metrics["hinted_fraction"] = sums["hinted_tokens"] / trained
            if sums["hinted_tokens"]:  # the mean logp - logp_teacher of the hinted tokens: KL(policy || teacher), k1
                metrics["self_distill_kl"] = sums["distill_gap_sum"] / sums["hinted_tokens"]
        return {k: v for k, v in metrics.items() if not (isinstance(v, float) and math.isnan(v))}

    def _no_grad_logprobs(self, batches: list[dict[str, Any]], which: Which) -> list[torch.Tensor]:
        """Logprobs of the current policy, the base model or a checkpoint (other_policies.py) for every micro-batch."""
        import torch

        self.model.eval()
        with torch.no_grad(), self._others.active(which):
            return [self._logprobs(b)[0] for b in batches]

    def _logprobs(self, batch: dict[str, Any]) -> tuple[torch.Tensor, ScaledLogits]:
        return token_logprobs(
            self._forward,
            batch["input_ids"],
            batch["attention_mask"],
            batch["temperatures"],
            batch["mask"],
            self._sharing,
        )

    def _optimizer_for(self, learning_rate: float, weight_decay: float) -> torch.optim.Optimizer:
        import torch

        if self._optimizer is None:
            params = [p for p in self.model.parameters() if p.requires_grad]
            if not params:
                raise RuntimeError("the model has no trainable parameters; is the LoRA adapter active?")
            self._optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay)
            if self._initial_state:
                self._optimizer.load_state_dict(self._initial_state)
        for group in self._optimizer.param_groups:  # each call's config wins over the checkpointed one
            group["lr"] = learning_rate
            group["weight_decay"] = weight_decay
        return self._optimizer

    @contextlib.contextmanager
    def _updating(self, optimizer: torch.optim.Optimizer, *, checkpointing: bool) -> Iterator[None]:
        """Training mode (and activation checkpointing, which drops the KV cache a shared prompt needs: no sharing
        meanwhile) for the updates; gradients and modes put back after."""
        was_training, sharing = self.model.training, self._sharing
        if checkpointing:
            activation_checkpointing(self.model.base_model.model, on=True)
            self._sharing = None
        try:
            self.model.train()
            yield
        finally:
            optimizer.zero_grad(set_to_none=True)
            self.model.train(was_training)
            self._sharing = sharing
            if checkpointing:
                activation_checkpointing(self.model.base_model.model, on=False)

    def _restoring(self, work: Callable[[], dict[str, float]]) -> dict[str, float]:
        """Run the updates of `work`; if anything fails, the weights and optimizer state are put back."""
        snapshot = self._snapshot()
        try:
            return work()
        except BaseException:
            self._restore(snapshot)
            raise

    def _snapshot(self) -> tuple[dict[str, torch.Tensor], dict | None]:
        weights = weights_copy(self.model)
        state = copy.deepcopy(self._optimizer.state_dict()) if self._optimizer is not None else None
        return weights, state

    def _restore(self, snapshot: tuple[dict[str, torch.Tensor], dict | None]) -> None:
        weights, state = snapshot
        put_back(self.model, weights)
        if self._optimizer is not None:
            if state is None:
                self._optimizer = None
            else:
                self._optimizer.load_state_dict(state)

    def _pad_id(self) -> int:
        for candidate in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id):
            if candidate is not None:
                return int(candidate)
        return 0
