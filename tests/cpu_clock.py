"""CPU seconds, for tests that check a command did no heavy work: unlike wall time, another job's load
on the machine barely changes them, so a bound on them fails on what the program does, never on a busy machine."""

from __future__ import annotations

import resource
import subprocess
from typing import Any


def children_cpu_s() -> float:
    """User and system seconds of this process's finished and waited-for children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_counting_cpu(argv: list[str], **options: Any) -> tuple[subprocess.CompletedProcess[str], float]:
    """`subprocess.run(argv, capture_output=True, text=True, **options)` and the CPU seconds it spent."""
    before = children_cpu_s()
    result = subprocess.run(argv, capture_output=True, text=True, **options)
    return result, children_cpu_s() - before


# A command that refuses its input before loading anything spends about 0.4 s of CPU (Python, typer, pydantic);
# importing torch and transformers takes 2 s, LiteLLM 4 s (2 cores, 2026). Above this, it did work it should not.
REFUSED_AT_ONCE_CPU_S = 1.5
