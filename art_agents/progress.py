"""The one policy for the library's progress bars, so they never litter a log or the user's prints.

A bar is drawn only where it can be wiped again: on a terminal (or in a Jupyter kernel), and it is
cleared when done (`leave=False`), error or not. Elsewhere (a pipe, a log file, CI) it is not drawn
unless ART_AGENTS_PROGRESS=1 asks for it; ART_AGENTS_PROGRESS=0 turns every bar off.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tqdm import tqdm

ENV = "ART_AGENTS_PROGRESS"
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def progress_wanted() -> bool:
    """Whether bars are drawn: as ART_AGENTS_PROGRESS says, else only when stderr is a terminal or a notebook."""
    setting = os.environ.get(ENV, "").strip().lower()
    if setting in _ON:
        return True
    if setting in _OFF:
        return False
    if setting:
        raise ValueError(f"{ENV}={setting!r} is not understood; set it to 1 (draw progress bars) or 0 (never)")
    stream = sys.stderr
    in_notebook = type(stream).__module__.startswith("ipykernel")
    return in_notebook or bool(callable(getattr(stream, "isatty", None)) and stream.isatty())


def progress_bar(desc: str, *, unit: str, total: int | None = None, show: bool = True, **options: Any) -> tqdm:
    """A transient text bar on stderr; a disabled one (drawing nothing) where `show` is False or the policy says no."""
    from tqdm import tqdm  # text bars: tqdm.auto widgets show blank or stuck at 0% in stored notebooks

    return tqdm(desc=desc, total=total, unit=unit, leave=False, disable=not (show and progress_wanted()), **options)
