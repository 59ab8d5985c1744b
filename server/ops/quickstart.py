"""The offline quickstart: train the tiny random model on a toy reward and watch the reward go up.

Everything is the real loop: a local art-agents server, rollouts through the OpenAI SDK (captured
into trajectories), group rewards, GRPO steps, new checkpoints served. The task is deliberately
learnable by a random 2-layer model in a couple of minutes on CPU: the reward is the fraction of the
characters of a short completion that are the letter "a".
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from art_agents.atomic import write_text_atomic
from art_agents.backends.local import DEFAULT_ART_PATH
from art_agents.capture import rollout
from art_agents.gather import gather_trajectory_groups
from art_agents.train_config import ModelConfig, TrainConfig
from art_agents.trajectory import Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from art_agents.model import Model, TrainableModel

PROJECT = "quickstart"
TARGET = "a"
PROMPTS = ["Write the letter a, many times.", "Say aaaa!", "Only use the letter a."]
# Never trained on: `art-agents eval` on the model folder compares its steps on these (see save_eval_task).
HELDOUT_PROMPTS = [
    "Type the letter a again and again.", "Answer with aaaa.", "Reply using only the letter a.",
    "Write a long row of a.", "Give me the letter a, repeated.", "Nothing but a, please.",
    "Say aaaaaaaa.", "Fill the line with the letter a.",
]  # fmt: skip
EVAL_TASK_FILE, HELDOUT_FILE = "task.json", "heldout.jsonl"  # in the model folder
ROLLOUTS_PER_GROUP = 8
MAX_TOKENS = 8
# Rounds in a row without an update (every group scored alike) after which the toy task has converged.
MAX_ROUNDS_WITHOUT_UPDATE = 3
# A random tiny model needs a large step size to move in ~20 steps; real models want TrainConfig's defaults.
# At 2e-2 the task was solved by step 16 (every rollout all "a", no spread left to train on); at 1e-2 the
# reward is still rising at step 20 and the first flat rounds come at step 26 or later (LoRA seeds 0-2).
TOY_CONFIG = TrainConfig(learning_rate=1e-2, micro_batch_size=24)
# A random model's tied, small-initialised embeddings cap how far attention LoRAs can move its logits (the final
# norm bounds the hidden state), so the toy run also adapts lm_head; real models learn with the defaults.
TOY_MODEL_CONFIG = ModelConfig(
    lora_rank=8,
    lora_alpha=16,
    seed=0,
    max_batch_size=24,
    default_max_tokens=MAX_TOKENS,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "lm_head"],
)


def toy_reward(text: str) -> float:
    """Fraction of the characters that are the target letter (0 for an empty completion)."""
    return text.count(TARGET) / len(text) if text else 0.0


async def toy_rollout(client: AsyncOpenAI, model: Model, prompt: str, seed: int) -> Trajectory:
    async with rollout(prompt=prompt) as trajectory:
        response = await client.chat.completions.create(
            model=model.name,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=seed,
        )
        trajectory.reward = toy_reward(response.choices[0].message.content or "")
    return trajectory


async def rollout_groups(
    client: AsyncOpenAI, model: TrainableModel, step: int, *, rollouts: int = ROLLOUTS_PER_GROUP, attempt: int = 0
) -> list[TrajectoryGroup]:
    """One group per prompt, `rollouts` seeded attempts each.

    Seeds follow the step (and the attempt at it, after a round without an update), so a run, resumed
    or not, repeats exactly.
    """
    base = 10_000 * step + 1_000 * attempt
    groups = [
        TrajectoryGroup(toy_rollout(client, model, prompt, seed=base + 100 * p + i) for i in range(rollouts))
        for p, prompt in enumerate(PROMPTS)
    ]
    return await gather_trajectory_groups(groups, pbar_desc=None)


@dataclass
class ToyRound:
    """One round of the toy task: rollouts sampled from `step`, and the checkpoint the update made (if any)."""

    step: int
    reward: float
    best: float
    trained_step: int | None
    metrics: dict[str, float]


HEADER = (
    f"{'sampled from':>12}  {'reward':>7}  {'best':>5}  {'entropy':>7}  {'sampler gap':>11}  "
    f"{'skipped: no reward spread':>25}  {'saved as':>11}"
)


def _row(round_: ToyRound) -> str:
    m = round_.metrics
    entropy = f"{m['entropy']:.3f}" if "entropy" in m else "-"  # absent when every group was skipped
    gap = f"{m['logprob_gap_sampler']:.1e}" if "logprob_gap_sampler" in m else "-"
    skipped = f"{int(m.get('groups_skipped_zero_variance', 0))}/{len(PROMPTS)} groups"
    saved = f"step {round_.trained_step}" if round_.trained_step is not None else "not trained"
    return (
        f"{'step ' + str(round_.step):>12}  {round_.reward:>7.3f}  {round_.best:>5.2f}  {entropy:>7}  {gap:>11}  "
        f"{skipped:>25}  {saved:>11}"
    )


async def train_toy_task(
    model: TrainableModel,
    steps: int,
    config: TrainConfig = TOY_CONFIG,
    *,
    rollouts: int = ROLLOUTS_PER_GROUP,
    echo: bool = True,
) -> list[ToyRound]:
    """Roll out and train until the model's checkpoint reaches `steps`, then roll out once more (not trained on).

    A round whose groups all scored alike trains nothing (GRPO has no signal) and is retried with new
    seeds; after `MAX_ROUNDS_WITHOUT_UPDATE` such rounds in a row the reward has nothing left to teach
    and the run stops early. Returns every round, the untrained last one included.
    """
    rounds: list[ToyRound] = []
    client = model.openai_client()
    if echo:
        print(HEADER)
    step, attempt = await model.get_step(), 0
    try:
        while True:
            groups = await rollout_groups(client, model, step, rollouts=rollouts, attempt=attempt)
            values = [r for g in groups for r in g.rewards()]
            reward, best = sum(values) / len(values), max(values)
            if step >= steps or attempt == MAX_ROUNDS_WITHOUT_UPDATE:
                rounds.append(ToyRound(step, reward, best, None, {}))
                if echo:
                    print(f"{'step ' + str(step):>12}  {reward:>7.3f}  {best:>5.2f}  (after training; not trained on)")
                break
            result = await model.train(groups, config, progress=False)
            trained = result.step if result.step > step else None
            rounds.append(ToyRound(step, reward, best, trained, result.metrics))
            if echo:
                print(_row(rounds[-1]))
            step, attempt = (result.step, 0) if trained is not None else (step, attempt + 1)
    finally:
        await client.close()
    return rounds


def model_folder(art_path: Path) -> Path:
    return art_path / PROJECT / "models" / PROJECT


def save_eval_task(folder: Path, base: Path) -> None:
    """Keep in the model folder what `art-agents eval FOLDER` needs to compare its steps offline: the held-out
    prompts (`heldout.jsonl`) and the base model, the reward named in `task.json` (quickstart_eval.py reads them)."""
    rows = [{"id": f"heldout-{i}", "prompt": prompt} for i, prompt in enumerate(HELDOUT_PROMPTS)]
    write_text_atomic(folder / HELDOUT_FILE, "".join(json.dumps(row) + "\n" for row in rows))
    task = {"kind": "quickstart", "base_model": str(base.resolve()), "reward": f"{__name__}:toy_reward"}
    write_text_atomic(folder / EVAL_TASK_FILE, json.dumps(task, indent=2) + "\n")


@dataclass
class Stall:
    """A run that stopped short of its steps: `MAX_ROUNDS_WITHOUT_UPDATE` rounds in a row without reward spread.

    Kept in the model folder, so that a rerun at the same step with no more rollouts (the same seeds, the
    same flat rounds) says so instead of pretending to train.
    """

    step: int
    rollouts: int
    reward: float

    FILE = "quickstart-stall.json"

    def message(self, steps: int) -> str:
        return (
            f"step {self.step} of {steps}: the last {MAX_ROUNDS_WITHOUT_UPDATE} rounds had no reward spread (every "
            f"rollout of a prompt scored alike; mean reward {self.reward:.3f}), so there is nothing to train on; "
            f"--fresh starts over, --rollouts {2 * self.rollouts} samples more per prompt"
        )

    def save(self, folder: Path) -> None:
        (folder / self.FILE).write_text(json.dumps(asdict(self)), encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> Stall | None:
        path = folder / cls.FILE
        return cls(**json.loads(path.read_text(encoding="utf-8"))) if path.exists() else None


async def train_quickstart(
    steps: int = 20, art_path: Path = DEFAULT_ART_PATH, *, fresh: bool = False, rollouts: int = ROLLOUTS_PER_GROUP
) -> list[ToyRound]:
    """Build the tiny model, serve it with a LocalBackend, train it to checkpoint `steps`.

    A rerun continues where the last one stopped (the checkpoints are the state); `fresh=True`
    deletes the quickstart's model first. Returns the rounds run (none when already at `steps`, or
    when the last run stalled at this step with at least `rollouts` rollouts per group).
    """
    from art_agents.backends.local import LocalBackend
    from art_agents.model import TrainableModel
    from art_agents.server.ops.tiny_model import build_tiny_model_in_child
    from art_agents.server.storage.checkpoints import latest_step

    folder = model_folder(art_path)
    if fresh and folder.exists():
        shutil.rmtree(folder)
    first = latest_step(folder) or 0
    if first >= steps:
        print(
            f"the quickstart model is already at step {first} (asked for {steps}) in {folder}; "
            f"--steps {first + 10} trains further, --fresh starts over, `art-agents report` shows its history"
        )
        return []
    stall = Stall.load(folder)
    if stall is not None and stall.step == first and rollouts <= stall.rollouts:
        print(stall.message(steps))
        return []
    base = art_path / PROJECT / "tiny-model"
    if not (base / "config.json").exists():
        await build_tiny_model_in_child(base)  # not in this process: a Ctrl-C during its imports ends the run at once
    backend = LocalBackend(art_path)
    try:
        model = TrainableModel(name=PROJECT, project=PROJECT, base_model=str(base.resolve()), config=TOY_MODEL_CONFIG)
        await model.register(backend)
        save_eval_task(folder, base)
        resumed = f"resuming at step {first}: {steps - first} steps to go (--fresh starts over); " if first else ""
        print(f"{resumed}serving {model.name}@{first} (tiny random model {base}) at {backend.base_url}")
        print(f"reward = fraction of '{TARGET}' in the reply; {len(PROMPTS)} prompts x {rollouts} rollouts")
        rounds = await train_toy_task(model, steps, rollouts=rollouts)
    finally:
        await backend.close()
    last = rounds[-1]
    if last.step < steps:
        stall = Stall(last.step, rollouts, last.reward)
        stall.save(folder)
        print(stall.message(steps))
    print(f"reward went from {rounds[0].reward:.3f} at step {rounds[0].step} to {last.reward:.3f} at step {last.step}")
    print(f"run data (checkpoints, history.jsonl, trajectories): {folder}; `art-agents report` shows it")
    return rounds
