"""What the server knows of a trainer group's ranks on other nodes while it waits for a step: it has no socket to
them, so it reads the store (group_store.py) every POLL_S for a rank's failure, a rank's death (reported by its
node's trainer-node command) and each node's heartbeat. A node whose heartbeat stops for BEAT_LOST_S is taken for
dead, whatever its TCP connections say, so a lost node fails the step in seconds rather than after the
collective timeout.
"""

from __future__ import annotations

import time

from art_agents.server.training.group_store import BEAT_S, GroupStore
from art_agents.train_config import ModelConfig

BEAT_LOST_S = 6 * BEAT_S
CAUSE_WAIT_S = BEAT_LOST_S + 1.0  # after a local rank failed, how long a node gets to explain it


def rank_name(config: ModelConfig, rank: int) -> str:
    if config.trainer_nodes == 1:
        return f"process rank {rank}"
    return f"node {rank // config.trainer_processes} rank {rank}"


class NodeWatch:
    POLL_S = 0.5

    def __init__(self, group: GroupStore, config: ModelConfig, address: str, step: int, *, joining: bool) -> None:
        self._group, self._config, self._address, self._step, self._joining = group, config, address, step, joining
        self.nodes = list(range(1, config.trainer_nodes))
        self._remote = list(range(config.trainer_processes, config.trainer_processes * config.trainer_nodes))
        now = time.monotonic()
        self._beats = {node: (group.beats(node), now) for node in self.nodes}
        self.failures: dict[int, tuple] = {}

    def check(self) -> str | None:
        """Records the other nodes' failed ranks; returns what was lost: a dead rank, or (once the group is formed)
        a node whose heartbeat stopped."""
        if not self.nodes:
            return None
        self.failures.update(self._group.refusals(self._step, [r for r in self._remote if r not in self.failures]))
        failed = self._group.failures(self._remote)
        if died := {rank: failure[1] for rank, failure in failed.items() if failure[0] == "died"}:
            rank = min(died)
            return f"trainer {rank_name(self._config, rank)} {died[rank]}"
        self.failures.update(failed)  # a failure of this generation, at this step or before (joining, say)
        stopped = self._stopped()
        if stopped and not self._joining:
            node = stopped[0]
            return (
                f"trainer node {node} (ranks {', '.join(map(str, self._ranks_of(node)))}) stopped beating for "
                f"{BEAT_LOST_S:.0f} s: the node, or its `art-agents trainer-node`, died"
            )
        return None

    def explain(self) -> str | None:
        """After a rank on the server's node failed: what was lost on another node, if that is why (a rank there
        that failed on its own is left in `failures`, to be ordered with the rest)."""
        deadline = time.monotonic() + (CAUSE_WAIT_S if self.nodes else 0.0)
        while time.monotonic() < deadline:
            if lost := self.check():
                return lost
            if self.failures:
                return None
            time.sleep(self.POLL_S)
        return None

    def missing(self) -> str:
        """While joining: the nodes that never beat, and how to start them."""
        if not self._joining or not (stopped := self._stopped()):
            return ""
        return "; " + ", ".join(
            f"node {node} did not join (is `art-agents trainer-node --rendezvous {self._address} --node-rank {node}` "
            "running there?)"
            for node in stopped
        )

    def _stopped(self) -> list[int]:
        now = time.monotonic()
        stopped = []
        for node, (count, since) in self._beats.items():
            latest = self._group.beats(node)
            if latest != count:
                self._beats[node] = (latest, now)
            elif now - since >= BEAT_LOST_S:
                stopped.append(node)
        return stopped

    def _ranks_of(self, node: int) -> range:
        per_node = self._config.trainer_processes
        return range(node * per_node, (node + 1) * per_node)
