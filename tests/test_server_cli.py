"""`python -m art_agents serve` as a child process behind LocalBackend, and `art-agents tiny-model`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from art_agents.backends.local import LocalBackend
from art_agents.capture import rollout
from art_agents.model import TrainableModel


async def test_local_backend_serves_a_registered_model_to_the_captured_sdk(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    async with LocalBackend(tmp_path / "art", startup_timeout=120) as backend:
        model = TrainableModel(name="agent", project="cli", base_model=str(tiny_model_path))
        await model.register(backend)
        assert await model.get_step() == 0
        client = model.openai_client()
        async with rollout() as trajectory:
            response = await client.chat.completions.create(
                model=model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        assert response.model == "agent@0"
        (turn,) = trajectory.turns
        assert turn.completion_id == response.id and turn.policy_step == 0
        assert [c.step for c in await backend.list_checkpoints(model)] == [0]
    assert (tmp_path / "art" / "cli" / "models" / "agent" / "model.json").exists()


def test_tiny_model_command_builds_a_loadable_model(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from typer.testing import CliRunner

    from art_agents.cli.main import app, load_parts

    load_parts()
    result = CliRunner().invoke(app, ["tiny-model", str(tmp_path / "llama"), "--arch", "llama"])
    assert result.exit_code == 0, result.output
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "llama")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "llama")
    assert model.config.model_type == "llama" and model.config.vocab_size == len(tokenizer)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        tokenize=False,
    )
    assert (
        "<tools>" in rendered
        and tokenizer.decode(tokenizer.encode("<tool_call>x</tool_call>")) == "<tool_call>x</tool_call>"
    )


def test_local_server_exits_when_its_parent_dies(tmp_path: Path, tiny_model_path: Path) -> None:
    """A rollout script killed mid-run must not leave its child server holding the model in memory."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import asyncio, sys, time\n"
        "from art_agents import LocalBackend, TrainableModel\n"
        "async def main():\n"
        f"    backend = LocalBackend({str(tmp_path / 'art')!r}, startup_timeout=120)\n"
        f"    await TrainableModel(name='m', base_model={str(tiny_model_path)!r}).register(backend)\n"
        "    print(backend._process.pid, flush=True)\n"
        "    time.sleep(600)\n"
        "asyncio.run(main())\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not _running(child):
            return
        time.sleep(0.2)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the server outlived its parent by 30 s")


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for a reaper (the orphan's new parent may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
