"""Token logprobs computed a chunk at a time: the written-out formula's values and gradients, less memory."""

from __future__ import annotations

import pytest
import torch
from trl.trainer.utils import entropy_from_logits, selective_log_softmax

from art_agents.server.training import logprobs
from art_agents.server.training.logprobs import ScaledLogits, _SelectedLogprobs


def written_out(logits: torch.Tensor, targets: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    return selective_log_softmax(logits.float() / temperatures.unsqueeze(-1), targets)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_elements", [1 << 24, 100])  # one chunk per row; chunks of 3 positions
def test_values_and_gradients_match_the_written_out_formula(monkeypatch, dtype, chunk_elements) -> None:
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", chunk_elements)
    torch.manual_seed(0)
    logits = (torch.randn(3, 7, 33) * 3).to(dtype)
    targets = torch.randint(0, 33, (3, 7))
    temperatures = torch.rand(3, 7) + 0.5
    weights = torch.randn(3, 7)

    ours_in = logits.clone().requires_grad_()
    ours = _SelectedLogprobs.apply(ours_in, targets, temperatures)
    (ours * weights).sum().backward()
    theirs_in = logits.clone().requires_grad_()
    theirs = written_out(theirs_in, targets, temperatures)
    (theirs * weights).sum().backward()

    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2  # a bf16 gradient is rounded to bf16 on both sides
    torch.testing.assert_close(ours_in.grad.float(), theirs_in.grad.float(), atol=tolerance, rtol=tolerance)


def test_entropy_of_the_masked_positions(monkeypatch) -> None:
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 100)
    torch.manual_seed(1)
    logits, temperatures = torch.randn(2, 9, 40), torch.rand(2, 9) + 0.5
    mask = torch.rand(2, 9) > 0.4
    expected = entropy_from_logits((logits / temperatures.unsqueeze(-1))[mask]).sum()
    assert ScaledLogits(logits, temperatures).entropy_sum(mask) == pytest.approx(float(expected), rel=1e-5)


def test_only_the_models_logits_and_one_number_per_position_are_kept_for_backward() -> None:
    logits = torch.randn(2, 5, 11, requires_grad=True)
    out = _SelectedLogprobs.apply(logits, torch.randint(0, 11, (2, 5)), torch.ones(2, 5))
    saved = out.grad_fn.saved_tensors
    assert sum(t.numel() for t in saved if t.dim() == 3) == logits.numel()  # the logits themselves, no copy
    assert any(t.data_ptr() == logits.data_ptr() for t in saved)
