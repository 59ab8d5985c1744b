"""`python -m art_agents serve` as a child process behind LocalBackend, and `art-agents tiny-model`."""

from __future__ import annotations

from pathlib import Path

from art_agents.backend import LocalBackend
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

    from art_agents.cli import app, load_parts

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
