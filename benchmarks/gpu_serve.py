"""benchmarks/gpu.py's serving sections: our engine vs raw generate, the model families, vLLM."""

from __future__ import annotations

import asyncio
import importlib.util
import random
import time
from pathlib import Path
from typing import Any

from gpu_report import REPORT, Budget, interleaved, log
from gpu_train import Sizes, free, load_base, lora_config, ratio_note, synchronize


# --------------------------------------------------------------------------------------------- serving
def serve_prompts(tokenizer: Any, sizes: Sizes, seed: int = 1) -> list[list[int]]:
    """Random prompts of 50-100% of `serve_prompt_tokens`, so the batch is left-padded as in real use."""
    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    lengths = [
        rng.randint(max(1, sizes.serve_prompt_tokens // 2), sizes.serve_prompt_tokens) for _ in range(sizes.requests)
    ]
    return [[rng.choice(vocab) for _ in range(n)] for n in lengths]


def serve_section(path: Path, sizes: Sizes, device: str, dtype_name: str, budget: Budget) -> None:
    import torch

    from art_agents.server.engines.protocol import SamplingParams
    from art_agents.server.engines.transformers_engine import TransformersEngine
    from art_agents.train_config import ModelConfig

    if not budget.allows(sizes.section_seconds, "serving"):
        return
    log("serve: loading the engine (load_peft_model)")
    config = ModelConfig(
        device=device, dtype=dtype_name, max_batch_size=sizes.requests, max_queued_requests=max(256, sizes.requests)
    )
    engine = TransformersEngine.load(str(path), config)
    tokenizer, model = engine.tokenizer, engine.model
    prompts = serve_prompts(tokenizer, sizes)
    params = SamplingParams(max_tokens=sizes.serve_tokens, n=1, temperature=1.0)
    stops = {"eos": 0}
    loop = asyncio.new_event_loop()

    async def all_requests() -> list[Any]:
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

    def ours() -> float:
        synchronize(device)
        started = time.perf_counter()
        results = loop.run_until_complete(all_requests())
        synchronize(device)
        seconds = time.perf_counter() - started
        samples = [s for r in results for s in r]
        stops["eos"] += sum(s.finish_reason == "stop" for s in samples)
        return sum(len(s.token_ids) for s in samples) / seconds

    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)

    def raw() -> float:
        synchronize(device)
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids, attention_mask=attention, max_new_tokens=sizes.serve_tokens,
                min_new_tokens=sizes.serve_tokens, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                pad_token_id=pad,
            )  # fmt: skip
        synchronize(device)
        seconds = time.perf_counter() - started
        return (out.shape[1] - width) * out.shape[0] / seconds

    sides = [
        (REPORT.row("serve", f"ours TransformersEngine ({sizes.requests} concurrent generate)"), ours),
        (REPORT.row("serve", f"raw HF model.generate (batch {sizes.requests})"), raw),
    ]
    try:
        interleaved(sides, sizes.rounds, budget, "serve", device)
    finally:
        loop.run_until_complete(engine.close())
        loop.close()
    if stops["eos"]:
        sides[0][0].note = f"{stops['eos']} samples ended at eos (tokens counted)"
    ratio_note(sides[0][0], sides[1][0], "serve")
    REPORT.notes.append(
        f"serve: {sizes.requests} requests, prompts {sizes.serve_prompt_tokens // 2}-{sizes.serve_prompt_tokens} "
        f"tokens (left-padded), {sizes.serve_tokens} new tokens each, temperature 1, same PEFT model (LoRA active)"
    )


# --------------------------------------------------------------------------------------------- families
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def families_section(device: str, dtype_name: str, work: Path, budget: Budget) -> None:
    """Each family's tiny random model (its real chat template and special tokens) on the device: a tool-offering
    prompt rendered, 4 replies sampled and parsed as the server does, and one GRPO step on them."""
    from art_agents.capture import record_completion
    from art_agents.server.engines.protocol import SamplingParams
    from art_agents.server.engines.transformers_engine import TransformersEngine
    from art_agents.server.models.chat_format import parse_assistant, render_prompt_ids
    from art_agents.server.ops.family_models import FAMILIES, build_family_model
    from art_agents.server.storage.token_store import TokenRecord, TokenStore
    from art_agents.server.training.policy_model import PolicyModel
    from art_agents.server.training.trainer import PolicyTrainer
    from art_agents.train_config import ModelConfig, TrainConfig
    from art_agents.trajectory import Trajectory, TrajectoryGroup

    loop = asyncio.new_event_loop()
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    for family in FAMILIES:
        if not budget.allows(10.0, f"family {family}"):
            break
        row = REPORT.row("families", f"{family}: 4 replies + 1 train step", unit="s")
        engine = None
        try:
            path = build_family_model(work / "families" / family, family)
            config = ModelConfig(device=device, dtype=dtype_name, lora_rank=8)
            engine = TransformersEngine.load(str(path), config)
            store = TokenStore(work / "families" / f"{family}.sqlite")
            prompt = render_prompt_ids(engine.tokenizer, messages, [WEATHER_TOOL])
            started = time.perf_counter()
            params = SamplingParams(max_tokens=32, n=4, temperature=1.0)
            trajectories = []
            for i, sample in enumerate(loop.run_until_complete(engine.generate(prompt, params))):
                reply = parse_assistant(engine.tokenizer, sample.text, sample.token_ids, prompt, [WEATHER_TOOL])
                cid = f"chatcmpl-{family}-{i}"
                record = TokenRecord(
                    completion_id=cid, model=family, policy_step=0, prompt_ids=prompt, completion_ids=sample.token_ids,
                    logprobs=sample.logprobs, temperature=sample.temperature,
                )  # fmt: skip
                store.add(record)
                trajectories.append(Trajectory(reward=float(i % 2)))
                record_completion(messages, reply, completion_id=cid, trajectory=trajectories[-1])
            policy = PolicyModel.load(str(path), config, engine.tokenizer, engine.base_weights())
            metrics = PolicyTrainer(policy.model, engine.tokenizer, store).train(
                [TrajectoryGroup(trajectories)], TrainConfig(learning_rate=1e-4)
            )
            synchronize(device)
            row.values.append(time.perf_counter() - started)
            row.note = f"{metrics['tokens_trained']:.0f} tokens trained, loss {metrics['loss']:+.3f}, {dtype_name}"
        except Exception as exc:
            REPORT.failed(f"family {family}", exc)
        finally:
            if engine is not None:
                loop.run_until_complete(engine.close())
            free(device)
    loop.close()


# --------------------------------------------------------------------------------------------- vLLM
def vllm_section(path: Path, tokenizer: Any, sizes: Sizes, device: str, budget: Budget, eager: bool) -> None:
    if importlib.util.find_spec("vllm") is None:
        REPORT.notes.append("vLLM: not installed, rows skipped")
        log("vLLM: not installed, rows skipped")
        return
    if not device.startswith("cuda"):
        REPORT.notes.append("vLLM: installed but no CUDA device, rows skipped")
        return
    if not budget.allows(4 * sizes.section_seconds, "vLLM (start-up can take minutes)"):
        return
    try:
        _vllm_rows(path, tokenizer, sizes, budget, eager)
    except Exception as exc:  # a broken vLLM must not take the other rows down
        REPORT.notes.append(f"vLLM: failed: {type(exc).__name__}: {str(exc)[:300]}")
        log(f"vLLM failed: {exc!r}")


def _vllm_rows(path: Path, tokenizer: Any, sizes: Sizes, budget: Budget, eager: bool) -> None:
    import torch
    from peft import get_peft_model
    from vllm import LLM
    from vllm import SamplingParams as VllmSampling
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    adapters = []
    peft_model = get_peft_model(load_base(path, "cpu", torch.bfloat16), lora_config())
    for i in range(4):  # distinct adapters (B != 0, so each changes the output)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 1e-3, generator=torch.Generator().manual_seed(i))
        folder = path.parent / f"adapter-{i}"
        peft_model.save_pretrained(folder)
        adapters.append(str(folder))
    del peft_model
    log("vLLM: starting the offline engine")
    started = time.monotonic()
    llm = LLM(
        model=str(path), tokenizer=str(path), dtype="bfloat16", enable_lora=True, max_lora_rank=16, max_loras=2,
        max_model_len=2048, gpu_memory_utilization=0.35, enforce_eager=eager, seed=0,
    )  # fmt: skip
    REPORT.notes.append(f"vLLM: engine start-up {time.monotonic() - started:.0f} s (enforce_eager={eager})")
    prompts = [TokensPrompt(prompt_token_ids=p) for p in serve_prompts(tokenizer, sizes)]
    params = VllmSampling(  # no detokenizing: the random model samples ids past the small tokenizer's vocab
        max_tokens=sizes.serve_tokens, min_tokens=sizes.serve_tokens, ignore_eos=True, temperature=1.0, detokenize=False
    )
    first = LoRARequest("adapter-0", 1, adapters[0])

    def run(lora: Any) -> float:
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - started)

    sides = [
        (REPORT.row("vllm", f"raw vLLM base ({sizes.requests} prompts)"), lambda: run(None)),
        (REPORT.row("vllm", f"raw vLLM + LoRA ({sizes.requests} prompts)"), lambda: run(first)),
    ]
    interleaved(sides, sizes.rounds, budget, "vllm", "vllm")  # its memory is its engine process's: not tracked
    one = VllmSampling(max_tokens=1, temperature=1.0, detokenize=False)
    swap = REPORT.row("vllm", "LoRA swap: first request on a new adapter", unit="ms", note="minus a loaded one's")
    for i in range(1, len(adapters)):
        if not budget.allows(10.0, "vLLM LoRA swap"):
            break
        llm.generate(prompts[:1], one, lora_request=first, use_tqdm=False)  # loaded: the baseline
        started = time.perf_counter()
        llm.generate(prompts[:1], one, lora_request=first, use_tqdm=False)
        loaded = time.perf_counter() - started
        fresh = LoRARequest(f"adapter-{i}", 1 + i, adapters[i])  # a new id: vLLM loads it from disk
        started = time.perf_counter()
        llm.generate(prompts[:1], one, lora_request=fresh, use_tqdm=False)
        swap.values.append(time.perf_counter() - started - loaded)
