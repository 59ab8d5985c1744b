"""One trainer process of the group a server starts for a model (trainer_processes.py says how it is driven).

It joins the torch.distributed group, loads the base model with the LoRA on its device, wraps it for DDP or
shards it with FSDP2, and then trains one step per request: the request carries the served step's LoRA weights
and optimizer state, so a process holds no state of its own between steps and a restarted one needs nothing
but the model. The token store is read from the model's folder, which every process sees. Rank 0 reports
progress and answers with the new weights and optimizer state, whole; a failure is answered, not raised.

Run as `python -m art_agents.server.training.trainer_worker FD RANK`, FD being this end of a socket pair.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from art_agents.server.training.step_work import StepWork
from art_agents.train_config import ModelConfig


@dataclass(frozen=True)
class WorkerSetup:
    """What every process of the group is told when it starts."""

    base_model: str
    config: ModelConfig
    model_dir: str
    master_port: int
    parent_pid: int


@dataclass(frozen=True)
class StepRequest:
    work: StepWork
    weights: dict[str, Any]  # the served step's trainable weights, by parameter name
    optimizer_state: dict | None  # the served step's checkpointed AdamW state


def send(conn: Connection, message: Any) -> None:
    """Plain pickle: `Connection.send` would hand torch tensors over as shared memory, which needs the sender to be
    a multiprocessing parent."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def main(fd: int, rank: int) -> None:
    conn = Connection(fd)
    setup: WorkerSetup = receive(conn)
    from art_agents.server.processes import exit_with_parent

    exit_with_parent(setup.parent_pid)  # no orphan holds a GPU after the server is killed
    try:
        trainer_of = _join(setup, rank)
    except Exception:
        send(conn, ("error", traceback.format_exc()))
        return
    send(conn, ("ready",))
    while (request := receive(conn)) is not None:
        send(conn, _step(trainer_of, request, rank, conn))


def _join(setup: WorkerSetup, rank: int) -> Any:
    """Join the group and load the model; returns a function giving a trainer for a step's optimizer state."""
    import torch
    import torch.distributed as dist

    from art_agents.server.lora_model import load_peft_model, trainer_devices
    from art_agents.server.storage.token_store import TokenStore
    from art_agents.server.training.ranks import Ranks, sharded_optimizer_state
    from art_agents.server.training.trainer import PolicyTrainer

    config = setup.config
    world = config.trainer_processes
    device = trainer_devices(config)[rank]
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(
        "nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{setup.master_port}", rank=rank, world_size=world
    )
    model, tokenizer = load_peft_model(setup.base_model, config.model_copy(update={"device": device}))
    sharding = config.trainer_sharding if world > 1 else None  # one rank has nothing to synchronise
    module = _distribute(model, sharding, device) if sharding else None
    ranks = Ranks(rank, world, sharding, module, device)
    store = TokenStore(Path(setup.model_dir) / "tokens" / "store.sqlite")
    params = [p for p in model.parameters() if p.requires_grad]

    def trainer_of(request: StepRequest) -> tuple[Any, Any]:
        from art_agents.server.training.ranks import set_trainable_weights

        set_trainable_weights(model, request.weights)
        state = sharded_optimizer_state(request.optimizer_state, params)
        return model, PolicyTrainer(model, tokenizer, store, state, ranks)

    return trainer_of


def _distribute(model: Any, sharding: str, device: str) -> Any:
    """The module forward passes go through: DDP's wrapper, or the model sharded in place by FSDP2 (each decoder
    layer a unit of its own, so one layer's weights are gathered at a time)."""
    if sharding == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # every rank loaded the same weights and each step sets the LoRA: nothing to broadcast at start
        return DistributedDataParallel(
            model, device_ids=[device] if device.startswith("cuda") else None, init_sync=False
        )
    from torch.distributed.fsdp import fully_shard

    layers = set(getattr(model.base_model.model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in layers:
            fully_shard(module)
    fully_shard(model)
    return model


def _step(trainer_of: Any, request: StepRequest, rank: int, conn: Connection) -> tuple:
    from art_agents.server.training.ranks import trainable_weights, whole_optimizer_state
    from art_agents.server.training.sequences import TrainingInputError

    def progress(done: int, total: int, metrics: dict[str, float]) -> None:
        send(conn, ("progress", done, total, metrics))

    try:
        model, trainer = trainer_of(request)
        metrics = trainer.run(request.work, progress if rank == 0 else None)
        weights, state = trainable_weights(model), whole_optimizer_state(trainer.optimizer_state())
        return ("done", metrics, weights, state) if rank == 0 else ("done", metrics, None, None)
    except TrainingInputError as exc:
        return ("input_error", str(exc))
    except Exception:
        return ("error", traceback.format_exc())


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
