"""One trainer process of the group a server forms for a model (trainer_processes.py says how it is driven).

It joins the torch.distributed group through the server's store (group_store.py), loads the base model with the
LoRA on its device, wraps it for DDP or shards it with FSDP2, and then trains one step per request: the request
carries the served step's LoRA weights and optimizer state, so a process holds no state of its own between steps
and a restarted one needs nothing but the model. The token store is read from the model's folder, which every
process sees. Rank 0 reports progress and answers with the new weights and optimizer state, whole; a failure is
answered, not raised.

Only rank 0 hears from the server: it gets each step over its socket pair, says "step" under the step's key in
the store and broadcasts the work over the group. The other ranks, on this node or another, wait on that key
(a step may come hours after the last, longer than any collective may wait) and then take the broadcast. So a
rank on another node needs no connection to the server but the store, and the work travels once per rank over
the group's own transport (nccl between GPUs), not once per rank out of the server. A rank answers over its
socket pair when it has one (on the server's node: the server sees it die), else under its answer key.

Run as `python -m art_agents.server.training.trainer_worker STORE GENERATION RANK [FD]`, STORE being the server's
store (HOST:PORT) and FD this end of a socket pair to the server.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from art_agents.server.training.step_work import StepWork
from art_agents.train_config import ModelConfig

if TYPE_CHECKING:
    from art_agents.server.training.group_store import GroupStore


@dataclass(frozen=True)
class WorkerSetup:
    """What every process of the group is told when it starts."""

    base_model: str
    config: ModelConfig
    model_dir: str

    @property
    def world(self) -> int:
        return self.config.trainer_processes * self.config.trainer_nodes


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


def main(address: str, generation: int, rank: int, fd: int | None) -> None:
    from art_agents.server.host.processes import exit_with_parent
    from art_agents.server.training.group_store import GroupStore

    conn = Connection(fd) if fd is not None else None
    group = GroupStore.connect(address, generation)
    setup: WorkerSetup = group.setup()
    exit_with_parent(os.getppid())  # the server or a node's trainer-node: no orphan holds a GPU after it is killed

    def answer(step: int, message: tuple) -> None:
        if conn is not None:
            send(conn, message)
        elif message[0] == "error":  # the server waits for the ranks on its node; of the others, it reads failures
            group.fail(rank, message)
        elif message[0] == "input_error":
            group.refuse(step, rank, message)

    try:
        trainer_of = _join(setup, rank, group)
    except Exception:
        answer(0, ("error", traceback.format_exc(), group.failure_number()))
        return
    answer(0, ("ready",))
    step = 1
    while (request := _next_request(setup.world, rank, conn, group, step)) is not None:
        answer(step, _step(trainer_of, request, rank, conn, group))
        step += 1


def _next_request(world: int, rank: int, conn: Connection | None, group: GroupStore, step: int) -> StepRequest | None:
    """Step `step`'s request (None: stop), from the server for rank 0 and from rank 0 for the others."""
    request = None
    if conn is not None and rank == 0:
        request = receive(conn)
        group.go(step, "stop" if request is None else "step")
        if request is None:
            return None
    elif group.wait_go(step) == "stop":
        return None
    if world > 1:
        import torch.distributed as dist

        shared = [request]
        dist.broadcast_object_list(shared, src=0)
        request = shared[0]
    return request


def _join(setup: WorkerSetup, rank: int, group: GroupStore) -> Any:
    """Join the group and load the model; returns a function giving a trainer for a step's optimizer state."""
    import torch
    import torch.distributed as dist

    from art_agents.server.models.lora_model import load_peft_model, trainer_devices
    from art_agents.server.storage.token_store import TokenStore
    from art_agents.server.training.ranks import Ranks, sharded_optimizer_state
    from art_agents.server.training.trainer import PolicyTrainer

    config = setup.config
    world = setup.world
    device = trainer_devices(config)[rank % config.trainer_processes]  # the node's own devices
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.trainer_processes))
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        store=group.process_group_store(),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=config.trainer_timeout_s),
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


def _step(trainer_of: Any, request: StepRequest, rank: int, conn: Connection | None, group: GroupStore) -> tuple:
    from art_agents.server.training.ranks import trainable_weights, whole_optimizer_state
    from art_agents.server.training.sequences import TrainingInputError

    def progress(done: int, total: int, metrics: dict[str, float]) -> None:
        send(conn, ("progress", done, total, metrics))  # type: ignore[arg-type]

    try:
        model, trainer = trainer_of(request)
        metrics = trainer.run(request.work, progress if rank == 0 else None)
        weights, state = trainable_weights(model), whole_optimizer_state(trainer.optimizer_state())
        return ("done", metrics, weights, state) if rank == 0 else ("done", metrics, None, None)
    except TrainingInputError as exc:
        return ("input_error", str(exc))
    except Exception:
        return ("error", traceback.format_exc(), group.failure_number())


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else None)
