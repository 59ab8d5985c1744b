"""How one trainer process shares a step with the others of a torch.distributed group (DDP or FSDP2).

The step's micro-batches are dealt out round-robin, so each is computed exactly as by a single process and the
summed gradients are the single-process ones: the loss is normalised by the whole step's totals, and the
gradients that DDP and FSDP average over the ranks are scaled back by the number of ranks. Every rank runs the
same number of forward passes (a rank short of work computes an empty batch), because FSDP gathers parameters
collectively in each one. Gradients are synchronised once per optimizer step, on the last micro-batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

T = TypeVar("T")

Sharding = Literal["ddp", "fsdp"]


@dataclass(frozen=True)
class Ranks:
    """This process's place in its group, and the module its forward passes go through (DDP's wrapper, or the
    model itself, sharded in place by FSDP2). The default is one process on its own."""

    rank: int = 0
    world: int = 1
    sharding: Sharding | None = None
    module: Any = None
    device: str = "cpu"  # where the collectives' tensors live (nccl needs them on the GPU)

    def forward_of(self, model: Any) -> Any:
        return model if self.module is None else self.module

    def share(self, work: list[T], empty: T) -> list[T]:
        """This rank's part of `work`, padded with `empty` to the length of the longest part."""
        if self.world == 1:
            return work
        mine = work[self.rank :: self.world]
        longest = -(-len(work) // self.world)
        return mine + [empty] * (longest - len(mine)) or [empty]

    @contextlib.contextmanager
    def syncing(self, sync: bool) -> Iterator[None]:
        """Backward passes inside reduce gradients over the ranks only when `sync` (the optimizer step's last)."""
        if self.sharding == "ddp" and not sync:
            with self.module.no_sync():
                yield
        elif self.sharding == "fsdp":
            self.module.set_requires_gradient_sync(sync)
            try:
                yield
            finally:
                self.module.set_requires_gradient_sync(True)
        else:
            yield

    def summed(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks (every rank gets the totals)."""
        return self._reduced(values, "SUM")

    def largest(self, value: float) -> float:
        """The largest of the ranks' values (every rank gets it)."""
        return self._reduced([value], "MAX")[0]

    def _reduced(self, values: list[float], op: str) -> list[float]:
        if self.world == 1:
            return values
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
        return tensor.tolist()


def trainable_weights(model: Any) -> dict[str, Any]:
    """The trainable (LoRA) weights by parameter name, whole and on the CPU (FSDP shards are gathered: a
    collective, so every rank calls it)."""
    return {name: _whole(param) for name, param in model.named_parameters() if param.requires_grad}


def set_trainable_weights(model: Any, weights: dict[str, Any]) -> None:
    """Set the trainable weights from whole tensors by name (each rank keeps its FSDP shard of them)."""
    import torch

    trainable = {name: param for name, param in model.named_parameters() if param.requires_grad}
    if set(trainable) != set(weights):
        missing, extra = sorted(set(trainable) - set(weights)), sorted(set(weights) - set(trainable))
        raise ValueError(
            f"LoRA weights do not match the trainer's model: missing {missing[:3]}, unexpected {extra[:3]}"
        )
    with torch.no_grad():
        for name, param in trainable.items():
            param.copy_(_like(weights[name], param))


def whole_optimizer_state(state: dict) -> dict:
    """An optimizer state dict with every tensor whole and on the CPU (the checkpoint's form)."""
    if not state:
        return state
    return {
        "state": {i: {key: _whole(value) for key, value in entry.items()} for i, entry in state["state"].items()},
        "param_groups": state["param_groups"],
    }


def sharded_optimizer_state(state: dict | None, params: list[Any]) -> dict | None:
    """A checkpoint's optimizer state laid out like `params` (FSDP shards; entries by index into `params`)."""
    if not state:
        return state
    return {
        "state": {
            i: {key: _like(value, params[int(i)]) for key, value in entry.items()}
            for i, entry in state["state"].items()
        },
        "param_groups": state["param_groups"],
    }


def _whole(tensor: Any) -> Any:
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor.full_tensor()
    return tensor.detach().cpu().clone() if hasattr(tensor, "detach") else tensor


def _like(value: Any, param: Any) -> Any:
    """`value` placed as `param` is: on its device, and sharded the same way where it has the parameter's shape."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not hasattr(value, "shape") or tuple(value.shape) != tuple(param.shape):
        return value  # an optimizer's step count
    if isinstance(param, DTensor):
        return distribute_tensor(value.to(param.device, param.dtype), param.device_mesh, param.placements)
    return value.to(param.device, param.dtype)
