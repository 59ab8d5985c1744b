"""server/host/processes.py: pid liveness, and a server that shuts down once the process that started it dies."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import psutil

from art_agents.server.host.processes import is_alive

# The parent starts the child and prints its pid; the child watches the parent, says so, and waits.
CHILD = textwrap.dedent("""
    import os, time
    from art_agents.server.host.processes import exit_with_parent
    exit_with_parent(os.getppid(), interval_s=0.05)
    print("watching", flush=True)
    time.sleep(60)
""")
PARENT = textwrap.dedent(f"""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", {CHILD!r}])
    print(child.pid, flush=True)
    time.sleep(60)
""")


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie that whoever adopted it has not reaped yet."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_is_alive() -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert is_alive(psutil.Process().pid)
    assert not is_alive(int(done.stdout))  # exited and reaped


def test_the_watcher_waits_while_the_parent_lives_and_ends_the_process_when_it_dies() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "watching"
        time.sleep(0.5)  # ten polls
        assert not gone(child)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 60  # it polls 20 times a second: a minute only stands for "never"
    try:
        while not gone(child):
            assert time.monotonic() < deadline, "the child outlived its parent by a minute"
            time.sleep(0.05)
    finally:
        if not gone(child):
            psutil.Process(child).kill()
