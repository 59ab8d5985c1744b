"""Self-distillation with hints: a teacher that sees privileged context scores the policy's own sampled tokens.

A trajectory's `hint` (a reference answer, a judge's feedback) is rendered as a system message by the model's own
chat template (plain text for a template without one) and put into each of its sequences just before the reply it
informs: before the assistant header (what `add_generation_prompt` adds) that opens the first trained turn, so a
small model reads it next to the question rather than above a long system prompt (at the start, after a BOS, where
no header is found). The student's tokens after it are unchanged, so the teacher's logprob of every trained token
lines up with the student's, shifted by the hint's length. The loss (training/loss.py) adds `self_distill * (logp - logp_teacher)`
per trained token, weighted by the importance ratio: its gradient is the per-token reverse-KL gradient of on-policy
distillation. The teacher scores before the step's first update, without gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from art_agents.server.training.advantages import GroupAdvantages
from art_agents.server.training.batches import collate
from art_agents.server.training.sequences import TrainSequence

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from art_agents.train_config import TrainConfig
    from art_agents.trajectory import TrajectoryGroup

HINT_HEADER = "Privileged hint for the task that follows (the user does not see it; use it, do not mention it):\n"


def hint_ids(tokenizer: Any, hint: str) -> list[int]:
    """The hint as the tokens of a system message of the model's template, without a BOS (the sequence has one)."""
    content = HINT_HEADER + hint
    try:
        text = tokenizer.apply_chat_template([{"role": "system", "content": content}], tokenize=False)
    except Exception:  # a template that refuses a system message (or a lone one): the hint as plain text
        text = content + "\n\n"
    if tokenizer.bos_token and text.startswith(tokenizer.bos_token):
        text = text[len(tokenizer.bos_token) :]
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def reply_header(tokenizer: Any) -> list[int]:
    """The tokens that open an assistant reply in the model's template ([] when it has none to find)."""
    messages = [{"role": "user", "content": "x"}]
    try:
        closed = tokenizer.apply_chat_template(messages, tokenize=False)
        opened = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception:
        return []
    return (
        list(tokenizer(opened[len(closed) :], add_special_tokens=False)["input_ids"])
        if opened.startswith(closed)
        else []
    )


@dataclass
class Hints:
    """The hint tokens of each trained trajectory that has one, keyed by (group, trajectory)."""

    ids: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    header: list[int] = field(default_factory=list)  # what opens a reply: the hint goes just before it
    too_long: int = 0  # sequences whose hinted form would not fit the context: they train without a teacher

    @classmethod
    def of(cls, groups: list[TrajectoryGroup], tokenizer: Any) -> Hints:
        ids = {
            (g, t): hint_ids(tokenizer, trajectory.hint)
            for g, group in enumerate(groups)
            for t, trajectory in enumerate(group.trajectories)
            if trajectory.hint
        }
        return cls(ids, reply_header(tokenizer) if ids else [])

    def position(self, sequence: TrainSequence, bos_id: int | None) -> int:
        """Where the hint goes: before the last reply header that ends by the first trained token, else the start."""
        first = sequence.mask.index(True) if True in sequence.mask else len(sequence.mask)
        size = len(self.header)
        for start in range(first - size, -1, -1) if size else ():
            if sequence.token_ids[start : start + size] == self.header:
                return start
        return 1 if bos_id is not None and sequence.token_ids[:1] == [bos_id] else 0

    def trained(
        self, advantages: GroupAdvantages, config: TrainConfig
    ) -> tuple[dict[tuple[int, int], float], set[int]]:
        """Advantages of the trajectories that train and their groups: with self-distillation, hinted trajectories
        of skipped groups join with advantage 0 (the hint is their only signal); `self_distill_only` trains the
        hinted ones alone, every advantage 0."""
        if not config.self_distill:
            return advantages.values, advantages.kept
        if config.self_distill_only:
            values = dict.fromkeys(self.ids, 0.0)
        else:
            values = {**dict.fromkeys(self.ids, 0.0), **advantages.values}
        return values, {g for g, _ in values}

    def teacher_sequence(
        self, sequence: TrainSequence, bos_id: int | None, context: int | None
    ) -> TrainSequence | None:
        """`sequence` with its hint in it (`position`), or None without a hint or when it would not fit."""
        hint = self.ids.get((sequence.group, sequence.trajectory))
        if not hint or not sequence.trained_tokens:  # no hint, or a rank's empty filler sequence
            return None
        if context is not None and len(sequence.token_ids) + len(hint) > context:
            self.too_long += 1
            return None
        at = self.position(sequence, bos_id)

        def inserted(values: list, fill: Any) -> list:
            return values[:at] + [fill] * len(hint) + values[at:]

        return replace(
            sequence,
            token_ids=sequence.token_ids[:at] + hint + sequence.token_ids[at:],
            mask=inserted(sequence.mask, False),
            sampler_logprobs=inserted(sequence.sampler_logprobs, math.nan),
            temperatures=inserted(sequence.temperatures, 1.0) if sequence.temperatures else [],
        )


def teacher_logprobs(
    chunk: list[TrainSequence],
    width: int,
    hints: Hints,
    score: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    *,
    pad_id: int,
    bos_id: int | None,
    context: int | None,
    device: torch.device,
) -> torch.Tensor:
    """(len(chunk), width - 1) teacher logprobs of the chunk's tokens, aligned with the student's; NaN where a row
    has no hint. `score` is the teacher's forward pass (no gradients) over a collated batch."""
    import torch

    aligned = torch.full((len(chunk), width - 1), math.nan, dtype=torch.float32, device=device)
    rows = [(r, hinted) for r, s in enumerate(chunk) if (hinted := hints.teacher_sequence(s, bos_id, context))]
    if not rows:
        return aligned
    teacher = score(collate([hinted for _, hinted in rows], pad_id, device))
    for k, (r, hinted) in enumerate(rows):
        shift = len(hinted.token_ids) - len(chunk[r].token_ids)
        length = len(chunk[r].token_ids) - 1
        aligned[r, :length] = teacher[k, shift : shift + length].float()
    return aligned
