"""The vLLM engine against tests/fake_vllm.py: a real process on loopback speaking vLLM 0.34's routes.

The fake is started by the engine's own supervisor: ART_VLLM_PYTHON points at a wrapper script that
runs fake_vllm.py when asked for `-m vllm.entrypoints.cli.main`. It samples from the tiny model with
the adapters the engine loaded, so token ids and logprobs are real and training works.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import start_server

from art_agents.server.engines.protocol import OlderStep, SamplingParams
from art_agents.server.engines.vllm_engine import VLLMEngine, VLLMError, vllm_args
from art_agents.server.engines.vllm_process import VLLMUnavailable
from art_agents.server.models.chat_format import render_prompt_ids
from art_agents.server.models.lora_model import load_peft_model
from art_agents.server.storage import checkpoints
from art_agents.train_config import ModelConfig

CONFIG = ModelConfig(engine="vllm", lora_rank=8, lora_alpha=16, vllm_sleep_mode=True, vllm_startup_timeout=120)


@pytest.fixture(scope="module")
def fake_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stand-in for a vLLM virtualenv's python: `-m vllm.entrypoints.cli.main ...` runs the fake."""
    script = tmp_path_factory.mktemp("vllm-venv") / "python"
    fake = Path(__file__).with_name("fake_vllm.py")
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ] && [ "$2" = "vllm.entrypoints.cli.main" ]; then shift 2; '
        f'exec {sys.executable} {fake} "$@"; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    script.chmod(0o755)
    return script


@pytest.fixture
def fake_env(fake_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Route the engine to the fake; returns its events file."""
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("ART_VLLM_PYTHON", str(fake_python))
    monkeypatch.setenv("FAKE_VLLM_EVENTS", str(events))
    return events


def events_of(path: Path, kind: str | None = None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in rows if kind is None or r["event"] == kind]


def open_engine(base: Path, model_dir: Path, config: ModelConfig = CONFIG) -> VLLMEngine:
    """As the server opens a new model: the engine, then checkpoint 0 saved from the policy's fresh (seeded) LoRA."""
    engine = VLLMEngine.load(str(base), config, name="m", model_dir=model_dir)
    checkpoints.save_checkpoint(model_dir, 0, load_peft_model(str(base), config)[0], None, {})
    return engine


@pytest.fixture(scope="module")
def policy(tiny_model_path: Path) -> Any:
    """The trainer's model as it stands at step 0 (the same seeded LoRA as checkpoint 0)."""
    return load_peft_model(str(tiny_model_path), CONFIG)[0]


def prompt_of(tokenizer: Any, text: str) -> list[int]:
    return render_prompt_ids(tokenizer, [{"role": "user", "content": text}], None)


def tempered_logprobs(policy: Any, prompt: list[int], ids: list[int], temperature: float) -> list[float]:
    """What the trainer computes for these tokens: log-softmax(logits / T) of its policy."""
    import torch

    with torch.inference_mode():
        logits = policy(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()


def test_flags_round_the_rank_up_to_one_vllm_takes() -> None:
    args = vllm_args(CONFIG.model_copy(update={"lora_rank": 4}), sleep=False)
    assert "--max-lora-rank=8" in args and "--logprobs-mode=processed_logprobs" in args
    assert "--enable-sleep-mode" not in args and "--enable-lora" in args
    assert "--enable-prefix-caching" in args  # agent prompts share heads and earlier turns: vLLM reuses their KV
    assert "--no-enable-prefix-caching" in vllm_args(CONFIG.model_copy(update={"prefix_cache_mb": 0}), sleep=False)


def test_the_command_line_carries_tensor_and_data_parallelism_and_lora_as_vllm_reads_them() -> None:
    import fake_vllm

    config = CONFIG.model_copy(update={"tensor_parallel_size": 2, "data_parallel_size": 4, "lora_rank": 32})
    argv = ["serve", "m", "--host", "127.0.0.1", "--port", "8000", *vllm_args(config, sleep=True)]
    read = fake_vllm.parse(argv)
    assert (read.tensor_parallel_size, read.data_parallel_size) == (2, 4)
    assert read.enable_lora and read.max_lora_rank == 32 and read.enable_sleep_mode
    assert (
        fake_vllm.parse(
            ["serve", "m", "--host", "h", "--port", "1", *vllm_args(CONFIG, sleep=False)]
        ).data_parallel_size
        == 1
    )


def test_vllm_failing_to_start_raises_with_its_log(
    fake_env: Path, tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_FAIL_START", "CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(VLLMUnavailable) as caught:
        VLLMEngine.load(str(tiny_model_path), CONFIG, name="m", model_dir=tmp_path / "m")
    message = str(caught.value)
    assert "exited with code 1 while starting" in message and "CUDA out of memory" in message
    assert str(tmp_path / "m" / "vllm.log") in message and caught.value.status == 503


@pytest.fixture(scope="module")
async def engine(
    fake_python: Path, tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[VLLMEngine, Path]]:
    """One engine for the fast tests (starting the fake takes seconds); yields it and its events file."""
    folder = tmp_path_factory.mktemp("vllm-engine")
    env = {"ART_VLLM_PYTHON": str(fake_python), "FAKE_VLLM_EVENTS": str(folder / "events.jsonl")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        engine = await asyncio.to_thread(open_engine, tiny_model_path, folder / "m")
        yield engine, folder / "events.jsonl"
        await engine.close()
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


async def test_generate_returns_ids_and_logprobs_at_the_sampling_temperature(
    engine: tuple[VLLMEngine, Path], tokenizer: Any, policy: Any
) -> None:
    vllm, events = engine
    prompt = prompt_of(tokenizer, "hi")
    seen: list[tuple[int, int]] = []
    params = SamplingParams(max_tokens=8, n=2, temperature=0.7, seed=3)
    samples = await vllm.generate(prompt, params, on_token=lambda c, t: seen.append((c, t)))
    assert [s.step for s in samples] == [0, 0] and all(len(s.token_ids) == len(s.logprobs) > 0 for s in samples)
    for choice, sample in enumerate(samples):
        assert sample.temperature == 0.7
        assert [t for c, t in seen if c == choice] == sample.token_ids  # streamed as sampled
        assert sample.logprobs == pytest.approx(tempered_logprobs(policy, prompt, sample.token_ids, 0.7), abs=1e-4)
    again = await vllm.generate(prompt, params)
    assert [s.token_ids for s in again] == [s.token_ids for s in samples]  # seeded
    sent = events_of(events, "completion")[-1]
    assert sent["model"] == "m@0" and {"prompt", "logprobs", "return_token_ids", "top_k"} <= set(sent["fields"])


async def test_a_new_step_is_served_and_an_older_one_is_the_older_adapter(
    engine: tuple[VLLMEngine, Path], tokenizer: Any, policy: Any
) -> None:
    import torch

    vllm, events = engine
    prompt = prompt_of(tokenizer, "step")
    params = SamplingParams(max_tokens=6, temperature=0)
    before = (await vllm.generate(prompt, params))[0]
    async with vllm.beside_training():  # what training does: change the weights, save, publish, serve N+1
        with torch.no_grad():
            for name, weight in policy.named_parameters():
                if "lora_B" in name:
                    weight.normal_(0, 0.5)
        path = checkpoints.save_checkpoint(vllm.model_dir, 1, policy, None, {})
        await asyncio.to_thread(vllm.publish_checkpoint, 1, path)
        vllm.step = 1
    after = (await vllm.generate(prompt, params))[0]
    assert after.step == 1 and after.logprobs == pytest.approx(
        tempered_logprobs(policy, prompt, after.token_ids, 1.0), abs=1e-4
    )
    old = (await vllm.generate(prompt, params, older=OlderStep(0, checkpoints.checkpoint_path(vllm.model_dir, 0))))[0]
    assert old.step == 0 and old.token_ids == before.token_ids and old.logprobs == pytest.approx(before.logprobs)
    assert [e["event"] for e in events_of(events) if e["event"] in ("sleep", "wake_up")][-2:] == ["sleep", "wake_up"]

    # a step whose checkpoint is gone fails by name, never falls back to the base model
    vllm.forget_older()
    async with vllm.paused():
        pass
    checkpoints.discard_checkpoint(vllm.model_dir, 0)
    with pytest.raises(VLLMError, match="refused checkpoint 0 of model 'm'"):
        await vllm.generate(prompt, params, older=OlderStep(0, checkpoints.checkpoint_path(vllm.model_dir, 0)))
    assert "m@0" in [e["lora_name"] for e in events_of(events, "unload")]


async def test_requests_wait_while_paused(engine: tuple[VLLMEngine, Path], tokenizer: Any) -> None:
    vllm, _ = engine
    prompt = prompt_of(tokenizer, "wait")
    async with vllm.paused():
        waiting = asyncio.create_task(vllm.generate(prompt, SamplingParams(max_tokens=3)))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # vLLM sleeps: the request must not reach it
    assert len((await waiting)[0].token_ids) > 0


@pytest.fixture
async def own_engine(fake_env: Path, tiny_model_path: Path, tmp_path: Path) -> AsyncIterator[VLLMEngine]:
    engine = await asyncio.to_thread(open_engine, tiny_model_path, tmp_path / "m")
    yield engine
    await engine.close()


@pytest.mark.slow
async def test_vllm_dying_mid_request_fails_it_then_restarts_with_the_step_reloaded(
    own_engine: VLLMEngine, fake_env: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_TOKEN_DELAY", "0.2")  # the restarted fake is slow too: fine for a few tokens
    prompt = prompt_of(tokenizer, "die")
    assert own_engine.process is not None
    first_pid = own_engine.process.pid

    def kill_on_first_token(choice: int, token: int) -> None:
        os.kill(first_pid, signal.SIGKILL)  # type: ignore[arg-type]

    with pytest.raises(VLLMUnavailable, match=r"exited with code -9 mid-request; it is being restarted"):
        await own_engine.generate(prompt, SamplingParams(max_tokens=50), on_token=kill_on_first_token)
    sample = (await own_engine.generate(prompt, SamplingParams(max_tokens=2)))[0]
    assert sample.step == 0 and own_engine.process.pid != first_pid
    loads = [e for e in events_of(fake_env, "load") if e["pid"] == own_engine.process.pid]
    assert [e["lora_name"] for e in loads] == ["m@0"]


async def serve_vllm_model(url: str, base: Path, config: ModelConfig) -> Any:
    from art_agents.backends.remote import RemoteBackend
    from art_agents.model import TrainableModel

    model = TrainableModel(name="v", project="p", base_model=str(base), config=config)
    await model.register(RemoteBackend(url))
    return model


@pytest.mark.slow
async def test_rollouts_served_by_vllm_train_with_no_retokenized_turn(
    fake_env: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    from art_agents.server.ops.quickstart import TOY_CONFIG, rollout_groups

    with start_server(tmp_path / "art") as url:
        model = await serve_vllm_model(url, tiny_model_path, CONFIG.model_copy(update={"max_batch_size": 24}))
        client = model.openai_client()
        groups = await rollout_groups(client, model, step=0)
        result = await model.train(groups, TOY_CONFIG, progress=False)
        metrics = result.metrics
        assert result.step == 1 and await model.get_step() == 1
        assert metrics["turns_retokenized"] == 0 and metrics["turns_from_store"] == 24
        assert metrics["logprob_gap_sampler"] < 1e-3  # vLLM's logprobs are the trainer's at the same temperature
        kinds = [e["event"] for e in events_of(fake_env) if e["event"] in ("sleep", "wake_up", "load")]
        assert kinds[-3:] == ["sleep", "wake_up", "load"]  # asleep while training, then step 1 loaded
        assert events_of(fake_env, "load")[-1]["lora_name"] == "v@1"
        answer = await client.chat.completions.create(model="v", messages=[{"role": "user", "content": "hi"}])
        assert answer.model == "v@1"
        await client.close()


@pytest.mark.slow
async def test_a_rejected_adapter_fails_the_step_and_the_last_one_keeps_serving(
    fake_env: Path, tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from art_agents.errors import ArtError
    from art_agents.server.ops.quickstart import TOY_CONFIG, rollout_groups

    monkeypatch.setenv("FAKE_VLLM_REJECT", "@1")
    with start_server(tmp_path / "art") as url:
        model = await serve_vllm_model(url, tiny_model_path, CONFIG.model_copy(update={"max_batch_size": 24}))
        client = model.openai_client()
        groups = await rollout_groups(client, model, step=0, rollouts=2)
        with pytest.raises(ArtError, match=r"vLLM refused checkpoint 1 of model 'v'.*greater than max_lora_rank"):
            await model.train(groups, TOY_CONFIG, progress=False)
        assert await model.get_step() == 0
        assert not checkpoints.checkpoint_path(tmp_path / "art" / "p" / "models" / "v", 1).exists()
        answer = await client.chat.completions.create(model="v", messages=[{"role": "user", "content": "hi"}])
        assert answer.model == "v@0"
        await client.close()


def test_engine_auto_is_transformers_without_cuda() -> None:
    from art_agents.server.engines.registry import choose_engine, cuda_available

    if cuda_available():
        pytest.skip("this machine has CUDA")

    engine, why = choose_engine(ModelConfig())
    assert engine == "transformers" and ("CUDA" in why or "vLLM" in why)


@pytest.mark.slow
def test_a_server_killed_with_sigkill_takes_its_vllm_with_it(
    fake_python: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    import psutil

    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from art_agents.server.engines.vllm_engine import vllm_args\n"
            "from art_agents.server.engines.vllm_process import VLLMLaunch, VLLMProcess\n"
            "from art_agents.train_config import ModelConfig\n"
            "config = ModelConfig(engine='vllm', lora_rank=8, lora_alpha=16)\n"
            "launch = VLLMLaunch(sys.argv[1], sys.argv[2], vllm_args(config, False), Path(sys.argv[3]), 120)\n"
            "process = VLLMProcess(launch)\n"
            "process.start()\n"
            "print(process.pid, flush=True)\n"
            "time.sleep(600)\n",
            str(fake_python),
            str(tiny_model_path),
            str(tmp_path / "vllm.log"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    vllm = psutil.Process(int(owner.stdout.readline()))
    assert vllm.is_running()
    owner.kill()  # SIGKILL: the server gets no chance to stop vLLM itself
    owner.wait()
    gone, _ = psutil.wait_procs([vllm], timeout=30)
    assert gone, "vLLM outlived the server that started it"
