"""A vLLM server started by someone else (ART's `vllm_runtime={"mode": "external"}`): the server serves and trains
through it without starting, sleeping or stopping it, and says how to start it when it cannot reach it."""

from __future__ import annotations

import json
from pathlib import Path

import fake_vllm
import httpx
import pytest
from server_fixtures import free_port, start_server

from art_agents.backends.remote import RemoteBackend
from art_agents.model import TrainableModel
from art_agents.server.engines.vllm_engine import VLLMEngine, vllm_args
from art_agents.server.engines.vllm_process import VLLMUnavailable
from art_agents.train_config import ModelConfig

CONFIG = ModelConfig(engine="vllm", lora_rank=8, lora_alpha=16, max_batch_size=24)


def test_an_unreachable_external_vllm_is_named_with_the_command_that_starts_it(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    config = CONFIG.model_copy(update={"vllm_server_url": url, "vllm_startup_timeout": 1.0})
    expected = (
        rf"external vLLM server at http://127\.0\.0\.1:\d+ did not answer /health within 1 s; art-agents does not "
        rf"start it: run `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve {tiny_model_path} --enable-lora "
        r"--max-lora-rank=8 .*--logprobs-mode=processed_logprobs"
    )
    with pytest.raises(VLLMUnavailable, match=expected):
        VLLMEngine.load(str(tiny_model_path), config, name="m", model_dir=tmp_path)
    with pytest.raises(ValueError, match="vllm_server_url is served by the vllm engine"):
        ModelConfig(engine="transformers", vllm_server_url=url)


@pytest.mark.slow
async def test_a_model_served_by_an_external_vllm_trains_through_it(tiny_model_path: Path, tmp_path: Path) -> None:
    from art_agents.server.ops.quickstart import TOY_CONFIG, rollout_groups

    events = tmp_path / "events.jsonl"
    with fake_vllm.serving(tiny_model_path, vllm_args(CONFIG, sleep=False), {"FAKE_VLLM_EVENTS": str(events)}) as vllm:
        external = {"vllm_runtime": {"mode": "external", "server_url": vllm}}
        with start_server(tmp_path / "art") as url:
            backend = RemoteBackend(url)
            model = TrainableModel(
                name="v", project="p", base_model=str(tiny_model_path), config=CONFIG, _internal_config=external
            )
            await model.register(backend)
            assert model.server_config.vllm_server_url == vllm
            client = model.openai_client()
            result = await model.train(await rollout_groups(client, model, step=0), TOY_CONFIG, progress=False)
            assert result.step == 1 and result.metrics["turns_retokenized"] == 0
            answer = await client.chat.completions.create(model="v", messages=[{"role": "user", "content": "hi"}])
            assert answer.model == "v@1"
            await client.close()
            await backend.close()
        kinds = [json.loads(line)["event"] for line in events.read_text().splitlines()]
        assert kinds.count("start") == 1 and "sleep" not in kinds  # started once, by us here; never put to sleep
        assert httpx.get(f"{vllm.removesuffix('/v1')}/health").status_code == 200  # the server stopped; vLLM did not
