"""Our GRPO, CISPO and GSPO losses and gradients against TRL's own `GRPOTrainer._compute_loss`, at temperature 0.7.

TRL is the reference (tests/trl_reference.py drives its real code); our formulas are not. Each
variant is checked on a real LoRA of the tiny model: loss and every LoRA gradient to 1e-5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_training_trainer import lora_model
from trl_reference import trl_grpo_loss, trl_pad_batch

from art_agents.server.training.logprobs import token_logprobs
from art_agents.server.training.loss import BatchTotals, policy_loss
from art_agents.server.training.sequences import TrainSequence, merge_turns
from art_agents.server.training.shared_prefix import MIN_SHARED_TOKENS, sharing_for
from art_agents.train_config import TrainConfig

TEMPERATURE = 0.7
PROMPT = [11, 42, 7, 99, 5]
LONG_PROMPT = [11, 42, 7, 99, 5, 60, 3, 71, 18, 9, 140, 33, 2, 87, 45, 120, 6, 19, 77, 28]  # computed once
COMPLETIONS = [[17, 23, 64], [8, 8, 31, 70, 12, 3], [55]]
ADVANTAGES = [1.0, -0.5, 0.3]


@pytest.fixture(scope="module")
def model(tiny_model_path: Path) -> Any:
    peft_model = lora_model(tiny_model_path)
    with torch.no_grad():  # a LoRA that is not the identity, so the adapter and the base model differ
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.02, generator=torch.Generator().manual_seed(hash(name) % 1000))
    return peft_model.train()


def ours(
    model: Any,
    sequences: list[TrainSequence],
    config: TrainConfig,
    extras: dict[str, torch.Tensor],
    *,
    shared: bool = False,
) -> torch.Tensor:
    """Our loss over right-padded sequences (the trainer's layout), with `extras` placed on the trained tokens;
    `shared`: the prompt common to every row computed once, as the trainer does."""
    width = max(len(s.token_ids) for s in sequences)
    ids = torch.tensor([s.token_ids + [0] * (width - len(s.token_ids)) for s in sequences])
    attention = torch.tensor([[1] * len(s.token_ids) + [0] * (width - len(s.token_ids)) for s in sequences])
    mask = torch.tensor([s.mask + [False] * (width - len(s.mask)) for s in sequences])[:, 1:]
    temps = torch.tensor([s.temperatures + [1.0] * (width - len(s.temperatures)) for s in sequences])[:, 1:]
    if shared:
        logps, _ = token_logprobs(model, ids, attention, temps, mask, sharing_for(model, None))
    else:
        logps, _ = token_logprobs(model, ids, attention, temps)

    def placed(name: str) -> torch.Tensor | None:
        if name not in extras:
            return None
        full = torch.full_like(logps, float("nan") if name == "sampler" else 0.0)
        full[mask] = extras[name][extras["completion_mask"].bool()]
        return full

    old = placed("old")
    trajectories = {(s.group, s.trajectory) for s in sequences}
    return policy_loss(
        logps,
        logps.detach() if old is None else old,
        torch.tensor([s.advantage for s in sequences]),
        mask,
        config,
        BatchTotals(trajectories=len(trajectories), tokens=int(mask.sum())),
        placed("ref"),
        trajectory_tokens=torch.tensor([float(s.trajectory_tokens or s.trained_tokens) for s in sequences]),
        sampler_logps=placed("sampler"),
    )[0]


def single_turn_sequences(prompt: list[int] = PROMPT) -> list[TrainSequence]:
    return [
        TrainSequence(
            token_ids=prompt + c,
            mask=[False] * len(prompt) + [True] * len(c),
            sampler_logprobs=[],
            temperatures=[1.0] * len(prompt) + [TEMPERATURE] * len(c),
            advantage=a,
            trajectory=i,
        )
        for i, (c, a) in enumerate(zip(COMPLETIONS, ADVANTAGES, strict=True))
    ]


def gradients(model: Any, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def completion_logps(
    model: Any, completion_ids: torch.Tensor, *, base: bool = False, prompt: list[int] = PROMPT
) -> torch.Tensor:
    """(B, C) logprobs of the completions at TEMPERATURE (TRL's layout), without gradients."""
    import contextlib

    ids = torch.cat([torch.tensor([prompt] * len(COMPLETIONS)), completion_ids], dim=1)
    with torch.no_grad(), model.disable_adapter() if base else contextlib.nullcontext():
        logits = model(input_ids=ids).logits[:, len(prompt) - 1 : -1].float() / TEMPERATURE
    return torch.log_softmax(logits, -1).gather(-1, completion_ids[..., None])[..., 0]


VARIANTS = {
    "on-policy": {},
    "off-policy": {"old": True, "epsilon_high": 0.28},
    "kl": {"old": True, "beta": 0.04},
    "tis": {"old": True, "tis_cap": 1.2},
}


VARIANTS_BY_LOSS = [(loss, variant) for loss in ("grpo", "dr_grpo", "dapo") for variant in VARIANTS] + [
    ("cispo", "on-policy"),  # CISPO (TRL's cispo: the weight min(r, epsilon_high) carries no gradient)
    ("cispo", "capped"),
    ("cispo", "kl"),
    ("grpo", "sequence"),  # GSPO: one importance ratio per sequence
    ("dapo", "sequence"),
    ("grpo", "sequence-kl"),
]
VARIANTS |= {
    "capped": {"old": True, "epsilon_high": 1.1},  # some ratios over the cap, some under
    "sequence": {"old": True, "epsilon": 3e-2, "epsilon_high": 4e-2, "level": "sequence"},
    "sequence-kl": {"old": True, "beta": 0.04, "level": "sequence"},
}


@pytest.mark.parametrize(
    ("loss_type", "variant", "prompt"),
    [(loss, variant, PROMPT) for loss, variant in VARIANTS_BY_LOSS]
    + [("grpo", "off-policy", LONG_PROMPT), ("dapo", "kl", LONG_PROMPT), ("grpo", "sequence", LONG_PROMPT)],
)
def test_loss_and_gradients_match_trl(model: Any, loss_type: str, variant: str, prompt: list[int]) -> None:
    """With a long prompt, ours computes it once for the three completions (training/shared_prefix.py)."""
    settings = {"epsilon_high": 5.0, **VARIANTS[variant]} if loss_type == "cispo" else VARIANTS[variant]
    prompt_ids, prompt_mask, completion_ids, completion_mask = trl_pad_batch([prompt] * 3, COMPLETIONS, 0)
    current = completion_logps(model, completion_ids, prompt=prompt)
    noise = torch.randn(current.shape, generator=torch.Generator().manual_seed(3)) * 0.3
    extras: dict[str, torch.Tensor] = {"completion_mask": completion_mask}
    trl_kwargs: dict[str, Any] = {}
    if settings.get("old"):
        extras["old"] = (current + noise) * completion_mask
        trl_kwargs["old_per_token_logps"] = extras["old"]
    if settings.get("beta"):
        extras["ref"] = completion_logps(model, completion_ids, base=True, prompt=prompt)
        trl_kwargs["ref_per_token_logps"] = extras["ref"]
    if settings.get("tis_cap"):
        extras["sampler"] = current - noise.flip(0)
        trl_kwargs["importance_sampling_ratio"] = torch.exp(
            (extras["old"] - extras["sampler"]) * completion_mask
        ).clamp(max=settings["tis_cap"])
    level = settings.get("level", "token")
    config = TrainConfig(
        loss=loss_type,  # type: ignore[arg-type]
        importance_sampling_level=level,
        epsilon=settings.get("epsilon", 0.2),
        epsilon_high=settings.get("epsilon_high"),
        beta=settings.get("beta", 0.0),
        tis_cap=settings.get("tis_cap"),
        max_completion_tokens=8,
    )
    reference = trl_grpo_loss(
        model, prompt_ids, completion_ids, completion_mask, torch.tensor(ADVANTAGES), loss_type=loss_type,
        temperature=TEMPERATURE, prompt_mask=prompt_mask, epsilon=settings.get("epsilon", 0.2),
        epsilon_high=settings.get("epsilon_high"), beta=settings.get("beta", 0.0), max_completion_length=8,
        importance_sampling_level=level, **trl_kwargs,
    )  # fmt: skip
    assert (len(prompt) >= MIN_SHARED_TOKENS) == (prompt is LONG_PROMPT)
    mine = ours(model, single_turn_sequences(prompt), config, extras, shared=prompt is LONG_PROMPT)
    assert float(mine.detach()) == pytest.approx(float(reference.detach()), abs=1e-5)
    theirs, got = gradients(model, reference), gradients(model, mine)
    assert theirs.keys() == got.keys() and theirs
    assert max(float((theirs[n] - got[n]).abs().max()) for n in theirs) < 1e-5


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_a_trajectory_weighs_the_same_merged_or_split(model: Any, loss_type: str) -> None:
    """A 3-turn trajectory as one merged sequence or as 3 sequences: the same loss and gradients,
    equal to TRL's for the merged sequence (one trajectory, one row)."""
    from art_agents.server.training.sequences import _TurnTokens

    first, second, third = COMPLETIONS
    turns = [
        _TurnTokens(PROMPT, first, [0.0] * len(first), "a", TEMPERATURE),
        _TurnTokens(PROMPT + first + [2, 4], second, [0.0] * len(second), "b", TEMPERATURE),
        _TurnTokens(PROMPT + first + [2, 4] + second + [9], third, [0.0] * len(third), "c", TEMPERATURE),
    ]
    merged = merge_turns(turns)
    split = [s for turn in turns for s in merge_turns([turn])]
    assert len(merged) == 1 and len(split) == 3
    for sequences in (merged, split):
        for sequence in sequences:
            sequence.advantage = 0.8
            sequence.trajectory_tokens = sum(len(c) for c in COMPLETIONS)
    config = TrainConfig(loss=loss_type, max_completion_tokens=16)  # type: ignore[arg-type]
    one, three = ours(model, merged, config, {}), ours(model, split, config, {})
    assert float(one.detach()) == pytest.approx(float(three.detach()), abs=1e-6)
    grads_one, grads_three = gradients(model, one), gradients(model, three)
    assert max(float((grads_one[n] - grads_three[n]).abs().max()) for n in grads_one) < 1e-6

    tokens = merged[0].token_ids
    trained = torch.tensor([merged[0].mask[len(PROMPT) :]], dtype=torch.long)
    reference = trl_grpo_loss(
        model, torch.tensor([PROMPT]), torch.tensor([tokens[len(PROMPT) :]]), trained, torch.tensor([0.8]),
        loss_type=loss_type, temperature=TEMPERATURE, max_completion_length=16,
    )  # fmt: skip
    assert float(one.detach()) == pytest.approx(float(reference.detach()), abs=1e-5)


def test_zero_mean_advantages_at_ratio_one_give_zero_loss_however_turns_merged(model: Any) -> None:
    """Per-sequence weighting would count the split trajectory three times: loss -(0.8 - 3*0.8)/4 != 0."""
    turns_split = [s for turn in COMPLETIONS for s in merge_turns([_turn(turn)])]
    for s in turns_split:
        s.advantage, s.trajectory, s.trajectory_tokens = -0.8, 1, sum(len(c) for c in COMPLETIONS)
    whole = single_turn_sequences()[0]
    whole.advantage, whole.trajectory = 0.8, 0
    loss = ours(model, [whole, *turns_split], TrainConfig(), {})
    assert abs(float(loss.detach())) < 1e-6


def _turn(completion: list[int]) -> Any:
    from art_agents.server.training.sequences import _TurnTokens

    return _TurnTokens(PROMPT, completion, [0.0] * len(completion), None, TEMPERATURE)


def test_the_sequence_level_and_the_cispo_cap_change_what_is_trained(model: Any) -> None:
    """The variants above are not the token-level GRPO loss in disguise: each setting moves the loss."""
    _, _, completion_ids, completion_mask = trl_pad_batch([PROMPT] * 3, COMPLETIONS, 0)
    current = completion_logps(model, completion_ids)
    noise = torch.randn(current.shape, generator=torch.Generator().manual_seed(3)) * 0.3
    extras = {"completion_mask": completion_mask, "old": (current + noise) * completion_mask}

    def loss(**settings: Any) -> float:
        return float(ours(model, single_turn_sequences(), TrainConfig(**settings), extras).detach())

    assert loss(importance_sampling_level="sequence") != pytest.approx(loss(), abs=1e-4)
    assert loss(loss="cispo", epsilon_high=1.1) != pytest.approx(loss(loss="cispo", epsilon_high=5.0), abs=1e-4)
    with pytest.raises(ValueError, match="cispo' caps the importance ratio at epsilon_high"):
        TrainConfig(loss="cispo")
