"""Serving from bf16 or int8 weights while the trainer trains in fp32, and the step's correction for the gap.

The loss's truncated importance weights and IcePop mask against a direct computation (values and gradients);
which config a step trains with; the precisions served end to end (streaming, logprobs, every protocol, the
prefix cache, a step, an older step); and the settings refused at register.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import anthropic
import pytest
import torch

from art_agents import ModelConfig, TrainableModel, Trajectory, TrajectoryGroup
from art_agents.backends.remote import RemoteBackend
from art_agents.capture import rollout
from art_agents.errors import ArtError
from art_agents.server.errors import ServiceError
from art_agents.server.models.serving_precision import (
    MISMATCH_ICEPOP,
    MISMATCH_TIS_CAP,
    check_serving_dtype,
    mismatch_corrected,
    serves_apart,
    serving_copy,
)
from art_agents.server.training.loss import BatchTotals, policy_loss
from art_agents.train_config import TrainConfig


def direct_loss(
    logps: torch.Tensor, old: torch.Tensor, sampler: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """DAPO's loss written out token by token: clipped ratio, truncated weight, IcePop's band, sum over T."""
    total = torch.zeros(())
    for i in range(logps.shape[0]):
        for t in range(logps.shape[1]):
            if not mask[i, t]:
                continue
            ratio = torch.exp(logps[i, t] - old[i, t])
            term = -torch.min(ratio * adv[i], torch.clamp(ratio, 0.8, 1.2) * adv[i])
            gap = math.exp(float(old[i, t] - sampler[i, t])) if not math.isnan(float(sampler[i, t])) else 1.0
            if not MISMATCH_ICEPOP[0] <= gap <= MISMATCH_ICEPOP[1]:
                continue
            total = total + term * min(gap, cap)
    return total / mask.sum()


def test_truncated_weights_and_icepop_mask_match_a_direct_computation() -> None:
    generator = torch.Generator().manual_seed(0)
    logps = (-torch.rand(3, 6, generator=generator) * 3).requires_grad_()
    old = logps.detach() + torch.randn(3, 6, generator=generator) * 0.1
    sampler = old + torch.tensor([[0.0, 0.3, -0.3, -1.0, -2.0, 1.0]] * 3)  # weights 1, .74, 1.35, 2.7, 7.4, .37
    sampler[1, 2] = math.nan  # the sampler's logprob unknown: weight 1, kept
    adv = torch.tensor([1.0, -0.5, 2.0])
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[2, 5] = False
    config = TrainConfig(loss="dapo", tis_cap=MISMATCH_TIS_CAP, icepop=MISMATCH_ICEPOP)
    loss, sums = policy_loss(logps, old, adv, mask, config, BatchTotals(3, int(mask.sum())), sampler_logps=sampler)
    (grad,) = torch.autograd.grad(loss, logps)

    direct_logps = logps.detach().clone().requires_grad_()
    expected = direct_loss(direct_logps, old, sampler, adv, mask, MISMATCH_TIS_CAP)
    (expected_grad,) = torch.autograd.grad(expected, direct_logps)
    assert abs(float(loss.detach()) - float(expected.detach())) < 1e-5
    assert torch.allclose(grad, expected_grad, atol=1e-5)
    assert sums["masked_tokens"] == 5  # weights 7.4 and .37 are outside (0.5, 5.0); one .37 is not trained anyway
    assert torch.all(grad[:, 4:] == 0) and torch.all(grad[:, :4] != 0)  # 2.7 is capped at 2, not masked


def test_without_a_sampler_gap_the_correction_changes_nothing() -> None:
    generator = torch.Generator().manual_seed(1)
    logps = -torch.rand(2, 5, generator=generator)
    mask, adv = torch.ones(2, 5, dtype=torch.bool), torch.tensor([1.0, -1.0])
    corrected = TrainConfig(tis_cap=MISMATCH_TIS_CAP, icepop=MISMATCH_ICEPOP)
    plain, _ = policy_loss(logps, logps, adv, mask, TrainConfig(), BatchTotals(2, 10), sampler_logps=logps)
    same, sums = policy_loss(logps, logps, adv, mask, corrected, BatchTotals(2, 10), sampler_logps=logps)
    assert float(plain) == float(same) and sums["masked_tokens"] == 0


def test_a_step_is_corrected_only_where_the_engine_samples_at_another_precision() -> None:
    fp32, int8 = ModelConfig(), ModelConfig(serving_dtype="int8")
    assert not serves_apart(fp32, "cpu") and not serves_apart(ModelConfig(serving_dtype="float32"), "cpu")
    assert serves_apart(int8, "cpu") and serves_apart(ModelConfig(serving_dtype="bfloat16"), "cpu")
    assert not serves_apart(ModelConfig(serving_dtype="bfloat16"), "cuda:0")  # bf16 is what CUDA trains in

    config = TrainConfig()
    assert mismatch_corrected(config, fp32, "cpu") is config
    used = mismatch_corrected(config, int8, "cpu")
    assert (used.tis_cap, used.icepop) == (MISMATCH_TIS_CAP, MISMATCH_ICEPOP)
    mine = mismatch_corrected(TrainConfig(tis_cap=3.0), int8, "cpu")
    assert (mine.tis_cap, mine.icepop) == (3.0, MISMATCH_ICEPOP)  # what the user set is kept
    off = TrainConfig(correct_serving_mismatch=False)
    assert mismatch_corrected(off, int8, "cpu") is off


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_the_engines_copy_converts_the_base_and_leaves_the_trainers_alone(
    tiny_model_path: Path, precision: str
) -> None:
    from art_agents.server.models.int8_linear import Int8Linear
    from art_agents.server.models.lora_model import load_peft_model

    trainer, _ = load_peft_model(str(tiny_model_path), ModelConfig())
    before = {name: param.clone() for name, param in trainer.named_parameters()}
    engine = serving_copy(trainer, precision)
    assert all(
        torch.equal(param, before[name]) and param.dtype == torch.float32 for name, param in trainer.named_parameters()
    )
    lora = {name: param for name, param in engine.named_parameters() if "lora_" in name}
    assert lora and all(param.dtype == torch.float32 for param in lora.values())
    q_proj = engine.get_submodule("base_model.model.model.layers.0.self_attn.q_proj.base_layer")
    assert isinstance(q_proj, Int8Linear) if precision == "int8" else q_proj.weight.dtype == torch.bfloat16
    assert engine.get_submodule("base_model.model.lm_head").weight.dtype == torch.bfloat16  # bf16 in both
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        gap = (torch.log_softmax(engine(ids).logits.float(), -1) - torch.log_softmax(trainer(ids).logits, -1)).abs()
    assert 0 < float(gap.max()) < 0.5  # the same model, read at another precision


def test_int8_layers_compute_the_linear_map_and_odd_widths_stay_bf16() -> None:
    from art_agents.server.models.int8_linear import Int8Linear, int8_kernel_runs, quantize_linear_layers

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 8), torch.nn.Linear(8, 24), torch.nn.Linear(24, 16))
    x = torch.randn(3, 32)
    expected = model[0](x).detach()
    assert int8_kernel_runs() and quantize_linear_layers(model) == 1  # the kernel reads inputs in blocks of 16
    assert isinstance(model[0], Int8Linear) and type(model[1]) is type(model[2]) is torch.nn.Linear
    assert torch.allclose(model[0](x).float(), expected, atol=0.03 * float(expected.abs().max()))


def test_an_icepop_band_must_hold_one() -> None:
    with pytest.raises(ValueError, match=r"icepop=\(2.0, 3.0\) must be a band .* 0 < low <= 1 <= high"):
        TrainConfig(icepop=(2.0, 3.0))


def test_a_precision_the_engine_or_machine_cannot_run_is_refused_by_name() -> None:
    with pytest.raises(ServiceError, match=r"serving_dtype='int8' runs on the CPU only .* use bfloat16"):
        check_serving_dtype(ModelConfig(serving_dtype="int8"), "transformers", "cuda:0")
    with pytest.raises(ServiceError, match=r"serving_dtype='bfloat16' is for the transformers engine; the vllm"):
        check_serving_dtype(ModelConfig(serving_dtype="bfloat16"), "vllm", "cuda:0")
    check_serving_dtype(ModelConfig(serving_dtype="int8"), "transformers", "cpu")  # this machine runs both
    check_serving_dtype(ModelConfig(serving_dtype="bfloat16"), "transformers", "cpu")


async def test_register_refuses_before_loading_anything(backend: RemoteBackend, tiny_model_path: Path) -> None:
    config = ModelConfig(engine="vllm", serving_dtype="int8")
    model = TrainableModel(name="vllm-int8", project="precision", base_model=str(tiny_model_path), config=config)
    with pytest.raises(ArtError, match=r"serving_dtype='int8' is for the transformers engine"):
        await model.register(backend)


async def attempt(model: TrainableModel, question: str, reward: float) -> Trajectory:
    """Two turns of a conversation (the second extends the first: a prefix-cache hit), the first streamed."""
    client = model.openai_client()
    async with rollout() as trajectory:
        messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
        stream = await client.chat.completions.create(
            model=model.name,
            messages=messages,
            max_tokens=6,
            temperature=1.0,
            stream=True,
            logprobs=True,  # type: ignore[arg-type]
        )
        text, logprobs = "", []
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                logprobs += [p.logprob for p in (chunk.choices[0].logprobs and chunk.choices[0].logprobs.content) or []]
        assert logprobs and all(p <= 0 for p in logprobs)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "and then?"}]
        await client.chat.completions.create(model=model.name, messages=messages, max_tokens=6, temperature=1.0)  # type: ignore[arg-type]
        trajectory.reward = reward
    await client.close()
    return trajectory


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
async def test_served_in_lower_precision_it_trains_and_serves_on(
    backend: RemoteBackend, server: str, tiny_model_path: Path, precision: str
) -> None:
    config = ModelConfig(serving_dtype=precision)  # type: ignore[arg-type]
    model = TrainableModel(name=f"in-{precision}", project="precision", base_model=str(tiny_model_path), config=config)
    await model.register(backend)
    groups = [
        TrajectoryGroup([await attempt(model, f"question {g}", float((g + t) % 3)) for t in range(3)]) for g in range(2)
    ]
    result = await model.train(groups, TrainConfig(learning_rate=5e-3), progress=False)
    assert result.step == 1
    assert (result.config.tis_cap, result.config.icepop) == (MISMATCH_TIS_CAP, MISMATCH_ICEPOP)
    metrics = result.metrics
    assert 1e-5 < metrics["logprob_gap_sampler"] <= metrics["logprob_gap_sampler_max"] < 1.0  # a gap, a small one
    assert 0.0 <= metrics["mismatch_masked"] <= 1.0 and metrics["prefix_cache_hit_rate"] > 0.1  # second turns hit it

    client = model.openai_client()
    reply = await client.chat.completions.create(
        model=model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=4, logprobs=True
    )
    assert reply.model == f"{model.name}@1" and reply.choices[0].logprobs is not None
    older = await client.chat.completions.create(
        model=f"{model.name}@0", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert older.model == f"{model.name}@0"  # an older step's adapter loads beside the one served
    answer = await client.responses.create(model=model.name, input="hi", max_output_tokens=4)
    assert answer.model == f"{model.name}@1" and answer.usage is not None and answer.usage.output_tokens > 0
    legacy = await client.completions.create(model=model.name, prompt="hi", max_tokens=4, logprobs=1)
    assert legacy.model == f"{model.name}@1" and legacy.choices[0].logprobs is not None
    await client.close()
    messages = anthropic.AsyncAnthropic(base_url=server, api_key="unused", max_retries=0)
    message = await messages.messages.create(
        model=model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert message.model == f"{model.name}@1" and message.usage.output_tokens > 0
    await messages.close()


async def test_served_in_the_trainers_precision_nothing_is_corrected(
    backend: RemoteBackend, tiny_model_path: Path
) -> None:
    model = TrainableModel(name="in-float32", project="precision", base_model=str(tiny_model_path))
    await model.register(backend)
    groups = [TrajectoryGroup([await attempt(model, "q", float(t)) for t in range(3)])]
    result = await model.train(groups, TrainConfig(learning_rate=5e-3), progress=False)
    assert (result.config.tis_cap, result.config.icepop) == (None, None) and "mismatch_masked" not in result.metrics
    assert result.metrics["logprob_gap_sampler_max"] < 1e-5  # exp(gap) is 1 to within 1e-5: nothing to correct
