"""A tiny random causal LM with a real tokenizer and a tool-capable chat template.

Tests and the offline quickstart need a model that loads through the normal
`AutoTokenizer`/`AutoModelForCausalLM.from_pretrained` path without a model hub. The tokenizer
is a byte-level BPE trained here on a small built-in corpus (so any text round-trips), with
Qwen3's special tokens; the chat template is Qwen3's, loaded from the installed TRL package
(which also knows its response parser), so tool calls render and parse as for a real Qwen3.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen3 keeps these as single, non-special tokens: they survive decoding and parse as text.
MARKUP_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "You are a helpful assistant. Answer the question briefly and correctly.",
    "What is the weather in Paris today? It is sunny and 21 degrees.",
    "Please add 12 and 30. The answer is 42.",
    "Call the search tool to find the population of Berlin.",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    '{"name": "add", "arguments": {"a": 1, "b": 2}}',
    "Hello! How can I help you today? Sure, here is the result.",
    "yes no maybe true false null 0 1 2 3 4 5 6 7 8 9 10 100 1000",
    "def main():\n    print('hello world')\n    return 0\n",
    "# Tools\n\nYou may call one or more functions to assist with the user query.",
    "system user assistant tool function arguments name content role",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}<>/\\|-_+=*&^%$#@~`",
]


def qwen3_chat_template() -> str:
    """Qwen3's chat template as TRL ships it (TRL also attaches its response parser to it)."""
    from trl.chat_template_utils import qwen3_chat_template as template

    return template


def train_byte_level_bpe(vocab_size: int, special_tokens: Sequence[str] = ()):  # -> tokenizers.Tokenizer
    """A byte-level BPE trained on the built-in corpus (any text round-trips); `special_tokens` take the first ids.

    Shared with `family_models`, which wraps it in each family's tokenizer class and special tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return backend


def _train_tokenizer(vocab_size: int):  # -> transformers.PreTrainedTokenizerFast
    from transformers import PreTrainedTokenizerFast

    backend = train_byte_level_bpe(vocab_size, SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    tokenizer.add_tokens(MARKUP_TOKENS)
    tokenizer.chat_template = qwen3_chat_template()
    from trl.chat_template_utils import add_response_schema

    return add_response_schema(tokenizer)  # saved with the tokenizer, so `parse_response` works after reload


def build_tiny_model(
    path: str | Path,
    arch: Literal["qwen3", "llama"] = "qwen3",
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
) -> Path:
    """Write a random-initialised causal LM, its tokenizer and chat template to `path`; returns it."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
    )
    config = Qwen3Config(**common) if arch == "qwen3" else LlamaConfig(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    from art_agents.server.host.quiet import quiet_transformers

    with quiet_transformers():  # a bar for one small shard is noise in the quickstart's output
        model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "tiny_model.json").write_text(json.dumps({"arch": arch, "seed": seed, "built_by": "art_agents"}) + "\n")
    return path


async def build_tiny_model_in_child(path: Path) -> Path:
    """`build_tiny_model(path)` in a child process, into a temp folder renamed into place: the seconds it spends
    importing torch stay cancellable (a Ctrl-C ends the quickstart at once, and the child and its half-built
    folder with it), and a folder at `path` is always a whole model."""
    import asyncio
    import os
    import shutil
    import subprocess
    import sys

    from art_agents.errors import ArtError

    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    command = [sys.executable, "-m", "art_agents", "tiny-model", str(tmp)]
    # Its own session, as the server's: a Ctrl-C in the terminal reaches only the quickstart, which ends it.
    child = await asyncio.create_subprocess_exec(
        *command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        _, err = await child.communicate()
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
        if child.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
    if child.returncode != 0:
        last = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise ArtError(f"building the tiny model in {path} failed ({last[0]}); run `art-agents tiny-model {path}`")
    os.rename(tmp, path)
    return path
