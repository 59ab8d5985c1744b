"""vLLM on several nodes (`ModelConfig.vllm_nodes`): two fake vLLM servers (tests/fake_vllm.py) on loopback stand
for two nodes' vLLMs reading checkpoints from one shared folder. The real server spreads rollouts over both, loads
each checkpoint into both before either serves it, and a node that refuses it fails the step by its URL while the
last checkpoint keeps serving on both (real server, real OpenAI SDK)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import fake_vllm
import pytest
from server_fixtures import free_port, start_server
from step_timeline import StepTimeline

from art_agents import TrainableModel
from art_agents.backends.remote import RemoteBackend
from art_agents.errors import ArtError
from art_agents.server.engines.registry import load_engine
from art_agents.server.engines.vllm_engine import vllm_args
from art_agents.server.engines.vllm_process import VLLMUnavailable
from art_agents.train_config import ModelConfig, TrainConfig

CONFIG = ModelConfig(engine="vllm", lora_rank=8, lora_alpha=16, max_batch_size=24, default_max_tokens=4)
REFUSED = "refused"  # the model whose step 1 node 1 refuses


@pytest.fixture(scope="module")
def nodes(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple[str, Path]]]:
    """Two nodes' vLLMs: (URL, events file) each; node 1 refuses the adapter `refused@1`."""
    folder = tmp_path_factory.mktemp("nodes")
    args = vllm_args(CONFIG, sleep=False)
    events = [folder / "node0.jsonl", folder / "node1.jsonl"]
    with (
        fake_vllm.serving(tiny_model_path, args, {"FAKE_VLLM_EVENTS": str(events[0])}) as node0,
        fake_vllm.serving(
            tiny_model_path, args, {"FAKE_VLLM_EVENTS": str(events[1]), "FAKE_VLLM_REJECT": f"{REFUSED}@1"}
        ) as node1,
    ):
        yield [(node0, events[0]), (node1, events[1])]


async def register(backend: RemoteBackend, nodes: list[tuple[str, Path]], name: str, base: Path) -> TrainableModel:
    """Model `name` served from both nodes (node 0's vLLM given as vllm_server_url)."""
    (node0, _), (node1, _) = nodes
    config = CONFIG.model_copy(update={"vllm_server_url": node0, "vllm_nodes": [node1]})
    model = TrainableModel(name=name, project="p", base_model=str(base), config=config)
    await model.register(backend)
    return model


async def test_no_node_serves_the_old_step_once_one_served_the_new(
    nodes: list[tuple[str, Path]], tiny_model_path: Path, tmp_path: Path
) -> None:
    with start_server(tmp_path / "art") as url:
        backend = RemoteBackend(url)
        model = await register(backend, nodes, "twin", tiny_model_path)
        timeline = StepTimeline(model)
        result = await timeline.train_while_asking()
        await backend.close()
    assert result.step == 1
    timeline.assert_switched_to(1)
    for _, events in nodes:  # both nodes served both steps, and each loaded step 1 once
        assert completions(events, "twin@0") > 0 and completions(events, "twin@1") > 0
        assert adapter_events(events, "twin@1") == ["load"]


async def test_a_node_that_refuses_a_checkpoint_fails_the_step_by_name_and_both_serve_the_last(
    nodes: list[tuple[str, Path]], tiny_model_path: Path, tmp_path: Path
) -> None:
    (_, events0), (node1, events1) = nodes
    with start_server(tmp_path / "art") as url:
        backend = RemoteBackend(url)
        model = await register(backend, nodes, REFUSED, tiny_model_path)
        timeline = StepTimeline(model)
        groups = await timeline.groups()
        refusal = rf"vLLM refused checkpoint 1 of model '{REFUSED}' .* on {re.escape(node1.removesuffix('/v1'))}: "
        with pytest.raises(ArtError, match=refusal):
            await model.train(groups, TrainConfig(learning_rate=1e-3), progress=False)
        assert await model.get_step() == 0
        before = [completions(events0, f"{REFUSED}@0"), completions(events1, f"{REFUSED}@0")]
        await asyncio.gather(*(timeline.ask("after") for _ in range(6)))
        await timeline.close()
        await backend.close()
    assert [step for _, _, step in timeline.seen[-6:]] == [0] * 6
    assert completions(events0, f"{REFUSED}@0") > before[0] and completions(events1, f"{REFUSED}@0") > before[1]
    assert adapter_events(events0, f"{REFUSED}@1") == ["load", "unload"]  # node 0 had loaded it: taken back out
    assert adapter_events(events1, f"{REFUSED}@1") == []


def completions(events: Path, model: str) -> int:
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    return sum(1 for r in rows if r["event"] == "completion" and r["model"] == model)


def adapter_events(events: Path, model: str) -> list[str]:
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    return [r["event"] for r in rows if r["event"] in ("load", "unload") and r["lora_name"] == model]


def test_a_node_that_does_not_answer_is_named_with_the_command_that_starts_it(
    nodes: list[tuple[str, Path]], tiny_model_path: Path, tmp_path: Path
) -> None:
    gone = f"http://127.0.0.1:{free_port()}"
    config = CONFIG.model_copy(
        update={"vllm_server_url": nodes[0][0], "vllm_nodes": [nodes[1][0], gone], "vllm_startup_timeout": 1.0}
    )
    expected = rf"vLLM server at {re.escape(gone)} did not answer /health .* vllm serve .*vllm_nodes"
    with pytest.raises(VLLMUnavailable, match=expected):
        load_engine(str(tiny_model_path), config, "m", tmp_path)
    with pytest.raises(ValueError, match="vllm_nodes are served by the vllm engine"):
        ModelConfig(engine="transformers", vllm_nodes=[gone])
