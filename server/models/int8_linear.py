"""Linear layers served from int8 weights (`ModelConfig.serving_dtype="int8"`); imported only to quantize a model."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
from torch.ao.quantization import per_channel_dynamic_qconfig


class Int8Linear(torch.nn.Module):
    """int8 weights (one scale per output channel) times the input quantized on the fly (torch's dynamic
    quantization, fbgemm or onednn kernels): a quarter of fp32's bytes read per token, fp32 out.

    It shows PEFT its int8 weight as `qweight` (as GPTQ layers do), so an adapter added later (an older step's,
    for evaluation) lands beside it in fp32 instead of failing on the quantized module's `weight()` method. The
    quantized module is held outside the module tree: loading a LoRA checkpoint (a partial state dict) would
    otherwise fail on its missing keys, and it is never saved (checkpoints hold the trainer's LoRA only).
    """

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        linear.qconfig = per_channel_dynamic_qconfig
        with warnings.catch_warnings():  # torch's eager quantization asks users to migrate to torchao
            warnings.simplefilter("ignore")
            self.__dict__["int8"] = DynamicLinear.from_float(linear.float())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    @property
    def qweight(self) -> torch.Tensor:
        return self.int8.weight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.int8(x.float())


def quantize_linear_layers(model: Any) -> int:
    """Replace every linear layer of `model` but the LoRA's own by an `Int8Linear` (in place); returns how many."""
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and "lora_" not in name
    ]
    for name, module in targets:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, Int8Linear(module))
    return len(targets)
