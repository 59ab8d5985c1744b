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
    from art_agents.server.models.lora_model import load_peft_model
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


@pytest.mark.parametrize("family", ["qwen3", "gpt_oss"])  # gpt_oss: the prompt runs past its 128-token window
def test_a_prompt_every_row_shares_is_computed_once_with_the_same_values_and_gradients(
    tmp_path, tiny_model_path, family
) -> None:
    """Three rows with a 150-token common prompt: one pass over the prompt (batch 1), then the rows' remainders
    over its repeated KV cache; logprobs and LoRA gradients equal the per-row pass's."""
    from art_agents.server.models.lora_model import load_peft_model
    from art_agents.server.ops.family_models import build_family_model
    from art_agents.server.ops.quickstart import TOY_MODEL_CONFIG
    from art_agents.server.training.shared_prefix import sharing_for

    path = tiny_model_path if family == "qwen3" else build_family_model(tmp_path / family, family)
    model, _ = load_peft_model(str(path), TOY_MODEL_CONFIG)
    torch.manual_seed(3)
    ids = torch.randint(3, 200, (3, 180))
    ids[:, :150] = ids[0, :150]
    attention = torch.ones_like(ids)
    attention[2, 170:] = 0
    mask = torch.zeros(3, 179, dtype=torch.bool)
    mask[0, 155:179], mask[1, 152:170], mask[2, 160:169] = True, True, True
    temperatures = torch.rand(3, 179) + 0.5
    rows: list[tuple[int, ...]] = []
    model.get_input_embeddings().register_forward_hook(lambda _m, args, _out: rows.append(tuple(args[0].shape)))
    results = []
    for sharing in (None, sharing_for(model, None)):
        model.zero_grad()
        logps, _ = logprobs.token_logprobs(model, ids, attention, temperatures, mask, sharing)
        (logps * mask * torch.linspace(-1, 1, 179)).sum().backward()
        results.append((logps.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}))
    assert rows == [(3, 180), (1, 150), (3, 30)]
    (full, full_grads), (shared, shared_grads) = results
    torch.testing.assert_close(shared[mask], full[mask], atol=1e-5, rtol=1e-5)
    for name, grad in full_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=1e-5)


def test_rows_that_differ_early_or_a_single_row_are_not_shared() -> None:
    from art_agents.server.training.shared_prefix import MIN_SHARED_TOKENS, shared_length

    ids = torch.arange(40).repeat(3, 1)
    attention = torch.ones_like(ids)
    assert shared_length(ids, attention, 30) == 30  # capped at the first trained column
    assert shared_length(ids[:1], attention[:1], 30) == 0  # one row: nothing to share
    ids[1, MIN_SHARED_TOKENS - 1] = -1
    assert shared_length(ids, attention, 30) == 0  # too short to pay for a second pass
    ids[1, MIN_SHARED_TOKENS - 1], ids[2, 20] = MIN_SHARED_TOKENS - 1, -1
    assert shared_length(ids, attention, 30) == 20
    attention[0, 18:] = 0
    assert shared_length(ids, attention, 30) == 18  # padding is never shared


def test_a_model_with_linear_attention_layers_or_fsdp_does_not_share(tiny_model_path) -> None:
    """Qwen3-Next's linear-attention layers keep recurrent states a batch repeat of the cache would not carry."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from art_agents.server.models.lora_model import load_peft_model
    from art_agents.server.ops.quickstart import TOY_MODEL_CONFIG
    from art_agents.server.training.shared_prefix import sharing_for

    hybrid = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(
            "qwen3_next", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, vocab_size=100, num_experts=2, num_experts_per_tok=1,
            moe_intermediate_size=32, shared_expert_intermediate_size=32, linear_num_value_heads=2,
            linear_num_key_heads=1, linear_key_head_dim=16, linear_value_head_dim=16,
            layer_types=["linear_attention", "full_attention"],
        )
    )  # fmt: skip
    assert sharing_for(hybrid, None) is None
    attention_only, _ = load_peft_model(str(tiny_model_path), TOY_MODEL_CONFIG)
    assert sharing_for(attention_only, None) is not None
    assert sharing_for(attention_only, "ddp") is not None
    assert sharing_for(attention_only, "fsdp") is None
