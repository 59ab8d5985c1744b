"""Two transformers engines of the tiny model behind the router: a rollout's calls stay on one replica, new ones
go to the least busy, and after a train call both serve the new step, with none serving the old one after
the other served the new (real server, real OpenAI SDK)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from server_fixtures import start_server
from step_timeline import StepTimeline

from art_agents import TrainableModel
from art_agents.backends.remote import RemoteBackend
from art_agents.errors import ServerError
from art_agents.server.engines.protocol import SamplingParams
from art_agents.server.engines.registry import load_engine
from art_agents.server.engines.replicas import ReplicaRouter
from art_agents.server.errors import ServiceError
from art_agents.train_config import ModelConfig

CONFIG = ModelConfig(lora_rank=4, max_batch_size=8, default_max_tokens=6, replicas=2)
PARAMS = SamplingParams(max_tokens=4, temperature=1.0)


async def test_a_rollout_stays_on_its_replica_and_new_ones_go_to_the_least_busy(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    router = load_engine(str(tiny_model_path), CONFIG, "m", tmp_path)
    assert isinstance(router, ReplicaRouter) and len(router.replicas) == 2
    assert router.replicas[0].base_weights() is not router.replicas[1].base_weights()  # two loaded copies
    try:
        prompt = router.tokenizer.encode("Hello there")
        first = asyncio.create_task(router.generate(prompt, PARAMS, route="rollout-a"))
        await asyncio.sleep(0)  # rollout-a is in flight on one replica...
        await router.generate(prompt, PARAMS, route="rollout-b")  # ...so rollout-b goes to the other
        await first
        assert router.served == [1, 1]
        for _ in range(3):  # later turns follow their rollout, whatever the load
            await router.generate(prompt, PARAMS, route="rollout-a")
        assert sorted(router.served) == [1, 4]
        a = router.pick("rollout-a")
        assert router.served[a] == 4 and router.pick("rollout-b") == 1 - a
        router.step = 3
        assert [r.step for r in router.replicas] == [3, 3]
    finally:
        await router.close()


def test_replicas_are_refused_for_engines_that_serve_copies_their_own_way(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    config = CONFIG.model_copy(update={"engine": "scripted", "scripted_responses": ["a"]})
    with pytest.raises(ServiceError, match=r"replicas=2 is for the transformers engine.*data_parallel_size"):
        load_engine(str(tiny_model_path), config, "m", tmp_path)


async def test_both_replicas_serve_the_new_step_after_a_train_call_and_never_a_mix(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    with start_server(tmp_path / "art") as url:
        backend = RemoteBackend(url)
        model = TrainableModel(name="twin", project="r", base_model=str(tiny_model_path), config=CONFIG)
        await model.register(backend)
        timeline = StepTimeline(model)
        result = await timeline.train_while_asking()
        await backend.close()
    assert result.step == 1
    timeline.assert_switched_to(1)


async def test_a_vllm_model_is_told_to_use_data_parallel_size(tiny_model_path: Path, tmp_path: Path) -> None:
    with start_server(tmp_path / "art") as url:
        backend = RemoteBackend(url)
        config = ModelConfig(engine="vllm", replicas=2)
        model = TrainableModel(name="v", project="r", base_model=str(tiny_model_path), config=config)
        with pytest.raises(ServerError, match="data_parallel_size"):
            await model.register(backend)
        await backend.close()
