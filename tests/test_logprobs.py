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


def test_logits_start_at_the_first_trained_token_with_the_same_values_and_gradients(tiny_model_path) -> None:
    """A prompt-heavy batch: the head runs from the first trained column of any row on, and the trained columns'
    logprobs, the entropy and the LoRA gradients equal those of logits over every position."""
    from art_agents.server.lora_model import load_peft_model
    from art_agents.server.ops.quickstart import TOY_MODEL_CONFIG

    model, _ = load_peft_model(str(tiny_model_path), TOY_MODEL_CONFIG)
    torch.manual_seed(2)
    ids = torch.randint(3, 200, (2, 24))
    attention = torch.ones_like(ids)
    attention[1, 20:] = 0  # right padding
    temperatures = torch.rand(2, 23) + 0.5
    mask = torch.zeros(2, 23, dtype=torch.bool)
    mask[0, 15:22], mask[1, 9:19] = True, True  # row 1's first trained column (9) is where the head starts
    grads = []
    for given in (None, mask):
        model.zero_grad()
        logps, scaled = logprobs.token_logprobs(model, ids, attention, temperatures, given)
        (logps * mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
        if given is None:
            full, full_entropy = logps.detach(), scaled.entropy_sum(mask)
    assert scaled.start == 9 and scaled.logits.shape[1] == 23 - 9
    assert bool((logps[:, :9] == 0).all())
    torch.testing.assert_close(logps.detach()[mask], full[mask], atol=1e-6, rtol=1e-6)
    assert scaled.entropy_sum(mask) == pytest.approx(full_entropy, rel=1e-6)
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5, msg=name)
