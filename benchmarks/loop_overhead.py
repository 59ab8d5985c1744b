"""Loop overhead: one GRPO step through the full art-agents loop vs the same step written by hand.

Same model, LoRA, workload and loss, one process (so both sides share the CPU threads):

  bare  `model.generate` samples every rollout of the step in one batch, a Python function scores
        them, and the trainer's own loss (`token_logprobs` + `policy_loss`) with clipping and AdamW
        updates the LoRA: no server, no HTTP, no capture, no checkpoint
  art   `LocalBackend(in_process=True)`, `TrainableModel.register`, rollouts through
        `model.openai_client()` captured by `art_agents.rollout` and gathered with
        `gather_trajectory_groups`, then `model.train(groups)` (token-store lookups, the step, and a
        checkpoint written to disk before the new step is served)

Both sample `--prompts` x `--group-size` rollouts of exactly `--max-tokens` tokens at temperature 1
(the model is saved without an end-of-sequence token, so no rollout stops early and both sides train
the same number of tokens), score them with the same reward, and train one micro-batch of all of
them. Steps alternate (bare, art, bare, ...) after one warm-up step each. Printed: seconds per step
(median, min-max), the per-step ratio art / bare (goal <= 1.3x), and where each side's time goes.

    python benchmarks/loop_overhead.py [--steps 3] [--prompts 4] [--group-size 4] [--max-tokens 32] [--tiny]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by path: finds the helpers
from bench_setup import endless_copy
from timing import Summary, interleaved, ratio

QUESTIONS = [
    "What is the capital of France?",
    "Name three colours.",
    "What is the opposite of hot?",
    "What is the plural of mouse?",
    "Describe the sea in one sentence.",
    "Count from one to five.",
    "What do cats eat?",
    "Why is the sky blue?",
]
GOAL = 1.3


def reward(text: str) -> float:
    """Prefers answers of about ten words: cheap, and it varies within a group, so no group is skipped."""
    return -abs(len(text.split()) - 10) / 10


class Phases:
    """Seconds per phase of each measured step (the warm-up step is dropped)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def add(self, **seconds: float) -> None:
        self.steps.append(seconds)

    def summaries(self, warmup: int) -> dict[str, Summary]:
        values: dict[str, list[float]] = defaultdict(list)
        for step in self.steps[warmup:]:
            for name, s in step.items():
                values[name].append(s)
        return {name: Summary.of(v) for name, v in values.items()}


class BareLoop:
    """Sampling, scoring and the GRPO update on tensors, with the trainer's loss functions."""

    def __init__(self, model_path: str, config: Any, train_config: Any, args: argparse.Namespace) -> None:
        import torch
        from trl.trainer.utils import disable_dropout_in_model

        from art_agents.server.models.chat_format import render_prompt_ids
        from art_agents.server.models.lora_model import load_peft_model

        self.model, self.tokenizer = load_peft_model(model_path, config)
        disable_dropout_in_model(self.model)
        self.train_config = train_config
        self.args = args
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=train_config.learning_rate, weight_decay=train_config.weight_decay
        )
        self.pad_id = int(self.tokenizer.pad_token_id)
        prompts = [render_prompt_ids(self.tokenizer, [{"role": "user", "content": q}], None) for q in args.questions]
        rows = [p for p in prompts for _ in range(args.group_size)]  # group-major, as the gathered groups
        width = max(map(len, rows))
        self.prompt_ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in rows])
        self.prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
        self.phases = Phases()

    def step(self) -> None:
        import torch

        from art_agents.server.training.logprobs import token_logprobs
        from art_agents.server.training.loss import BatchTotals, policy_loss

        t0 = time.perf_counter()
        self.model.eval()
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=self.prompt_ids, attention_mask=self.prompt_mask, do_sample=True, temperature=1.0,
                top_k=0, top_p=1.0, max_new_tokens=self.args.max_tokens, pad_token_id=self.pad_id, eos_token_id=None,
            )  # fmt: skip
        completions = out[:, self.prompt_ids.shape[1] :]
        t1 = time.perf_counter()
        rewards = torch.tensor([reward(t) for t in self.tokenizer.batch_decode(completions, skip_special_tokens=True)])
        grouped = rewards.view(-1, self.args.group_size)
        advantages = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()
        t2 = time.perf_counter()
        self.model.train()
        ids = out.clone()  # inference tensors cannot be saved for backward
        attention = torch.cat([self.prompt_mask, torch.ones_like(completions)], dim=1)
        mask = torch.zeros_like(ids[:, 1:], dtype=torch.bool)
        mask[:, self.prompt_ids.shape[1] - 1 :] = True  # logprob column j is token j + 1: the completion tokens
        logps, _ = token_logprobs(self.model, ids, attention)
        totals = BatchTotals(trajectories=len(rewards), tokens=int(mask.sum()))
        loss, _ = policy_loss(logps, logps.detach(), advantages, mask, self.train_config, totals)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.train_config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        self.phases.add(rollout=t1 - t0, scoring=t2 - t1, train=time.perf_counter() - t2)


class ArtLoop:
    """The public API end to end: in-process server, captured rollouts, `model.train`."""

    def __init__(self, model_path: str, config: Any, train_config: Any, art_path: Path, args: argparse.Namespace):
        from art_agents import LocalBackend, TrainableModel

        self.loop = asyncio.new_event_loop()
        self.backend = LocalBackend(art_path, in_process=True, startup_timeout=600)
        self.model = TrainableModel(name="loop", project="bench", base_model=model_path, config=config)
        self.loop.run_until_complete(self.model.register(self.backend))
        self.client = self.model.openai_client()
        self.train_config = train_config
        self.args = args
        self.phases = Phases()

    async def _rollout(self, question: str, scoring: list[float]) -> Any:
        from art_agents import rollout

        async with rollout(question=question) as trajectory:
            response = await self.client.chat.completions.create(
                model=self.model.name, messages=[{"role": "user", "content": question}],
                max_tokens=self.args.max_tokens, temperature=1.0,
            )  # fmt: skip
            assert response.usage is not None and response.usage.completion_tokens == self.args.max_tokens
            started = time.perf_counter()
            trajectory.reward = reward(response.choices[0].message.content or "")
            scoring.append(time.perf_counter() - started)
        return trajectory

    async def _step(self) -> None:
        from art_agents import TrajectoryGroup, gather_trajectory_groups

        scoring: list[float] = []
        t0 = time.perf_counter()
        groups = await gather_trajectory_groups(
            [
                TrajectoryGroup(self._rollout(q, scoring) for _ in range(self.args.group_size))
                for q in self.args.questions
            ],
            pbar_desc=None,
        )
        t1 = time.perf_counter()
        result = await self.model.train(groups, self.train_config, progress=False)
        wall = time.perf_counter() - t1
        metrics = result.metrics
        if metrics.get("skipped"):
            raise RuntimeError("the art step was skipped (no reward variance): the comparison is off")
        self.phases.add(
            rollout=t1 - t0 - sum(scoring),  # scoring ran inside the rollouts, concurrently: its summed time
            scoring=sum(scoring),
            train=metrics["train_s"],  # the trainer itself
            checkpoint=metrics["step_s"] - metrics["train_s"],  # optimizer state in, checkpoint + history out
            train_call_rest=wall - metrics["step_s"],  # HTTP, request parsing, waiting for the model lock
        )

    def step(self) -> None:
        self.loop.run_until_complete(self._step())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.run_until_complete(self.backend.close())
        self.loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="the random tiny model (a smoke run)")
    parser.add_argument("--steps", type=int, default=3, help="measured steps of each side, after one warm-up step")
    parser.add_argument("--prompts", type=int, default=4, help="groups per step")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per group")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per rollout, on both sides")
    parser.add_argument("--threads", type=int, help="torch CPU threads for both sides (default: torch's)")
    args = parser.parse_args()
    args.questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(args.prompts)]

    import torch

    from art_agents import ModelConfig, TrainConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = args.prompts * args.group_size
    config = ModelConfig(max_batch_size=rows)
    train_config = TrainConfig(micro_batch_size=rows, loss="grpo", beta=0.0)
    with tempfile.TemporaryDirectory(prefix="art-loop-") as tmp:
        folder = Path(tmp)
        from bench_setup import bench_model

        base_model, gguf_file = bench_model(args.tiny, folder / "tiny")
        model_path = endless_copy(base_model, gguf_file, folder / "endless")
        print(
            f"model {base_model}{' / ' + gguf_file if gguf_file else ''}; {args.prompts} prompts x {args.group_size} "
            f"rollouts x {args.max_tokens} tokens, temperature 1; {args.steps} steps; torch threads {torch.get_num_threads()}"
        )
        bare = BareLoop(model_path, config, train_config, args)
        art = ArtLoop(model_path, config, train_config, folder / "art", args)
        try:
            times = interleaved({"bare": bare.step, "art": art.step}, rounds=args.steps)
        finally:
            art.close()
    print(f"\n{'side':<5} {'s per step':<32} where the time goes (median s per step)")
    for name, side in (("bare", bare), ("art", art)):
        phases = ", ".join(f"{p} {s.median:.3f}" for p, s in side.phases.summaries(warmup=1).items())
        print(f"{name:<5} {times[name].format('s', 1, 3):<32} {phases}")
    r = ratio(times["art"], times["bare"])
    verdict = "met" if r.median <= GOAL else "missed"
    print(f"\nsummary (art / bare, per step): {r.format('x', 1, 2)} [goal <= {GOAL}x: {verdict}]")


if __name__ == "__main__":
    main()
