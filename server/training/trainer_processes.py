"""The trainer processes of one served model (`ModelConfig.trainer_processes`): started by the server at the
first step, driven over a socket pair each, and stopped with the model; with `trainer_nodes` > 1, joined by as
many on each other node, started there by `art-agents trainer-node` (trainer_node.py).

The server keeps its one HTTP face and its own copy of the LoRA (what checkpoints are written from and a failed
step rolls back to). Each step it hands rank 0 the served weights and optimizer state, rank 0 shares them with
the group (trainer_worker.py), and the server takes rank 0's answer back into its policy. The group meets in a
store the server hosts (group_store.py), so every step of every generation uses one address. A process that
dies, a node that stops beating, or a step that fails on some ranks and leaves the others waiting in a
collective stops the whole group with an error naming the node and rank; the step fails, the last checkpoint
keeps serving, and the next step forms a new group (a new generation) with whatever nodes wait for it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, NoReturn

from art_agents.backends.ports import free_port
from art_agents.server.host.processes import how_it_ended
from art_agents.server.training.group_store import GroupStore, host_store
from art_agents.server.training.node_watch import NodeWatch, rank_name
from art_agents.server.training.policy_model import PolicyModel
from art_agents.server.training.ranks import set_trainable_weights, trainable_weights
from art_agents.server.training.sequences import TrainingInputError
from art_agents.server.training.step_work import Progress, StepWork
from art_agents.server.training.trainer_worker import StepRequest, WorkerSetup, receive, send
from art_agents.train_config import ModelConfig

log = logging.getLogger("art_agents.server")

RENDEZVOUS_ENV = "ART_TRAINER_RENDEZVOUS"  # the server's default trainer_rendezvous (a launcher knows the address)
ERROR_GRACE_S = 30.0  # after one rank fails, how long the others get to answer before the group is stopped
STOP_WAIT_S = 10.0
WORKER = "art_agents.server.training.trainer_worker"


class TrainerProcessFailed(RuntimeError):
    """A trainer process died or failed mid-step; the group was stopped and restarts at the next step."""


@dataclass
class _Rank:
    process: subprocess.Popen
    conn: Connection


class TrainerProcesses:
    def __init__(self, base_model: str, config: ModelConfig, model_dir: Path) -> None:
        """Across nodes, the store opens here, when the model is served, so the nodes can join before any step;
        on one node, at the first step."""
        self._setup = WorkerSetup(base_model, config, str(model_dir))
        self._address = rendezvous_of(config)
        self._hosted: Any = None  # the store, hosted until close()
        if config.trainer_nodes > 1 and self._address:
            self._hosted = _host(self._address)
        self._group: GroupStore | None = None
        self._ranks: list[_Rank] = []
        self._step = 0

    @property
    def pids(self) -> list[int]:
        return [rank.process.pid for rank in self._ranks]

    def train(
        self, work: StepWork, weights: dict[str, Any], optimizer_state: dict | None, progress: Progress | None
    ) -> tuple[dict[str, float], dict[str, Any], dict]:
        """One step on every process; returns rank 0's metrics, new trainable weights and optimizer state."""
        if not self._ranks:
            self._start()
        self._step += 1
        try:
            send(self._ranks[0].conn, StepRequest(work, weights, optimizer_state))
        except OSError:
            self._fail(self._death(0))
        _, metrics, new_weights, state = self._answers("done", progress)[0]
        return metrics, new_weights, state

    def stop(self, *, graceful: bool = True) -> None:
        """Stop every process (asking rank 0 to stop the group first when `graceful`); the next step forms a new
        group."""
        ranks, self._ranks = self._ranks, []
        if graceful and ranks and ranks[0].process.poll() is None:
            with contextlib.suppress(OSError):
                send(ranks[0].conn, None)
        deadline = time.monotonic() + (STOP_WAIT_S if graceful else 0.0)
        for rank in ranks:
            try:
                rank.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                rank.process.kill()
                rank.process.wait()
            rank.conn.close()
        if self._group is not None:
            self._group.give_up()  # the other nodes stop what is left of this generation's ranks
            self._group = None

    def close(self) -> None:
        """Stop every process and close the store: the model is no longer served."""
        self.stop()
        self._hosted = None  # torch closes its listening socket with the last reference

    def _start(self) -> None:
        config = self._setup.config
        if not self._address:
            raise TrainerProcessFailed(
                f"trainer_nodes={config.trainer_nodes} needs a rendezvous address the other nodes reach the server at: "
                f"set ModelConfig.trainer_rendezvous or the server's {RENDEZVOUS_ENV} (HOST:PORT)"
            )
        if self._hosted is None:
            self._hosted = _host(self._address)
        self._group = GroupStore(self._hosted, 0).publish(self._setup)
        self._step = 0
        for rank in range(config.trainer_processes):
            ours, theirs = socket.socketpair()
            # -P: the working folder stays off the path (a checkout's art_agents/ would shadow the installed package)
            command = [sys.executable, "-P", "-m", WORKER, self._address, str(self._group.generation), str(rank)]
            process = subprocess.Popen([*command, str(theirs.fileno())], pass_fds=[theirs.fileno()])
            theirs.close()
            self._ranks.append(_Rank(process, Connection(ours.detach())))
        log.info(
            "started %d trainer processes (%s): pids %s; %d nodes meet at %s",
            len(self._ranks),
            config.trainer_sharding,
            self.pids,
            config.trainer_nodes,
            self._address,
        )
        self._answers("ready", None)

    def _answers(self, ok: str, progress: Progress | None) -> list[tuple]:
        """Every local rank's answer, each `ok` (progress from rank 0 passed on), while the other nodes are
        watched; a death or a failure stops the group and raises."""
        assert self._group is not None
        watch = NodeWatch(self._group, self._setup.config, self._address, self._step, joining=ok == "ready")
        pending = {rank.conn: r for r, rank in enumerate(self._ranks)}
        answers: dict[int, tuple] = {}
        deadline: float | None = None
        while pending:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            if watch.nodes:
                timeout = min(timeout if timeout is not None else NodeWatch.POLL_S, NodeWatch.POLL_S)
            for conn in wait(list(pending), timeout):
                r = pending[conn]  # type: ignore[index]
                try:
                    answer = receive(conn)  # type: ignore[arg-type]
                except (EOFError, OSError):
                    death = self._death(r)
                    self._fail(self._remote_cause(watch) or death)
                if answer[0] == "progress":
                    if progress is not None:
                        progress(*answer[1:])
                    continue
                answers[r] = answer
                del pending[conn]  # type: ignore[arg-type]
                if answer[0] != ok and deadline is None:
                    deadline = time.monotonic() + ERROR_GRACE_S
            if lost := watch.check():
                self._fail(f"{lost}; {_RESTART}")
            if watch.failures and deadline is None:
                deadline = time.monotonic() + ERROR_GRACE_S
            if deadline is not None and time.monotonic() >= deadline:
                break  # the ranks that failed left the others waiting in a collective
        return self._checked(answers, ok, watch)

    def _checked(self, answers: dict[int, tuple], ok: str, watch: NodeWatch) -> list[tuple]:
        failed = {r: a for r, a in answers.items() if a[0] != ok}
        if not failed and not watch.failures and len(answers) == len(self._ranks):
            return [answers[r] for r in range(len(self._ranks))]
        if lost := watch.explain():  # a rank on another node died: the ranks here only lost it
            self._fail(f"{lost}; {_RESTART}")
        failed.update(watch.failures)
        if len(failed) == self._setup.world and all(a[0] == "input_error" for a in failed.values()):
            raise TrainingInputError(failed[0][1])  # every rank refused the same input: the group is fine
        r, answer = min(failed.items(), key=_first_failure) if failed else (-1, ("error", "no answer"))
        if answer[0] == "input_error":
            self.stop(graceful=False)
            raise TrainingInputError(answer[1])
        self._fail(self._failed(r, answer, watch.missing()))

    def _remote_cause(self, watch: NodeWatch) -> str | None:
        """A rank here that died may only have lost its peer on another node (gloo closes the connection and the
        rank exits): that node's own word on its rank, when it gives one in time."""
        if not watch.nodes:
            return None
        if lost := watch.explain():
            return f"{lost}; {_RESTART}"
        if not watch.failures:
            return None
        return self._failed(*min(watch.failures.items(), key=_first_failure))

    def _failed(self, r: int, answer: tuple, missing: str = "") -> str:
        return f"trainer {rank_name(self._setup.config, r)} failed: {_last_line(answer[1])}{missing}; {_RESTART}"

    def _fail(self, message: str) -> NoReturn:
        """Stop the group (some of it may wait in a collective that never completes) and fail the step."""
        self.stop(graceful=False)
        raise TrainerProcessFailed(message)

    def _death(self, r: int) -> str:
        process = self._ranks[r].process
        try:
            code = process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            code = None
        where = rank_name(self._setup.config, r)
        return f"trainer {where} (pid {process.pid}) died ({how_it_ended(code)}; the server log has its output); {_RESTART}"


class ProcessTrainer:
    """The `StepTrainer` over a model's trainer processes: `run` leaves the new weights in the server's policy."""

    def __init__(self, processes: TrainerProcesses, policy: PolicyModel, optimizer_state: dict | None) -> None:
        self._processes = processes
        self._policy = policy
        self._state = optimizer_state or {}

    def run(self, work: StepWork, progress: Progress | None) -> dict[str, float]:
        weights = trainable_weights(self._policy.model)
        metrics, new_weights, self._state = self._processes.train(work, weights, self._state or None, progress)
        set_trainable_weights(self._policy.model, new_weights)
        return metrics

    def optimizer_state(self) -> dict:
        return self._state


_RESTART = "the step failed, the last checkpoint keeps serving, and the next step starts new trainer processes"


def _first_failure(item: tuple[int, tuple]) -> tuple[float, int]:
    """The failure the others followed: the first to take a number from the store (input errors take none)."""
    r, answer = item
    return (answer[2] if len(answer) > 2 else float("inf"), r)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


def _host(address: str) -> Any:
    """The store at `address`, or one line on why it cannot listen there (torch's error spans a stack of frames)."""
    from torch.distributed import DistError

    try:
        return host_store(address)
    except DistError as exc:
        cause = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise TrainerProcessFailed(
            f"cannot host the trainer rendezvous at {address}: {cause}; pick a free port for "
            f"ModelConfig.trainer_rendezvous (or the server's {RENDEZVOUS_ENV})"
        ) from exc


def rendezvous_of(config: ModelConfig) -> str | None:
    """Where the group meets: a free loopback port on one node; across nodes the model's trainer_rendezvous, else
    the server's RENDEZVOUS_ENV, else None."""
    if config.trainer_nodes == 1:
        return f"127.0.0.1:{free_port()}"
    return config.trainer_rendezvous or os.environ.get(RENDEZVOUS_ENV) or None
