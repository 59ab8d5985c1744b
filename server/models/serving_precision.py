"""The precision a transformers engine samples from (`ModelConfig.serving_dtype`), apart from the trainer's.

Decoding on a CPU is bound by the bytes of weights read per token, so an engine serving from bf16 or int8
weights samples faster than one reading fp32. The trainer keeps its own copy of the base in `dtype`: the
policy it trains is exact, and each step corrects for the sampler's different numbers (`mismatch_corrected`).
The LoRA stays fp32 on top of either (PEFT computes an fp32 adapter in fp32 over bf16 and `Int8Linear` layers,
whose outputs are bf16), so a step's small update is not rounded away.
"""

from __future__ import annotations

from typing import Any

from art_agents.server.errors import ServiceError
from art_agents.server.models.lora_model import training_dtype, with_base_of
from art_agents.train_config import ModelConfig, TrainConfig

# What a step uses for a field left None when the engine samples at another precision than the trainer trains:
# the cap of TRL's and ART's truncated importance sampling, and IcePop's band.
MISMATCH_TIS_CAP = 2.0
MISMATCH_ICEPOP = (0.5, 5.0)


def serving_dtype(config: ModelConfig, device: str) -> str:
    """The engine's precision: `serving_dtype`, auto being the trainer's."""
    return training_dtype(config, device) if config.serving_dtype == "auto" else config.serving_dtype


def serves_apart(config: ModelConfig, device: str) -> bool:
    """Whether the engine samples at another precision than the trainer trains (then it holds its own base)."""
    return serving_dtype(config, device) != training_dtype(config, device)


def serving_copy(peft_model: Any, precision: str) -> Any:
    """The engine's model: a second LoRA model over `peft_model`'s base (`with_base_of`) whose base weights are
    converted to `precision` as new tensors (the trainer's stay as they are; tied weights stay tied) while its LoRA
    stays fp32. Converting in memory saves loading the base twice. int8 is int8 linear weights with the rest bf16.
    """
    import torch

    copy = with_base_of(peft_model)
    if precision == "int8":
        from art_agents.server.models.int8_linear import quantize_linear_layers

        quantize_linear_layers(copy)  # from the fp32 weights, before the rest is converted
    dtype = getattr(torch, "bfloat16" if precision == "int8" else precision)
    converted: dict[int, torch.nn.Parameter] = {}
    for name, module in copy.named_modules():
        if "lora_" in name:
            continue
        for key, param in list(module.named_parameters(recurse=False)):
            if id(param) not in converted:
                converted[id(param)] = torch.nn.Parameter(param.detach().to(dtype), requires_grad=False)
            setattr(module, key, converted[id(param)])
    return copy


def check_serving_dtype(config: ModelConfig, engine: str, device: str) -> None:
    """Refuse, by name and with the fix, a serving precision this engine or machine cannot run (a 400 at register)."""
    precision = serving_dtype(config, device)
    if config.serving_dtype == "auto" or engine == "scripted":
        return
    if engine != "transformers":
        raise ServiceError(
            400, f"serving_dtype={precision!r} is for the transformers engine; the {engine} engine samples in `dtype`"
        )
    if precision == "int8":
        _check_int8(device)
    elif precision in ("bfloat16", "float16"):
        _check_float(precision, device)


def _check_int8(device: str) -> None:
    if not device.startswith("cpu"):
        raise ServiceError(400, f"serving_dtype='int8' runs on the CPU only (this model is on {device}); use bfloat16")
    from art_agents.server.models.int8_linear import int8_kernel_runs

    if not int8_kernel_runs():
        raise ServiceError(
            400,
            "serving_dtype='int8' needs torch's int8 weight kernel (_weight_int8pack_mm), which this torch lacks; "
            "use bfloat16 or float32",
        )
    _check_float("bfloat16", device)  # the rest of the model is bf16


def _check_float(precision: str, device: str) -> None:
    import torch

    dtype = getattr(torch, precision)
    if device.startswith("cuda"):
        supported = torch.cuda.is_bf16_supported() if dtype is torch.bfloat16 else True
    else:
        try:
            supported = bool(torch.isfinite(torch.ones(2, 2, dtype=dtype) @ torch.ones(2, 2, dtype=dtype)).all())
        except RuntimeError:
            supported = False
    if not supported:
        raise ServiceError(400, f"serving_dtype={precision!r} cannot run on {device} here; use float32 or int8")


def mismatch_corrected(config: TrainConfig, model: ModelConfig, device: str) -> TrainConfig:
    """The config a step trains with: truncated importance sampling and IcePop's mask filled in where the engine
    samples at another precision than the trainer (`correct_serving_mismatch`), else `config` itself."""
    if not config.correct_serving_mismatch or not serves_apart(model, device):
        return config
    update: dict[str, Any] = {}
    if config.tis_cap is None:
        update["tis_cap"] = MISMATCH_TIS_CAP
    if config.icepop is None:
        update["icepop"] = MISMATCH_ICEPOP
    return config.model_copy(update=update) if update else config
