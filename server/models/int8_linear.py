"""Linear layers served from int8 weights (`ModelConfig.serving_dtype="int8"`); imported only to quantize a model.

Weights only: activations stay bf16. Quantizing the activations too (torch's dynamic quantization) was faster but
measured a KL of 0.86 to the fp32 model on SmolLM2-135M (its MLP down-projections carry outlier activations), and
a 20-minute MCP•RL run served that way learned almost nothing (5% held-out against fp32's 85%); int8 weights with
one scale per output channel measured a KL of 0.003 (bf16's: 0.0008).
"""

from __future__ import annotations

from typing import Any

import torch

# The language-model head stays bf16: CPU's int8 kernel is slower than bf16 on its wide (vocabulary-sized) output.
KEPT_IN_BF16 = ("lm_head",)
# The kernel reads the input in blocks of 16: other widths gave NaN or crashed (torch 2.13, CPU); such a layer
# (none in real models) stays bf16.
INPUT_BLOCK = 16


class Int8Linear(torch.nn.Module):
    """int8 weights, one bf16 scale per output channel, times a bf16 input (`torch._weight_int8pack_mm`): half
    of bf16's weight bytes read per token, bf16 out.

    It shows PEFT its int8 weight as `qweight` (as GPTQ layers do), so an adapter added later (an older step's,
    for evaluation) lands beside it instead of being cast to int8. The int8 tensors are held outside the module
    tree: they are never saved (checkpoints hold the trainer's LoRA only) and a LoRA checkpoint's partial state dict
    loads without them.
    """

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)
        self.__dict__["int8"] = (weight / scales[:, None]).round().clamp(-128, 127).to(torch.int8).contiguous()
        self.__dict__["scales"] = scales.to(torch.bfloat16)
        self.__dict__["bias"] = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    @property
    def qweight(self) -> torch.Tensor:
        return self.int8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        out = torch._weight_int8pack_mm(rows, self.int8, self.scales).reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


def quantize_linear_layers(model: Any) -> int:
    """Replace the linear layers of `model` but the LoRA's own and `KEPT_IN_BF16` by `Int8Linear`s (in place);
    returns how many."""
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
        and "lora_" not in name
        and name.rpartition(".")[2] not in KEPT_IN_BF16
        and module.in_features % INPUT_BLOCK == 0
    ]
    for name, module in targets:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, Int8Linear(module))
    return len(targets)


def int8_kernel_runs() -> bool:
    """Whether this torch build runs the int8 weight kernel on the CPU, and right."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2 * INPUT_BLOCK, generator=generator).to(torch.bfloat16)
    weight = torch.randint(-127, 128, (16, 2 * INPUT_BLOCK), generator=generator, dtype=torch.int8)
    scales = torch.full((16,), 0.01, dtype=torch.bfloat16)
    try:
        out = torch._weight_int8pack_mm(x, weight, scales).float()
    except (RuntimeError, AttributeError):
        return False
    expected = (x.float() @ weight.float().T) * 0.01
    return bool(torch.allclose(out, expected, rtol=0.02, atol=0.02 * float(expected.abs().max())))
