"""Where the ranks of a model's trainer group meet: torch.distributed's own TCPStore, hosted by the server for as
long as it serves the model, at 127.0.0.1 (one machine) or at `ModelConfig.trainer_rendezvous` (several nodes).

The store is torch's c10d rendezvous with `torchrun`'s static semantics (a fixed number of nodes, a node rank
each, rank = node rank x processes per node + local rank), so nothing here is a protocol of our own beyond the
key names below. The server owning it means the store outlives every group: a failed step ends a generation
and the next step forms the next one on the same address, where the nodes' `trainer-node` commands wait.

Keys (a generation is one formed group; torch's own `init_process_group` keys live under `g{G}/pg/`):
  generation               the newest generation's number
  g{G}/setup               the pickled setup every rank starts from
  g{G}/go/{n}              "step" or "stop": rank 0 got step n from the server and broadcasts its work
  g{G}/refused/{n}/{rank}  a rank on another node refused step n's input (the group lives on)
  g{G}/failed/{rank}       how a rank on another node failed (its traceback, from the rank itself) or died (from
                           its node's trainer-node, unless the rank said first): either ends the generation
  g{G}/over                the server gave this generation up: nodes stop what is left of its ranks
  failures                 a counter: a failing rank takes a number, and the first number is the cause
  node/{k}/beat            raised every BEAT_S by node k's trainer-node command while it lives
"""

from __future__ import annotations

import pickle
from datetime import timedelta
from typing import Any

BEAT_S = 0.5
CONNECT_TIMEOUT_S = 60.0


def host_store(address: str) -> Any:
    """The store the server hosts at HOST:PORT (it listens on every interface at PORT)."""
    from torch.distributed import TCPStore

    host, port = split_address(address)
    return TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=CONNECT_TIMEOUT_S))


def split_address(address: str) -> tuple[str, int]:
    """HOST and PORT of `address`, checked here: torch takes a port out of range with a traceback of its own."""
    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:29400
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"a rendezvous address is HOST:PORT with PORT 1-65535, not {address!r}")
    return host, int(port)


class GroupStore:
    """One generation's view of the store, for the server, a rank and a node's trainer-node command alike."""

    def __init__(self, store: Any, generation: int) -> None:
        self.store = store
        self.generation = generation

    @classmethod
    def connect(cls, address: str, generation: int = 0, timeout_s: float = CONNECT_TIMEOUT_S) -> GroupStore:
        from torch.distributed import TCPStore

        host, port = split_address(address)
        store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
        return cls(store, generation)

    def _key(self, name: str) -> str:
        return f"g{self.generation}/{name}"

    # the server
    def publish(self, setup: Any) -> GroupStore:
        """The next generation, with `setup` written before its number is, so whoever sees the number finds it."""
        nxt = GroupStore(self.store, self.latest() + 1)
        nxt.store.set(nxt._key("setup"), pickle.dumps(setup))
        self.store.set("generation", str(nxt.generation))
        return nxt

    def give_up(self) -> None:
        self.store.set(self._key("over"), b"1")

    def refusals(self, step: int, ranks: list[int]) -> dict[int, tuple]:
        return self._read({rank: self._key(f"refused/{step}/{rank}") for rank in ranks})

    def failures(self, ranks: list[int]) -> dict[int, tuple]:
        return self._read({rank: self._key(f"failed/{rank}") for rank in ranks})

    def _read(self, keys: dict[int, str]) -> dict[int, tuple]:
        return {rank: pickle.loads(self.store.get(key)) for rank, key in keys.items() if self.store.check([key])}

    def beats(self, node: int) -> int:
        return self.store.add(f"node/{node}/beat", 0)

    # every rank
    def setup(self) -> Any:
        return pickle.loads(self.store.get(self._key("setup")))

    def process_group_store(self) -> Any:
        from torch.distributed import PrefixStore

        return PrefixStore(self._key("pg"), self.store)

    def go(self, step: int, what: str) -> None:
        self.store.set(self._key(f"go/{step}"), what)

    def wait_go(self, step: int) -> str:
        """Waits as long as the server takes to send the next step (no collective waits that long)."""
        from torch.distributed import DistStoreError

        key = self._key(f"go/{step}")
        while True:
            try:
                self.store.wait([key], timedelta(seconds=60))
                return self.store.get(key).decode()
            except DistStoreError as exc:
                if "timeout" not in str(exc):
                    raise

    def refuse(self, step: int, rank: int, message: tuple) -> None:
        self.store.set(self._key(f"refused/{step}/{rank}"), pickle.dumps(message))

    def fail(self, rank: int, message: tuple) -> None:
        """The first word on how `rank` failed stands (its own traceback, not its node's later "died")."""
        self.store.compare_set(self._key(f"failed/{rank}"), "", pickle.dumps(message))

    def failure_number(self) -> int:
        return self.store.add("failures", 1)

    # a node's trainer-node command
    def latest(self) -> int:
        return int(self.store.get("generation")) if self.store.check(["generation"]) else 0

    def is_over(self) -> bool:
        return self.store.check([self._key("over")])

    def beat(self, node: int) -> None:
        self.store.add(f"node/{node}/beat", 1)
