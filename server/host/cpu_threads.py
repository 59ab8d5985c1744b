"""How the server's CPU threads share the cores: short OpenMP spinning, and a thread count the user can set.

torch's CPU kernels run on an OpenMP team (libgomp on Linux) whose threads, by default, spin for 300,000 pauses at
every barrier before they sleep. A decoding step has hundreds of barriers; when another process (the rollout
client, an MCP server, another job) or the trainer beside the engine holds one of the cores, the team's other
threads spin through each of them: SmolLM2's first batches after `register` took 13.5x as long as with 1,000
pauses, beside two busy processes on 2 cores (`benchmarks/first_requests.py`, docs/benchmarks.md). 1,000 pauses
cross most barriers between running threads and cost a descheduled teammate a futex wake instead of a long spin;
on a quiet machine libgomp's default is about a tenth faster, and no spinning at all a third slower. libgomp reads this once, when torch loads it, so it is set
in the environment when the server package is imported (before any of its torch imports), unless the user chose
how OpenMP waits (`OMP_WAIT_POLICY` or `GOMP_SPINCOUNT`).
"""

from __future__ import annotations

import logging
import os
import sys

THREADS_ENV = "ART_CPU_THREADS"  # `art-agents serve --cpu-threads`, which LocalBackend's server reads too
SPIN_ENV, SPIN_COUNT = "GOMP_SPINCOUNT", "1000"

log = logging.getLogger("art_agents.server")


def spin_briefly() -> None:
    """Ask libgomp to spin briefly at barriers, unless the user chose how OpenMP waits (read when torch loads)."""
    if "OMP_WAIT_POLICY" in os.environ or SPIN_ENV in os.environ:
        return
    os.environ[SPIN_ENV] = SPIN_COUNT
    if "torch" in sys.modules:
        log.info(
            "torch was imported before art_agents.server, so its threads spin long at barriers; on a shared "
            "machine set %s=%s before starting Python",
            SPIN_ENV,
            SPIN_COUNT,
        )


def use_cpu_threads(threads: int | None) -> None:
    """Set torch's intra-op threads for the whole process (every thread that runs torch ops after this); None
    keeps torch's default, one per physical core."""
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)
    log.info("torch CPU threads: %d", threads)
