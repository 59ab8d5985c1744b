"""Each GRPO loss variant equals the formulas written out token by token (TRL itself is the reference in
test_trainer_against_trl.py); micro-batches of a step sum to the whole-step loss."""

from __future__ import annotations

import math

import pytest
import torch

from art_agents.server.training.loss import BatchTotals, policy_loss
from art_agents.train_config import TrainConfig

MASK = [[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [0, 1, 0, 1, 1, 0]]  # a merged sequence has a masked gap
ADVANTAGES = [1.3, -0.7, 0.4]


def _batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    shape = (len(MASK), len(MASK[0]))
    logps = -torch.rand(shape, generator=generator, dtype=torch.float64) * 3
    # old logprobs off by up to +-0.5 so some ratios leave the clip range on both sides
    old = logps + (torch.rand(shape, generator=generator, dtype=torch.float64) - 0.5)
    ref = logps + (torch.rand(shape, generator=generator, dtype=torch.float64) - 0.5) * 0.4
    return {"logps": logps, "old": old, "ref": ref}


def _reference(config: TrainConfig, batch: dict[str, torch.Tensor]) -> float:
    """Plain-Python GRPO loss from the formulas in TrainConfig / loss.py."""
    logps, old, ref = (batch[k].tolist() for k in ("logps", "old", "ref"))
    low, high = 1 - config.epsilon, 1 + (config.epsilon if config.epsilon_high is None else config.epsilon_high)
    per_sequence_sums, per_sequence_counts = [], []
    for i, row in enumerate(MASK):
        total, count = 0.0, 0
        for t, m in enumerate(row):
            if not m:
                continue
            a = ADVANTAGES[i]
            ratio = math.exp(logps[i][t] - old[i][t])
            token = -min(ratio * a, min(max(ratio, low), high) * a)
            if config.beta:
                d = ref[i][t] - logps[i][t]
                token += config.beta * (math.exp(d) - d - 1) * ratio
            total += token
            count += 1
        per_sequence_sums.append(total)
        per_sequence_counts.append(count)
    n, tokens = len(MASK), sum(per_sequence_counts)
    if config.loss == "grpo":
        return sum(s / c for s, c in zip(per_sequence_sums, per_sequence_counts, strict=True)) / n
    if config.loss == "dr_grpo":
        return sum(per_sequence_sums) / (n * config.max_completion_tokens)
    return sum(per_sequence_sums) / tokens


CONFIGS = [
    TrainConfig(loss="grpo"),
    TrainConfig(loss="grpo", beta=0.04, epsilon=0.1),
    TrainConfig(loss="dr_grpo", max_completion_tokens=16, beta=0.1),
    TrainConfig(loss="dapo", epsilon=0.2, epsilon_high=0.28),
    TrainConfig(loss="dapo", epsilon_high=0.28, beta=0.02),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.loss}-beta{c.beta}-eps{c.epsilon}-{c.epsilon_high}")
def test_loss_matches_reference(config: TrainConfig) -> None:
    batch = _batch()
    mask = torch.tensor(MASK, dtype=torch.bool)
    totals = BatchTotals(trajectories=len(MASK), tokens=int(mask.sum()))
    loss, sums = policy_loss(
        batch["logps"],
        batch["old"],
        torch.tensor(ADVANTAGES, dtype=torch.float64),
        mask,
        config,
        totals,
        ref_logps=batch["ref"],
    )
    assert float(loss) == pytest.approx(_reference(config, batch), abs=1e-5)
    assert sums["clipped_tokens"] > 0  # the batch really exercises clipping
    # micro-batching: the parts of a step sum to the whole-batch loss
    parts = [
        policy_loss(
            batch["logps"][s],
            batch["old"][s],
            torch.tensor(ADVANTAGES, dtype=torch.float64)[s],
            mask[s],
            config,
            totals,
            ref_logps=batch["ref"][s],
        )[0]
        for s in (slice(0, 2), slice(2, 3))
    ]
    assert float(sum(parts)) == pytest.approx(float(loss), abs=1e-9)


def test_on_policy_gradient_is_the_policy_gradient() -> None:
    """With old = logps.detach() (num_iterations=1) the ratio is 1 and d loss / d logp = -A * m / (len * N)."""
    batch = _batch()
    logps = batch["logps"].clone().requires_grad_(True)
    mask = torch.tensor(MASK, dtype=torch.bool)
    totals = BatchTotals(trajectories=len(MASK), tokens=int(mask.sum()))
    loss, _ = policy_loss(
        logps, logps.detach(), torch.tensor(ADVANTAGES, dtype=torch.float64), mask, TrainConfig(), totals
    )
    loss.backward()
    expected = torch.tensor(
        [[-ADVANTAGES[i] * m / (sum(row) * len(MASK)) for m in row] for i, row in enumerate(MASK)], dtype=torch.float64
    )
    assert torch.allclose(logps.grad, expected, atol=1e-12)
    assert float(loss.detach()) == pytest.approx(-sum(ADVANTAGES) / len(MASK), abs=1e-9)


def test_beta_without_reference_is_an_error() -> None:
    batch = _batch()
    mask = torch.tensor(MASK, dtype=torch.bool)
    with pytest.raises(ValueError, match="ref_logps"):
        policy_loss(
            batch["logps"],
            batch["old"],
            torch.tensor(ADVANTAGES, dtype=torch.float64),
            mask,
            TrainConfig(beta=0.1),
            BatchTotals(3, 10),
        )


@pytest.mark.parametrize("level", ["token", "sequence", "average", "geometric_average"])
@pytest.mark.parametrize("ppo", [True, False], ids=["ppo", "cispo"])
def test_arts_loss_options_train_as_arts_formulas(level: str, ppo: bool) -> None:
    """ART's `ppo` switch and importance-sampling levels, mapped by `art_train_config`, give the loss and gradient of
    ART's formulas written out here: the ratio mixes each token's own ratio r with its sequence's s (the exp of the
    mean log-ratio of its trained tokens); `ppo` takes the clipped surrogate with clip range 0.2, otherwise the
    REINFORCE term weighted by the ratio clipped to 1 - 1.0 .. 1 + 4.0 without gradient; mean over trained tokens."""
    from art_agents.art.arguments import art_train_config

    config = art_train_config(None, {"ppo": ppo, "importance_sampling_level": level})
    batch = _batch()
    mask = torch.tensor(MASK, dtype=torch.bool)
    advantages = torch.tensor(ADVANTAGES, dtype=torch.float64)
    totals = BatchTotals(trajectories=len(MASK), tokens=int(mask.sum()))
    ours_logps = batch["logps"].clone().requires_grad_(True)
    ours, _ = policy_loss(ours_logps, batch["old"], advantages, mask, config, totals)
    ours.backward()

    logps = batch["logps"].clone().requires_grad_(True)
    m = mask.to(torch.float64)
    log_r = logps - batch["old"]
    r, s = torch.exp(log_r), torch.exp((log_r * m).sum(1, keepdim=True) / m.sum(1, keepdim=True))
    ratio = {"token": r, "sequence": s.expand_as(r), "average": (r + s) / 2, "geometric_average": r**0.5 * s**0.5}
    a = advantages.unsqueeze(1)
    if ppo:
        per_token = -torch.min(ratio[level] * a, torch.clip(ratio[level], 0.8, 1.2) * a)
    else:
        per_token = -torch.clip(ratio[level].detach(), 0.0, 5.0) * a * logps
    arts = (per_token * m).sum() / m.sum()
    arts.backward()
    assert float(ours.detach()) == pytest.approx(float(arts.detach()), abs=1e-9)
    torch.testing.assert_close(ours_logps.grad, logps.grad, atol=1e-9, rtol=0)
