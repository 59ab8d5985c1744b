"""`art-agents trainer-node`: the trainer ranks of one more node (torchrun's `--node-rank`) for a server whose
model trains with `trainer_nodes` > 1.

It connects to the store the server hosts (group_store.py) and waits there for a generation; for each it starts
this node's ranks (trainer_worker.py, rank = node x processes per node + local rank, as torchrun numbers them),
tells the store how any of them died, and stops what is left of them when the server gives the generation up or
forms the next. It beats every BEAT_S on a connection of its own, so the server can tell a lost node from a slow
one. It outlives steps, failed steps and server restarts (it connects again); stop it with Ctrl-C or SIGTERM, or
give it `wait_s` to exit when the store does not answer for that long. While it waits it says so once, and again
every REPORT_S with what a plain socket finds there; torch's C++ log, which prints a stack of frames for every
failed try, is silenced in this process (its ranks keep the user's setting).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from types import FrameType

from art_agents.server.host.processes import how_it_ended
from art_agents.server.training.group_store import BEAT_S, GroupStore, split_address
from art_agents.server.training.trainer_processes import STOP_WAIT_S, WORKER

log = logging.getLogger("art_agents.trainer_node")

POLL_S = 0.2
RECONNECT_S = 5.0
CONNECT_TRY_S = 2.0
REPORT_S = 60.0  # while the store does not answer: a line this often, not one per try
CPP_LOG_ENV = "TORCH_CPP_LOG_LEVEL"  # read once, when torch loads


class StoreUnreachable(RuntimeError):
    """No store answered at the rendezvous address within the node's `wait_s`."""


def check_arguments(address: str, node: int, wait_s: float | None) -> None:
    """Refuse bad arguments before torch loads, in one line each (ValueError)."""
    split_address(address)
    if node < 1:
        raise ValueError("--node-rank 0 is the server's own node; the other nodes are 1, 2, ...")
    if wait_s is not None and wait_s <= 0:
        raise ValueError(f"--wait-s must be more than 0 seconds (leave it out to wait until stopped), not {wait_s:g}")


def run_trainer_node(address: str, node: int, wait_s: float | None = None) -> None:
    """Serve as node `node` of the group meeting at `address` until stopped, or until the store has not answered
    for `wait_s` seconds (StoreUnreachable; None: wait for ever)."""
    check_arguments(address, node, wait_s)
    ranks_env = _quiet_torch()
    from torch.distributed import DistError

    signal.signal(signal.SIGTERM, _stop_on_signal)  # SIGTERM stops this node's ranks as Ctrl-C does
    limit = f"gives up after {wait_s:g} s, " if wait_s is not None else ""
    while True:
        log.info("node %d: waiting for the server's store at %s (%sCtrl-C stops)", node, address, limit)
        ranks = _NodeRanks(address, node, wait_s, ranks_env)
        try:
            ranks.serve()
        except DistError as exc:
            log.warning("node %d: lost the server's store (%s); connecting again", node, _first_line(exc))
            time.sleep(RECONNECT_S)
        finally:
            ranks.stop()


def _quiet_torch() -> dict[str, str]:
    """Silence c10d's C++ log in this process, whose every failed try to reach the store prints a stack of frames
    (a node may wait hours); returns the environment for this node's ranks, which keep the user's setting."""
    ranks_env = dict(os.environ)
    os.environ.setdefault(CPP_LOG_ENV, "FATAL")  # before torch loads: it is read once, then
    logging.getLogger("torch.distributed").setLevel(logging.ERROR)
    return ranks_env


class _NodeRanks:
    """This node's ranks of the newest generation, over one connection to the store."""

    def __init__(self, address: str, node: int, wait_s: float | None, ranks_env: dict[str, str]) -> None:
        self._address, self._node, self._env = address, node, ranks_env
        self._store = _connect(address, node, wait_s)
        self._group: GroupStore | None = None
        self._ranks: dict[int, subprocess.Popen] = {}
        beats = _connect(address, node, wait_s)
        threading.Thread(target=_beat, args=(beats, node), name="art-node-beat", daemon=True).start()

    def serve(self) -> None:
        log.info("node %d: connected to %s", self._node, self._address)
        while True:
            latest = self._store.latest()
            if latest and (self._group is None or latest > self._group.generation):
                self.stop()
                self._group = GroupStore(self._store.store, latest)
                if not self._group.is_over():
                    self._start(self._group)
            elif self._group is not None and self._ranks and self._group.is_over():
                self.stop()
            self._report_deaths()
            time.sleep(POLL_S)

    def _start(self, group: GroupStore) -> None:
        config = group.setup().config
        if self._node >= config.trainer_nodes:
            log.warning("node %d: the model trains on %d nodes; this one waits", self._node, config.trainer_nodes)
            return
        per_node = config.trainer_processes
        for rank in range(self._node * per_node, (self._node + 1) * per_node):
            command = [sys.executable, "-P", "-m", WORKER, self._address, str(group.generation), str(rank)]
            self._ranks[rank] = subprocess.Popen(command, env=self._env)
        pids = [p.pid for p in self._ranks.values()]
        log.info("node %d: generation %d, ranks %s (pids %s)", self._node, group.generation, list(self._ranks), pids)

    def _report_deaths(self) -> None:
        for rank, process in list(self._ranks.items()):
            code = process.poll()
            if code is None:
                continue
            del self._ranks[rank]
            if code != 0 and self._group is not None:
                how = how_it_ended(code)
                self._group.fail(rank, ("died", f"(pid {process.pid} on {socket.gethostname()}) died ({how})"))

    def stop(self) -> None:
        ranks, self._ranks = list(self._ranks.values()), {}
        for process in ranks:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + STOP_WAIT_S
        for process in ranks:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _connect(address: str, node: int, wait_s: float | None) -> GroupStore:
    """A connection to the server's store, tried every CONNECT_TRY_S (short tries, so that Ctrl-C and SIGTERM are
    heard between them: torch's own retries run where Python cannot take a signal) until `wait_s` has passed."""
    from torch.distributed import DistError

    started = reported = time.monotonic()
    since = time.strftime("%H:%M:%S")
    while True:
        left = CONNECT_TRY_S if wait_s is None else wait_s - (time.monotonic() - started)
        try:
            return GroupStore.connect(address, timeout_s=max(0.1, min(CONNECT_TRY_S, left)))
        except DistError:
            pass
        if time.monotonic() - reported >= REPORT_S:
            reported = time.monotonic()
            log.info("node %d: still waiting for %s, since %s (%s)", node, address, since, _found_at(address))
        if wait_s is not None and time.monotonic() - started >= wait_s:
            raise StoreUnreachable(
                f"node {node}: no store answered at {address} for {wait_s:g} s ({_found_at(address)}); is the "
                "server up, serving a model with trainer_nodes > 1 and that trainer_rendezvous?"
            )


def _found_at(address: str) -> str:
    """What a plain socket finds at `address`, for the waiting lines."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TRY_S):
            return "its port accepts connections: the store may be starting"
    except socket.gaierror:
        return f"{host} does not resolve"
    except ConnectionRefusedError:
        return f"nothing listens on port {port} of {host}"
    except OSError as exc:
        return f"{host}:{port} does not answer ({exc.strerror or type(exc).__name__})"


def _beat(group: GroupStore, node: int) -> None:
    """Raise the node's heartbeat until the connection breaks (the node then connects again, with a new one)."""
    from torch.distributed import DistError

    try:
        while True:
            group.beat(node)
            time.sleep(BEAT_S)
    except DistError:
        return


def _stop_on_signal(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
