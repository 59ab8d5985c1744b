"""The part every networked reporter shares: steps go out from a thread of its own, so training never waits on a
service that is slow or down.

`record` only queues the step (past `MAX_PENDING_RECORDS` waiting, a step is dropped with a warning) and returns;
the thread sends the steps in order, one at a time (`_send`); every kind of failure is one warning, never an
exception in the caller.
"""

from __future__ import annotations

import queue
import threading
import warnings

from art_agents.report.reporters import StepRecord

MAX_PENDING_RECORDS = 4


class QueuedReporter:
    service = "reporter"  # the service's name, which leads every warning
    warning: type[Warning] = RuntimeWarning
    items = "records"  # what a step becomes there (traces, completions), for the warnings

    def __init__(self, model_name: str, target: str) -> None:
        self.model_name = model_name
        self._target = target  # where steps go, for the warnings
        self._pending: queue.Queue[StepRecord] = queue.Queue(MAX_PENDING_RECORDS)
        self._worker: threading.Thread | None = None
        self._warned: set[str] = set()

    def record(self, record: StepRecord) -> None:
        """Hand the step to the sending thread and return at once; never raises."""
        if self._worker is None or not self._worker.is_alive():
            name = f"{self.service.lower()}-{self.model_name}"
            self._worker = threading.Thread(target=self._work, name=name, daemon=True)
            self._worker.start()
        try:
            self._pending.put_nowait(record)
        except queue.Full:
            self._warn(
                "behind",
                f"{self._target} is not keeping up (is it up?): {MAX_PENDING_RECORDS} steps wait already, so the "
                f"{self.items} of {record.split} step {record.step} (and later ones, while it lasts) are dropped",
            )

    def _drained(self, timeout_s: float) -> bool:
        """Whether every queued step was sent within `timeout_s`; what is left goes on in the background."""
        if self._worker is None:
            return True
        draining = threading.Thread(target=self._pending.join, name=f"{self.service.lower()}-drain", daemon=True)
        draining.start()
        draining.join(timeout_s)
        return not draining.is_alive()

    def _work(self) -> None:
        while True:
            record = self._pending.get()
            try:
                self._send(record)
            except Exception as exc:
                self._warn(f"send:{type(exc).__name__}", f"could not send {record.split} step {record.step}", exc)
            finally:
                self._pending.task_done()

    def _send(self, record: StepRecord) -> None:
        raise NotImplementedError

    def _warn(self, kind: str, message: str, exc: BaseException | None = None) -> None:
        """One warning per kind of failure: a service that is down warns once, not once per step."""
        if kind in self._warned:
            return
        self._warned.add(kind)
        detail = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
        warnings.warn(
            self._redacted(f"{self.service}: {message}{detail}; training goes on"), self.warning, stacklevel=3
        )

    def _redacted(self, text: str) -> str:
        return text
