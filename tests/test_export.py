"""`art-agents export` proven against what the server served: the tiny model after a training step, its completions
(exact tokens and logprobs from the server's token store) reproduced by the exported merged folder in plain
transformers, by the LoRA folder on the base with PEFT, and by the GGUF file (read back with gguf's reader and
with transformers' GGUF loader); bad input refused in one line with nothing left on disk."""

from __future__ import annotations

import json
import os
import resource
import shlex
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fake_hub import start_fake_hub

import art_agents as art
from art_agents.local import LocalBackend
from art_agents.server.export.source import ExportError
from art_agents.server.export.writer import export_model
from art_agents.server.ops.quickstart import TOY_MODEL_CONFIG
from art_agents.server.storage.token_store import TokenRecord, TokenStore

PROMPTS = [f"Tell me about item {i} and the fox number {i * 7}." for i in range(20)]
TOLERANCE = 1e-4  # fp32: the merged weights add the LoRA product once, the served model at every call


@dataclass
class Trained:
    model: art.TrainableModel
    model_dir: Path
    base: Path
    served: list[TokenRecord]  # what the server answered for each prompt, token by token


@pytest.fixture(scope="module")
async def trained(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> AsyncIterator[Trained]:
    """The tiny model (the quickstart's LoRA, lm_head included) after one SFT step, and its greedy answers."""
    backend = LocalBackend(path=tmp_path_factory.mktemp("export") / ".art", in_process=True)
    model = art.TrainableModel(
        name="shipped", project="export", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG, report_to=[]
    )
    await model.register(backend)
    demo = art.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "What is the capital of Zorbia?"},
            {"role": "assistant", "content": "Quuxtown."},
        ]
    )
    await model.train_sft([demo], art.TrainSFTConfig(learning_rate=1e-2, epochs=40), progress=False)
    client = model.openai_client()
    ids = []
    for prompt in PROMPTS:
        reply = await client.chat.completions.create(
            model=model.name, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=8
        )
        assert reply.model == "shipped@1"
        ids.append(reply.id)
    model_dir = backend.art_path / "export" / "models" / "shipped"
    store = TokenStore(model_dir / "tokens" / "store.sqlite")
    records = store.get_many(ids)
    store.close()
    yield Trained(model, model_dir, tiny_model_path, [records[i] for i in ids])
    await backend.close()


def assert_serves_the_same(model: Any, served: list[TokenRecord]) -> None:
    """Greedy tokens equal to the server's, and each served token's logprob within TOLERANCE."""
    import torch

    assert len({tuple(r.completion_ids) for r in served}) > 1  # the answers differ: the check can tell models apart
    for record in served:
        prompt = torch.tensor([record.prompt_ids])
        with torch.inference_mode():
            greedy = model.generate(prompt, max_new_tokens=len(record.completion_ids), do_sample=False)
            logits = model(torch.tensor([record.prompt_ids + record.completion_ids])).logits[0].float()
        assert greedy[0, len(record.prompt_ids) :].tolist() == record.completion_ids
        steps = logits[len(record.prompt_ids) - 1 : -1]
        logprobs = torch.log_softmax(steps, -1).gather(1, torch.tensor(record.completion_ids)[:, None])[:, 0]
        assert torch.allclose(logprobs, torch.tensor(record.logprobs), atol=TOLERANCE, rtol=0)


def served_logits(trained: Trained, ids: list[int]) -> Any:
    """The full logits of the step as the server loads it: base + the checkpoint's LoRA (the server's loaders)."""
    import torch

    from art_agents.server.models.lora_model import load_lora_weights, load_peft_model
    from art_agents.server.storage.checkpoints import checkpoint_path

    policy, _ = load_peft_model(str(trained.base), TOY_MODEL_CONFIG)
    load_lora_weights(policy, checkpoint_path(trained.model_dir, 1))
    with torch.inference_mode():
        return policy(torch.tensor([ids])).logits[0]


async def test_the_merged_folder_serves_what_the_server_served(trained: Trained, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = await trained.model.export(tmp_path / "merged", format="merged")
    names = {p.name for p in folder.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "chat_template.jinja",
    } <= names
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # the temp folder was renamed, not left
    merged = AutoModelForCausalLM.from_pretrained(folder).eval()
    base = AutoModelForCausalLM.from_pretrained(trained.base)
    assert merged.dtype == torch.float32 and not merged.config.tie_word_embeddings  # lm_head's LoRA: untied
    assert torch.equal(merged.model.embed_tokens.weight, base.model.embed_tokens.weight)  # the embedding unchanged
    assert not torch.equal(merged.lm_head.weight, base.lm_head.weight)  # the trained head merged in
    assert_serves_the_same(merged, trained.served)
    ids = trained.served[0].prompt_ids + trained.served[0].completion_ids
    with torch.inference_mode():
        logits = merged(torch.tensor([ids])).logits[0]
    assert (logits - served_logits(trained, ids)).abs().max() < TOLERANCE
    tokenizer = AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": PROMPTS[0]}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert rendered == trained.served[0].prompt_ids
    info = json.loads((folder / "export.json").read_text())
    assert (info["name"], info["step"], info["format"]) == ("shipped", 1, "merged")


async def test_the_lora_folder_on_its_base_serves_the_same_and_names_vllm_flags(
    trained: Trained, tmp_path: Path
) -> None:
    import fake_vllm
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder = await trained.model.export(tmp_path / "lora", format="lora")
    adapter = json.loads((folder / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(trained.base)
    assert not (folder / "optimizer.pt").exists()  # the adapter only, not the trainer's state
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(trained.base), folder).eval()
    assert_serves_the_same(peft_model, trained.served)
    readme = (folder / "README.md").read_text()
    vllm_line = next(line for line in readme.splitlines() if line.startswith("vllm serve"))
    read = fake_vllm.parse(shlex.split(vllm_line)[1:])  # vLLM's own flag names, choices and formats
    assert read.enable_lora and read.model == str(trained.base) and read.max_lora_rank == 8
    assert read.lora_modules == [f"shipped@1={folder}"]
    assert f"--lora-paths shipped@1={folder}" in readme and "sglang.launch_server" in readme
    assert "| 1 | sft |" in readme  # the training history's rows


async def test_the_gguf_file_holds_the_merged_weights_and_loads_as_the_served_model(
    trained: Trained, tmp_path: Path
) -> None:
    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    merged_folder = await trained.model.export(tmp_path / "merged", format="merged")
    folder = await trained.model.export(tmp_path / "gguf", format="gguf")
    file = folder / "shipped-step1.gguf"
    reader = gguf.GGUFReader(file)
    meta = {name: field.contents() for name, field in reader.fields.items()}
    assert meta["general.architecture"] == "qwen3" and meta["general.name"] == "shipped@1"
    assert (meta["qwen3.block_count"], meta["qwen3.attention.head_count_kv"], meta["qwen3.attention.key_length"]) == (
        2,
        2,
        16,
    )
    merged = AutoModelForCausalLM.from_pretrained(merged_folder)
    tokens = meta["tokenizer.ggml.tokens"]
    vocab = merged.config.vocab_size
    assert len(tokens) == vocab and meta["tokenizer.ggml.pre"] == "gpt2" and "<|im_end|>" in tokens
    assert meta["tokenizer.ggml.eos_token_id"] == tokens.index("<|im_end|>")
    assert meta["tokenizer.chat_template"] == (merged_folder / "chat_template.jinja").read_text()
    weights = merged.state_dict()
    expected = {f"blk.{i}.{t}.weight" for i in range(2) for t in ("attn_q", "attn_k", "attn_v", "attn_output",
                "attn_q_norm", "attn_k_norm", "attn_norm", "ffn_gate", "ffn_up", "ffn_down", "ffn_norm")}  # fmt: skip
    expected |= {"token_embd.weight", "output_norm.weight", "output.weight"}  # output: untied by lm_head's LoRA
    assert {t.name for t in reader.tensors} == expected
    by_name = {t.name: t for t in reader.tensors}
    for hf_name, gguf_name in [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("lm_head.weight", "output.weight"),
        ("model.layers.1.self_attn.q_proj.weight", "blk.1.attn_q.weight"),
        ("model.layers.0.self_attn.q_norm.weight", "blk.0.attn_q_norm.weight"),
        ("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight"),
    ]:
        assert by_name[gguf_name].tensor_type == gguf.GGMLQuantizationType.F32
        assert torch.equal(torch.from_numpy(by_name[gguf_name].data.copy()), weights[hf_name])  # bit for bit
    # transformers' GGUF loader (llama.cpp's tensor layout read back), as the README says to call it: its qwen3
    # mapping ignores key_length, so the line names the tiny model's head size (16, not Qwen3Config's 128)
    readme = (folder / "README.md").read_text()
    code = readme.split("With transformers", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert "gguf_file='shipped-step1.gguf', head_dim=16)" in code
    loaded: dict[str, Any] = {}
    exec(code, loaded)
    from_gguf = loaded["model"].eval()
    assert_serves_the_same(from_gguf, trained.served[:5])
    ids = torch.tensor([trained.served[0].prompt_ids + trained.served[0].completion_ids])
    with torch.inference_mode():
        assert torch.equal(from_gguf(ids).logits, merged(ids).logits)  # f32 weights, read back bit for bit
    messages = [{"role": "user", "content": PROMPTS[0]}]
    rendered = loaded["tokenizer"].apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert rendered == trained.served[0].prompt_ids  # the file's tokenizer and chat template
    modelfile = (folder / "Modelfile").read_text()
    assert modelfile.startswith("FROM ./shipped-step1.gguf\n") and 'PARAMETER stop "<|im_end|>"' in modelfile
    assert "ollama create shipped -f Modelfile" in (folder / "README.md").read_text()


async def test_q8_0_stays_within_its_rounding_of_the_merged_weights(trained: Trained, tmp_path: Path) -> None:
    import gguf
    import numpy as np

    folder = await trained.model.export(tmp_path / "q8", format="gguf", quantization="q8_0")
    reader = gguf.GGUFReader(folder / "shipped-step1.gguf")
    tensors = {t.name: t for t in reader.tensors}
    q = tensors["blk.0.attn_q.weight"]
    assert q.tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32  # 1-D stays f32
    from safetensors.numpy import load_file

    merged = load_file(str((await trained.model.export(tmp_path / "m", format="merged")) / "model.safetensors"))
    original = merged["model.layers.0.self_attn.q_proj.weight"]
    restored = gguf.quants.dequantize(q.data, q.tensor_type).reshape(original.shape)
    scale = np.abs(original).reshape(-1, 32).max(axis=1) / 127  # q8_0: one scale per block of 32, kept in f16
    bound = scale[:, None] * (0.5 + 127 * 2**-11)  # half a step, plus 127 steps of the f16 scale's rounding
    assert np.all(np.abs(restored - original).reshape(-1, 32) <= bound)
    assert json.loads((folder / "export.json").read_text())["quantization"] == "q8_0"


async def test_the_model_card_carries_the_evaluations(trained: Trained, tmp_path: Path) -> None:
    from art_agents.evaluation.files import EvalSummary, ModelSummary, eval_folder, write_summary

    attempt = art.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}], reward=0.75)
    await trained.model.log([attempt], split="val")
    scores = ModelSummary(
        model="shipped@1", file="shipped.jsonl", step=1, scenarios=12, failed_scenarios=0, failed_rollouts=0,
        mean_reward=0.625, ci_low=0.5, ci_high=0.75,
    )  # fmt: skip
    summary = EvalSummary(name="heldout", scenarios=12, rollouts_per_scenario=1, decoding="greedy", models=[scores],
                          comparisons=[])  # fmt: skip
    write_summary(eval_folder(trained.model_dir, "heldout"), summary)
    card = (await trained.model.export(tmp_path / "card", format="lora") / "README.md").read_text()
    assert "| heldout | shipped@1 | 1 | 0.625 | 0.5 to 0.75 | 12 |" in card  # art.evaluate's summary
    assert "| val | 1 | 0.75 | 0 | 1 |" in card  # model.log's row


def test_bad_input_is_refused_by_name_before_writing(trained: Trained, tmp_path: Path) -> None:
    target = tmp_path / "out"
    with pytest.raises(ExportError, match=r"no checkpoint 7; its steps are 0-1: pick one with --step"):
        export_model(trained.model_dir, target, step=7)
    with pytest.raises(ExportError, match=r"holds no trained model.*give a model folder"):
        export_model(tmp_path, target)
    with pytest.raises(ExportError, match=r"--format 'onnx' is not one of lora, merged, gguf"):
        export_model(trained.model_dir, target, format="onnx")  # type: ignore[arg-type]
    with pytest.raises(ExportError, match=r"--quantization 'q4_k' is not one of f32, f16, bf16, q8_0"):
        export_model(trained.model_dir, target, format="gguf", quantization="q4_k")
    assert list(tmp_path.iterdir()) == []  # nothing written, not even a temp folder
    server_folder = trained.model_dir.parent.parent.parent
    assert export_model(server_folder, target, step=0) == target  # a server folder with one model finds it
    assert json.loads((target / "export.json").read_text())["step"] == 0


def run_cli(
    *args: str, limit_bytes: int | None = None, umask: int | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`art-agents ...` as a user runs it; `limit_bytes` caps every file it writes (a disk that fills up)."""

    def prepare() -> None:
        if umask is not None:
            os.umask(umask)
        if limit_bytes:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap fails (EFBIG) instead of killing
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "-m", "art_agents", *args],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=prepare,
        env={**os.environ, **(env or {})},
    )


def test_a_project_folder_exports_its_model_quietly_with_every_file_at_the_umasks_mode(
    trained: Trained, tmp_path: Path
) -> None:
    project = trained.model_dir.parent.parent  # <art_path>/export, as `art-agents export .art/quickstart` names it
    target = tmp_path / "merged"
    done = run_cli("export", str(project), "--to", str(target), "--format", "merged", umask=0o027)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"exported to {target} (see its README.md for how to serve it)\n"
    assert done.stderr == ""  # no FutureWarning, no loading or writing bars
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in target.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o640}, modes  # safetensors' own is 0o600


def test_the_command_refuses_an_existing_folder_and_a_full_disk_leaves_nothing(
    trained: Trained, tmp_path: Path
) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    refused = run_cli("export", str(trained.model_dir), "--to", str(target))
    assert refused.returncode == 1
    assert (
        refused.stderr.strip()
        == f"error: {target} already exists; pass --overwrite to replace it, or pick another --to"
    )
    full = run_cli("export", str(trained.model_dir), "--to", str(target), "--overwrite", limit_bytes=20_000)
    errors = full.stderr.splitlines()
    assert full.returncode == 1 and len(errors) == 1, full.stderr
    assert errors[0].startswith(f"error: writing {target} failed (File too large); nothing was left behind")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp folder beside it
    assert [p.name for p in target.iterdir()] == ["keep.txt"]  # the folder it was to replace, as it was
    with start_fake_hub() as (endpoint, hub):
        hub_env = {"HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0", "HF_TOKEN": "hf_writer"}
        args = ("--to", str(target), "--step", "1", "--overwrite", "--push-to-hub", "me/shipped")
        done = run_cli("export", str(trained.model_dir), *args, env=hub_env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"exported to {target} (see its README.md for how to serve it)",
        f"pushed to {endpoint}/me/shipped/commit/{'0' * 40}",
    ]
    assert (target / "adapter_model.safetensors").exists() and not (target / "keep.txt").exists()
    assert hub.repos == [{"name": "shipped", "organization": "me", "visibility": "private", "type": "model"}]
    assert hub.authorizations == {"Bearer hf_writer"}  # the token from HF_TOKEN, on every call
    assert hub.files == {p.name: p.read_bytes() for p in target.iterdir()}  # the folder as exported, in one commit
    card = hub.files["README.md"].decode()
    assert card.startswith(f"---\nbase_model: {trained.base}\nlibrary_name: peft\n") and "| 1 | sft |" in card


SMOLLM2_TEMPLATE = (  # SmolLM2-Instruct's: a default system message when the conversation has none
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Folds the system message into the first user turn: no per-role text a Go template could reproduce.
FOLDING_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{% set ns = m['content'] %}{% else %}"
    "[{{ m['role'] }}] {{ m['content'] }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
)


@pytest.mark.parametrize("template", [None, SMOLLM2_TEMPLATE])
def test_the_modelfile_template_renders_chat_as_the_chat_template_does(
    tiny_model_path: Path, template: str | None
) -> None:
    from transformers import AutoTokenizer

    from art_agents.server.export.ollama_modelfile import measure, modelfile

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    tokenizer.chat_template = template or tokenizer.chat_template
    chat = [
        {"role": "user", "content": "Plan a trip."},
        {"role": "assistant", "content": "Where to?"},
        {"role": "user", "content": "Lisbon, {{ not an action }}."},
    ]
    shape = measure(tokenizer)
    for messages in (chat, [{"role": "system", "content": "Short answers."}, *chat]):
        assert shape.render(messages) == tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
    text = modelfile("m.gguf", tokenizer)
    assert f'TEMPLATE """{shape.go_template()}"""' in text and 'PARAMETER stop "<|im_end|>"' in text
    assert shape.go_template().startswith('{{ range .Messages }}{{ if eq .Role "system" }}<|im_start|>system\n')
    default = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert (f'SYSTEM """{default}"""' in text) == (template is not None)


def test_a_template_that_folds_turns_gets_no_modelfile_template(tiny_model_path: Path) -> None:
    from transformers import AutoTokenizer

    from art_agents.server.export.ollama_modelfile import modelfile

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    tokenizer.chat_template = FOLDING_TEMPLATE
    text = modelfile("m.gguf", tokenizer)
    assert "TEMPLATE" not in text.replace("# no TEMPLATE", "")
    assert "# no TEMPLATE: the chat template could not be measured (it does not render a message's content" in text


async def test_export_of_a_remote_backends_model_says_where_to_run_it(tiny_model_path: Path) -> None:
    from art_agents.backends.remote import RemoteBackend

    model = art.TrainableModel(name="far", project="p", base_model=str(tiny_model_path), report_to=[])
    model._backend = backend = RemoteBackend("http://127.0.0.1:9")
    with pytest.raises(art.ArtError, match=r"run `art-agents export <art_path>/p/models/far --to DIR` on the server"):
        await model.export("out")
    await backend.close()


@pytest.mark.slow
async def test_smollm2_exports_serve_what_the_server_served(tmp_path: Path) -> None:
    """A real small model (SmolLM2-135M-Instruct, a Llama loaded from GGUF) after an SFT step: the merged folder
    and the GGUF file (q/k permuted for llama.cpp, the tokenizer copied from the base GGUF) answer as the server."""
    import gguf
    from benchmark_scripts import load_benchmark
    from transformers import AutoModelForCausalLM

    folder, gguf_file = load_benchmark("bench_setup").smollm2_gguf()
    backend = LocalBackend(path=tmp_path / ".art", in_process=True)
    config = art.ModelConfig(gguf_file=gguf_file, lora_rank=8, lora_alpha=16)
    model = art.TrainableModel(name="smol", project="export", base_model=folder, config=config, report_to=[])
    await model.register(backend)
    demo = art.Trajectory(
        messages_and_choices=[{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Teal."}]
    )
    await model.train_sft([demo], art.TrainSFTConfig(learning_rate=1e-3, epochs=2), progress=False)
    client = model.openai_client()
    ids = []
    for prompt in ("Name a colour.", "What is 2+3?", "Say hello in French.", "Write a haiku about rain."):
        reply = await client.chat.completions.create(
            model=model.name, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=12
        )
        ids.append(reply.id)
    model_dir = backend.art_path / "export" / "models" / "smol"
    store = TokenStore(model_dir / "tokens" / "store.sqlite")
    served = list(store.get_many(ids).values())
    store.close()
    merged_folder = await model.export(tmp_path / "merged", format="merged")
    gguf_folder = await model.export(tmp_path / "gguf", format="gguf", quantization="f32")
    await backend.close()
    assert_serves_the_same(AutoModelForCausalLM.from_pretrained(merged_folder).eval(), served)
    file = gguf_folder / "smol-step1.gguf"
    fields = gguf.GGUFReader(file).fields
    base_fields = gguf.GGUFReader(Path(folder) / gguf_file).fields
    assert fields["general.architecture"].contents() == "llama"
    for name in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.pre", "tokenizer.chat_template"):
        assert fields[name].contents() == base_fields[name].contents()
    assert_serves_the_same(AutoModelForCausalLM.from_pretrained(gguf_folder, gguf_file=file.name).eval(), served)
    assert f"from_pretrained({str(gguf_folder)!r}, gguf_file={file.name!r})" in (gguf_folder / "README.md").read_text()
    assert 'SYSTEM """You are a helpful AI assistant named SmolLM' in (gguf_folder / "Modelfile").read_text()
