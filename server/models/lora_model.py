"""A base model with a LoRA adapter: loaded by engines to serve and by training to train, never handed between them.

`with_base_of` gives training its own LoRA model over an engine's base weights: the same tensors, not a copy,
so a trainer beside a transformers engine on one device costs the LoRA and its optimizer state only.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from art_agents.train_config import ModelConfig


def device_of(config: ModelConfig) -> str:
    import torch

    if config.device != "auto":
        return config.device
    return "cuda" if torch.cuda.is_available() else "cpu"


def trainer_devices(config: ModelConfig) -> list[str]:
    """One device per trainer process: as configured, else the first CUDA devices, else the CPU."""
    if config.trainer_devices:
        return list(config.trainer_devices)
    import torch

    if torch.cuda.is_available():
        return [f"cuda:{i}" for i in range(config.trainer_processes)]
    return ["cpu"] * config.trainer_processes


def training_gpus(config: ModelConfig) -> set[int]:
    """The CUDA devices (by index) training uses: its processes' devices, else the server's own."""
    devices = trainer_devices(config) if config.trainer_processes else [device_of(config)]
    return {int(d.partition(":")[2] or 0) for d in devices if d.startswith("cuda")}


def _source(config: ModelConfig) -> dict[str, Any]:
    return {"gguf_file": config.gguf_file} if config.gguf_file else {}


def load_tokenizer(base_model: str, config: ModelConfig) -> Any:
    """The model's tokenizer, with TRL's response parser for its chat template where it has none."""
    from transformers import AutoTokenizer

    from art_agents.server.models.chat_format import attach_response_parser

    return attach_response_parser(AutoTokenizer.from_pretrained(base_model, **_source(config)))


def load_base_model(base_model: str, config: ModelConfig, dtype: Any) -> Any:
    """The base model alone, in `dtype` ("auto": the dtype it was saved in), from a folder, hub id or GGUF file."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base_model, dtype=dtype, **_source(config))


def training_dtype(config: ModelConfig, device: str) -> str:
    """The trainer's precision: `dtype`, auto being bf16 on CUDA and fp32 elsewhere."""
    if config.dtype != "auto":
        return config.dtype
    return "bfloat16" if device.startswith("cuda") else "float32"


def load_peft_model(base_model: str, config: ModelConfig) -> tuple[Any, Any]:
    """The base model with a fresh LoRA adapter "default" (seeded), in the trainer's precision, and its tokenizer."""
    import torch
    from peft import LoraConfig, get_peft_model

    device = device_of(config)
    tokenizer = load_tokenizer(base_model, config)
    model = load_base_model(base_model, config, getattr(torch, training_dtype(config, device)))
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.target_modules),
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        peft_model = get_peft_model(model.to(device), lora)
    peft_model.eval()
    return peft_model, tokenizer


def with_base_of(peft_model: Any) -> Any:
    """A second LoRA model whose base weights are `peft_model`'s own tensors and whose LoRA is a copy of its
    active adapter: the two train and serve independently while the base is held once in memory."""
    shared = {
        id(tensor): tensor
        for name, tensor in [*peft_model.named_parameters(), *peft_model.named_buffers()]
        if "lora_" not in name
    }
    return copy.deepcopy(peft_model, memo=shared)


def load_lora_weights(model: Any, path: str | Path) -> None:
    """Set adapter "default" of `model` to a checkpoint's weights; a checkpoint of another LoRA shape is refused."""
    from peft import load_peft_weights, set_peft_model_state_dict

    device = next(model.parameters()).device
    result = set_peft_model_state_dict(model, load_peft_weights(str(path), device=str(device)), adapter_name="default")
    unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if unexpected:
        raise ValueError(f"checkpoint {path} does not match this model's LoRA config: unexpected keys {unexpected[:3]}")
    model.eval()


def stop_token_ids(generation_config: Any, tokenizer: Any) -> set[int]:
    """The end-of-sequence ids of the model's generation config and of its tokenizer."""
    ids: set[int] = set()
    for value in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value)
    return ids


def load_generation_config(base_model: str, config: ModelConfig) -> Any:
    """The generation config `from_pretrained` would give the model, without loading its weights."""
    from transformers import AutoConfig, GenerationConfig

    try:
        return GenerationConfig.from_pretrained(base_model, **_source(config))
    except OSError:  # no generation_config.json: transformers derives one from the model config
        return GenerationConfig.from_model_config(AutoConfig.from_pretrained(base_model, **_source(config)))
