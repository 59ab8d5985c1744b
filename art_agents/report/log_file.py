"""A command's log file: its warnings and an error's traceback, so the terminal shows one line.

It lives under the temp folder, never in a run folder, which an error must leave as it was; it is
created only when something is written to it.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import traceback
from pathlib import Path


class CommandLog:
    """While open, every log record of WARNING and up (and Python warnings) goes to `path`, not stderr."""

    def __init__(self) -> None:
        folder = Path(tempfile.gettempdir()) / "art-agents"
        self.path = folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        self._handler: logging.FileHandler | None = None

    def __enter__(self) -> CommandLog:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handler = logging.FileHandler(self.path, delay=True, encoding="utf-8")
        self._handler.setLevel(logging.WARNING)
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(self._handler)
        logging.captureWarnings(True)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.captureWarnings(False)
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
            self._handler.close()

    @property
    def written(self) -> bool:
        return self.path.exists()

    def error_line(self, exc: BaseException) -> str:
        """The error's first line; when there is more to it (more lines, a cause, notes, earlier warnings),
        the whole traceback goes to this log and the line points to it."""
        text = str(exc) or type(exc).__name__
        if "\n" not in text and exc.__cause__ is None and not getattr(exc, "__notes__", None) and not self.written:
            return text
        with self.path.open("a", encoding="utf-8") as log:
            log.write("".join(traceback.format_exception(exc)))
        return f"{text.splitlines()[0]} (details: {self.path})"
