"""Forking: a new model starts from another model's checkpoint (ART's `_experimental_fork_checkpoint`), serves it
under its step number, trains on from it, and nothing of either model's lineage is ever replaced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import art_agents as art
from art_agents.errors import ArtError, ServerError
from art_agents.local import LocalBackend
from art_agents.server.ops.quickstart import TOY_MODEL_CONFIG


async def groups_of(model: art.TrainableModel) -> list[art.TrajectoryGroup]:
    client = model.openai_client()

    async def attempt(prompt: str) -> art.Trajectory:
        async with art.rollout() as trajectory:
            reply = await client.chat.completions.create(
                model=model.get_inference_name(), messages=[{"role": "user", "content": prompt}], max_tokens=5
            )
            trajectory.reward = len(reply.choices[0].message.content or "") % 4
        return trajectory

    groups = [art.TrajectoryGroup([await attempt(f"task {g}") for _ in range(4)]) for g in range(2)]
    await client.close()
    return groups


def adapter_bytes(model_dir: Path, step: int) -> bytes:
    return (model_dir / "checkpoints" / f"{step:04d}" / "adapter_model.safetensors").read_bytes()


async def test_a_model_forked_from_a_checkpoint_serves_it_and_trains_on(tmp_path: Path, tiny_model_path: Path) -> None:
    backend = LocalBackend(path=str(tmp_path / ".art"), in_process=True)
    models = tmp_path / ".art" / "fork" / "models"

    def model(name: str, **changes: object) -> art.TrainableModel:
        config = TOY_MODEL_CONFIG.model_copy(update=changes)
        return art.TrainableModel(name=name, project="fork", base_model=str(tiny_model_path), config=config)

    try:
        parent = model("parent")
        await parent.register(backend)
        for _ in range(2):
            await parent.train(await groups_of(parent), art.TrainConfig(learning_rate=1e-2), progress=False)
        child = model("child")
        await child.register(backend)

        await backend._experimental_fork_checkpoint(child, from_model="parent", not_after_step=1)
        assert await child.get_step() == 1
        assert adapter_bytes(models / "child", 1) == adapter_bytes(models / "parent", 1)
        state = json.loads((models / "child" / "checkpoints" / "0001" / "trainer_state.json").read_text())
        assert state["forked_from"] == "fork/parent@1" and state["step"] == 1
        client = child.openai_client()
        reply = await client.chat.completions.create(
            model=child.get_inference_name(), messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert reply.model == "child@1"
        await client.close()
        result = await child.train(await groups_of(child), art.TrainConfig(learning_rate=1e-2), progress=False)
        assert result.step == 2 and adapter_bytes(models / "child", 2) != adapter_bytes(models / "parent", 2)
        rows = [json.loads(line) for line in (models / "child" / "history.jsonl").read_text().splitlines()]
        assert [(row["step"], row["kind"]) for row in rows] == [(1, "fork"), (2, "rl")]

        with pytest.raises(ServerError, match=r"409: model 'child' already serves step 2.*newly registered"):
            await backend.fork_checkpoint(child, "parent")
        lonely = model("lonely")
        await lonely.register(backend)
        with pytest.raises(ServerError, match=r"404: fork/nobody has no checkpoints"):
            await backend.fork_checkpoint(lonely, "nobody")
        with pytest.raises(ServerError, match=r"409: .* serves step 0, so step 0 of fork/parent cannot be forked"):
            await backend.fork_checkpoint(lonely, "parent", not_after_step=0)
        wider = model("wider", lora_rank=4)
        await wider.register(backend)
        with pytest.raises(ServerError, match=r"400: fork/parent's LoRA differs \(lora_rank 8 vs 4\)"):
            await backend.fork_checkpoint(wider, "parent")
        assert await wider.get_step() == 0
        with pytest.raises(ArtError, match="from_s3_bucket, prefix"):
            await backend._experimental_fork_checkpoint(wider, "parent", from_s3_bucket="bucket")
    finally:
        await backend.close()
