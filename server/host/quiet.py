"""transformers' noise kept out of a command's output for one block: progress bars for loading or writing a
few shards, and the FutureWarnings PEFT and transformers raise about each other's deprecated names (nothing a
user of the command can act on). Both are restored after the block; nothing else is silenced."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_transformers() -> Iterator[None]:
    from transformers.utils import logging as transformers_logging

    shown = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        if shown:
            transformers_logging.enable_progress_bar()
