"""The offline quickstart: train the tiny random model on a toy reward and watch the reward go up.

Everything is the real loop: a local art-agents server, rollouts through the OpenAI SDK (captured
into trajectories), group rewards, GRPO steps, new checkpoints served. The task is deliberately
learnable by a random 2-layer model in a couple of minutes on CPU: the reward is the fraction of the
characters of a short completion that are the letter "a".
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from art_agents.capture import rollout
from art_agents.gather import gather_trajectory_groups
from art_agents.train_config import ModelConfig, TrainConfig
from art_agents.trajectory import Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from art_agents.model import TrainableModel

TARGET = "a"
PROMPTS = ["Write the letter a, many times.", "Say aaaa!", "Only use the letter a."]
ROLLOUTS_PER_GROUP = 8
MAX_TOKENS = 8
# A random tiny model needs a large step size to move in ~20 steps; real models want TrainConfig's defaults.
TOY_CONFIG = TrainConfig(learning_rate=2e-2, micro_batch_size=24)
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


async def _one_rollout(client: AsyncOpenAI, model: TrainableModel, prompt: str, seed: int) -> Trajectory:
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
    client: AsyncOpenAI, model: TrainableModel, step: int, *, rollouts: int = ROLLOUTS_PER_GROUP
) -> list[TrajectoryGroup]:
    """One group per prompt, `rollouts` seeded attempts each (seeds differ per step, so runs repeat exactly)."""
    groups = [
        TrajectoryGroup(_one_rollout(client, model, prompt, seed=10_000 * step + 100 * p + i) for i in range(rollouts))
        for p, prompt in enumerate(PROMPTS)
    ]
    return await gather_trajectory_groups(groups, pbar_desc=False)  # type: ignore[arg-type]


async def train_toy_task(
    model: TrainableModel,
    steps: int,
    config: TrainConfig = TOY_CONFIG,
    *,
    rollouts: int = ROLLOUTS_PER_GROUP,
    echo: bool = True,
) -> list[float]:
    """Alternate rollouts and GRPO steps; returns the mean reward at steps 0..steps (the last one is not trained on)."""
    rewards: list[float] = []
    client = model.openai_client()
    if echo:
        print(f"{'step':>4}  {'reward':>7}  {'best':>5}  {'entropy':>7}  {'sampler gap':>11}  {'skipped groups':>14}")
    for step in range(steps + 1):
        groups = await rollout_groups(client, model, step, rollouts=rollouts)
        values = [r for g in groups for r in g.rewards()]
        rewards.append(sum(values) / len(values))
        if step == steps:
            if echo:
                print(f"{step:>4}  {rewards[-1]:>7.3f}  {max(values):>5.2f}  {'(after the last step)':>21}")
            break
        result = await model.train(groups, config, progress=False)
        if echo:
            m = result.metrics
            skipped = int(m.get("groups_skipped_zero_variance", 0))
            entropy = f"{m['entropy']:.3f}" if "entropy" in m else "-"  # absent when every group was skipped
            gap = f"{m['logprob_gap_sampler']:.1e}" if "logprob_gap_sampler" in m else "-"
            print(f"{step:>4}  {rewards[-1]:>7.3f}  {max(values):>5.2f}  {entropy:>7}  {gap:>11}  {skipped:>14}")
    await client.close()
    return rewards


def run_quickstart(steps: int = 20, art_path: str = ".art/quickstart") -> list[float]:
    """Build the tiny model, serve it with a LocalBackend, train `steps` steps; returns the reward per step."""
    return asyncio.run(_quickstart(steps, Path(art_path)))


async def _quickstart(steps: int, art_path: Path) -> list[float]:
    from art_agents.backend import LocalBackend
    from art_agents.model import TrainableModel
    from art_agents.server.tiny_model import build_tiny_model

    base = art_path / "tiny-model"
    if not (base / "config.json").exists():
        build_tiny_model(base)
    print(f"tiny model: {base}")
    backend = LocalBackend(art_path)
    try:
        model = TrainableModel(
            name="quickstart", project="quickstart", base_model=str(base.resolve()), config=TOY_MODEL_CONFIG
        )
        await model.register(backend)
        first_step = await model.get_step()
        print(f"serving {model.name}@{first_step} at {backend.base_url}; reward = fraction of '{TARGET}' in the reply")
        rewards = await train_toy_task(model, steps)
    finally:
        await backend.close()
    print(f"reward went from {rewards[0]:.3f} to {rewards[-1]:.3f} ({rewards[-1] / max(rewards[0], 1e-9):.1f}x)")
    return rewards
