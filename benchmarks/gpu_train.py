"""benchmarks/gpu.py's set-up (the random model, its rows) and its training sections: ours vs TRL, trainer processes."""

from __future__ import annotations

import gc
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_report import REPORT, Budget, Row, interleaved, log, median_range

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


# --------------------------------------------------------------------------------------------- set-up
@dataclass(frozen=True)
class Sizes:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    groups: int
    group_size: int
    prompt_tokens: int
    completion_tokens: int
    micro_batch: int
    requests: int
    serve_prompt_tokens: int
    serve_tokens: int
    rounds: int
    section_seconds: float  # the least a section's set-up and warm-up round take: none starts with less left


GPU_SIZES = Sizes(
    hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, intermediate=3072, vocab=151936,
    groups=8, group_size=8, prompt_tokens=128, completion_tokens=256, micro_batch=8,
    requests=32, serve_prompt_tokens=128, serve_tokens=128, rounds=5, section_seconds=30.0,
)  # fmt: skip
TINY_SIZES = Sizes(
    hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=1024,
    groups=2, group_size=4, prompt_tokens=16, completion_tokens=16, micro_batch=4,
    requests=4, serve_prompt_tokens=16, serve_tokens=8, rounds=2, section_seconds=3.0,
)  # fmt: skip


def build_model(work: Path, sizes: Sizes, device: str, dtype: Any) -> tuple[Path, Any, int]:
    """A random Qwen3 model of `sizes` and the tiny model's tokenizer (ids < vocab), saved; its folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    from art_agents.server.ops.tiny_model import build_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(work / "tokenizer-source"))
    if len(tokenizer) > sizes.vocab:
        raise SystemExit(f"the tokenizer has {len(tokenizer)} tokens, more than the model's vocab {sizes.vocab}")
    config = Qwen3Config(
        vocab_size=sizes.vocab, hidden_size=sizes.hidden, intermediate_size=sizes.intermediate,
        num_hidden_layers=sizes.layers, num_attention_heads=sizes.heads, num_key_value_heads=sizes.kv_heads,
        head_dim=sizes.head_dim, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    config.rope_theta = 1_000_000.0
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    path = work / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    params = sum(p.numel() for p in model.parameters())
    del model
    return path, tokenizer, params


def lora_config() -> Any:
    """The LoRA of `load_peft_model` with ModelConfig's defaults (r 16, alpha 32, q/k/v/o), for every side."""
    from peft import LoraConfig

    from art_agents.train_config import ModelConfig

    defaults = ModelConfig()
    assert list(defaults.target_modules) == LORA_TARGETS and defaults.lora_rank == 16, defaults
    return LoraConfig(
        r=defaults.lora_rank,
        lora_alpha=defaults.lora_alpha,
        lora_dropout=0.0,
        target_modules=list(defaults.target_modules),
        task_type="CAUSAL_LM",
    )


def load_base(path: Path, device: str, dtype: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)


def make_rows(tokenizer: Any, sizes: Sizes, seed: int = 0) -> list[dict[str, Any]]:
    """Group-major rows: one random prompt per group, random completions ending in eos, a random reward."""
    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    rows = []
    for g in range(sizes.groups):
        prompt = [rng.choice(vocab) for _ in range(sizes.prompt_tokens)]
        for _ in range(sizes.group_size):
            completion = [rng.choice(vocab) for _ in range(sizes.completion_tokens - 1)] + [tokenizer.eos_token_id]
            rows.append({"group": g, "prompt_ids": prompt, "completion_ids": completion, "reward": rng.random()})
    return rows


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def enable_checkpointing(peft_model: Any) -> None:
    """Gradient checkpointing on the model as TRL sets it for a PEFT model (non-reentrant, inputs need grads)."""
    peft_model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    peft_model.base_model.model.enable_input_require_grads()
    peft_model.base_model.model.config.use_cache = False


def checkpointing_active(model: Any) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


# --------------------------------------------------------------------------------------------- training
def ours_side(
    path: Path, tokenizer: Any, rows: list[dict[str, Any]], sizes: Sizes, device: str, dtype: Any, work: Path,
    checkpointing: bool,
) -> tuple[Callable[[], float], str]:  # fmt: skip
    """A `PolicyTrainer.train` step on `rows` (tokens/s per call), and how checkpointing was set."""
    from grpo_step import stored_groups
    from peft import get_peft_model

    from art_agents.server.storage.token_store import TokenStore
    from art_agents.server.training.trainer import PolicyTrainer
    from art_agents.train_config import TrainConfig

    store = TokenStore(work / f"store-{uuid.uuid4().hex[:8]}.sqlite")
    groups = stored_groups(tokenizer, rows, store)
    model = get_peft_model(load_base(path, device, dtype), lora_config())
    trainer = PolicyTrainer(model, tokenizer, store)
    config = TrainConfig(
        learning_rate=1e-5,
        micro_batch_size=sizes.micro_batch,
        max_completion_tokens=sizes.completion_tokens,
        gradient_checkpointing=checkpointing,
    )

    def step() -> float:
        synchronize(device)
        started = time.perf_counter()
        metrics = trainer.train(groups, config)
        synchronize(device)
        return metrics["tokens_trained"] / (time.perf_counter() - started)

    return step, "TrainConfig.gradient_checkpointing" if checkpointing else ""


def trl_side(
    tokenizer: Any, rows: list[dict[str, Any]], sizes: Sizes, path: Path, device: str, dtype: Any, work: Path,
    checkpointing: bool,
) -> tuple[Callable[[], float], str]:  # fmt: skip
    """TRL's GRPOTrainer loss + backward + clip + AdamW step on the same rows (tokens/s per call)."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    on_gpu = device.startswith("cuda")
    args = GRPOConfig(
        output_dir=str(work / f"trl-{uuid.uuid4().hex[:8]}"), use_cpu=not on_gpu, bf16=on_gpu and dtype == torch.bfloat16,
        per_device_train_batch_size=sizes.micro_batch, num_generations=sizes.group_size,
        max_completion_length=sizes.completion_tokens, learning_rate=1e-5, beta=0.0, loss_type="grpo",
        max_grad_norm=1.0, report_to=[], logging_steps=1_000_000, gradient_checkpointing=checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=load_base(path, device, dtype),
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["x"] * sizes.group_size}),
        processing_class=tokenizer,
        peft_config=lora_config(),
    )
    model = trainer.model
    how = ""
    if checkpointing and not checkpointing_active(model):  # transformers' Trainer.train() turns it on, not __init__
        enable_checkpointing(model)
        how = "gc set on the model as Trainer.train() would"
    if checkpointing_active(model) != checkpointing:
        raise RuntimeError(f"gradient checkpointing should be {checkpointing} on TRL's model")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    target = params[0].device
    optimizer = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)
    rewards = torch.tensor([r["reward"] for r in rows]).view(-1, sizes.group_size)
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / rewards.std(1, unbiased=False, keepdim=True)).flatten()
    batches = []
    for start in range(0, len(rows), sizes.micro_batch):
        chunk = rows[start : start + sizes.micro_batch]
        prompt = torch.tensor([r["prompt_ids"] for r in chunk], device=target)  # one prompt length: no padding
        completion = torch.tensor([r["completion_ids"] for r in chunk], device=target)
        batches.append(
            {
                "prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion,
                "completion_mask": torch.ones_like(completion),
                "advantages": advantages[start : start + sizes.micro_batch].to(target),
            }
        )  # fmt: skip
    trainer.current_gradient_accumulation_steps = len(batches)
    trained = sum(int(b["completion_mask"].sum()) for b in batches)

    def step() -> float:
        synchronize(device)
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        for inputs in batches:
            trainer.compute_loss(model, inputs).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        synchronize(device)
        return trained / (time.perf_counter() - started)

    return step, how


def train_section(
    path: Path, tokenizer: Any, sizes: Sizes, device: str, dtype: Any, work: Path, budget: Budget
) -> None:
    rows = make_rows(tokenizer, sizes)
    trained = len(rows) * sizes.completion_tokens
    REPORT.notes.append(
        f"train batch: {sizes.groups} groups x {sizes.group_size} completions, prompt {sizes.prompt_tokens} + "
        f"completion {sizes.completion_tokens} tokens ({trained:,} trained tokens a step), micro-batch "
        f"{sizes.micro_batch}, LoRA r16 q/k/v/o, AdamW; ours = whole PolicyTrainer.train call, TRL = "
        "compute_loss + backward + clip + step on prepared inputs"
    )
    for checkpointing in (False, True):
        label = f"train gc {'on' if checkpointing else 'off'}"
        if not budget.allows(sizes.section_seconds, label):
            return
        gc_text = "gc on" if checkpointing else "gc off"
        ours_row = REPORT.row("train", f"ours PolicyTrainer ({gc_text})")
        trl_row = REPORT.row("train", f"TRL GRPOTrainer ({gc_text})")
        try:
            log(f"{label}: building both trainers")
            ours, ours_row.note = ours_side(path, tokenizer, rows, sizes, device, dtype, work, checkpointing)
            trl, trl_row.note = trl_side(tokenizer, rows, sizes, path, device, dtype, work, checkpointing)
            interleaved([(ours_row, ours), (trl_row, trl)], sizes.rounds, budget, label, device)
            del ours, trl
        except Exception as exc:
            REPORT.failed(label, exc)
        ratio_note(ours_row, trl_row, f"train {gc_text}")
        free(device)


def ratio_note(ours: Row, peer: Row, what: str) -> None:
    n = min(len(ours.values), len(peer.values))
    if n:
        ratios = [a / b for a, b in zip(ours.values[:n], peer.values[:n], strict=True)]
        med, low, high = median_range(ratios)
        REPORT.notes.append(f"{what}: ours / {peer.name.split(' (')[0]} tokens/s = {med:.2f}x ({low:.2f}-{high:.2f})")


def free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def processes_section(path: Path, tokenizer: Any, sizes: Sizes, device: str, work: Path, budget: Budget) -> None:
    from trainer_processes import trainer_sides

    from art_agents.train_config import TrainConfig

    if not budget.allows(sizes.section_seconds * 2, "trainer processes"):
        return
    rows = make_rows(tokenizer, sizes)
    config = TrainConfig(
        learning_rate=1e-5, micro_batch_size=sizes.micro_batch, max_completion_tokens=sizes.completion_tokens
    )
    alone = REPORT.row("processes", "ours in this process")
    one = REPORT.row("processes", "ours in 1 trainer process", note="its memory is its process's: not tracked")
    log("trainer processes: loading the model and starting the process")
    sides, stop = trainer_sides(path, rows, config, device, work / "processes", ["in-process", "1"])
    try:
        interleaved([(alone, sides["in-process"]), (one, sides["1"])], sizes.rounds, budget, "processes", device)
    finally:
        stop()
    one.peak_gib = 0.0  # what this process held meanwhile, not the trainer process's peak
    n = min(len(alone.values), len(one.values))
    if n:
        med, low, high = median_range([a / b for a, b in zip(one.values[:n], alone.values[:n], strict=True)])
        REPORT.notes.append(f"1 trainer process / this process tokens/s = {med:.2f}x ({low:.2f}-{high:.2f})")
