"""Progress bars: drawn on a terminal and wiped when done, silent in a pipe or log unless asked for."""

from __future__ import annotations

import asyncio
import fcntl
import os
import select
import struct
import sys
import termios
from collections.abc import Iterator

import pytest
from test_gather import pytestmark  # noqa: F401 (a rollout left never awaited fails the test here too)

from art_agents import Trajectory, TrajectoryGroup, gather_trajectory_groups, rollout
from art_agents.utils import iterate_dataset


async def scored(reward: float) -> Trajectory:
    async with rollout() as traj:
        traj.reward = reward
    return traj


def groups() -> list[TrajectoryGroup]:
    return [TrajectoryGroup(scored(0.0) for _ in range(3)) for _ in range(2)]


def screen(output: str) -> str:
    """The last line a terminal shows after `output`: `\\r` returns to column 0 and overwrites."""
    line: list[str] = []
    column = 0
    for char in output:
        if char == "\n":
            line, column = [], 0
        elif char == "\r":
            column = 0
        else:
            line[column : column + 1] = [char]
            column += 1
    return "".join(line)


class Terminal:
    """A real pseudo-terminal; `attach()` makes it stderr, `drawn()` is everything written to it so far."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.leader, follower = os.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 rows, 100 columns
        self.stream = open(follower, "w", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self.output = b""

    def attach(self) -> None:
        """Call it in the test itself: pytest points sys.stderr back at its capture after fixtures ran."""
        self.monkeypatch.delenv("ART_AGENTS_PROGRESS", raising=False)
        self.monkeypatch.setattr(sys, "stderr", self.stream)

    def drawn(self) -> str:
        self.stream.flush()
        while select.select([self.leader], [], [], 0.05)[0]:  # the kernel hands pty output on a moment later
            self.output += os.read(self.leader, 65536)
        return self.output.decode()


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[Terminal]:
    pty = Terminal(monkeypatch)
    yield pty
    pty.stream.close()
    os.close(pty.leader)


async def test_on_a_terminal_the_bars_are_drawn_then_wiped(terminal: Terminal) -> None:
    terminal.attach()
    await gather_trajectory_groups(groups(), pbar_desc="gather")
    assert "gather:" in terminal.drawn() and screen(terminal.drawn()).strip() == ""
    for _ in iterate_dataset(list(range(4)), groups_per_step=2):
        assert "Iterating dataset:" in terminal.drawn()
    assert screen(terminal.drawn()).strip() == ""


async def test_off_a_terminal_no_bar_unless_asked_for(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ART_AGENTS_PROGRESS", raising=False)
    await gather_trajectory_groups(groups())
    list(iterate_dataset(list(range(4)), groups_per_step=2))
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("ART_AGENTS_PROGRESS", "1")
    await gather_trajectory_groups(groups())
    drawn = capsys.readouterr().err
    assert "gather:" in drawn and screen(drawn).strip() == ""


async def test_progress_0_silences_a_terminal_and_a_bad_value_is_named(
    terminal: Terminal, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal.attach()
    monkeypatch.setenv("ART_AGENTS_PROGRESS", "0")
    await gather_trajectory_groups(groups())
    assert terminal.drawn() == ""
    monkeypatch.setenv("ART_AGENTS_PROGRESS", "sometimes")
    with pytest.raises(ValueError, match=r"ART_AGENTS_PROGRESS='sometimes' is not understood; set it to 1"):
        await gather_trajectory_groups(groups())


async def test_the_bar_shows_rewards_as_after_each_scored_them(terminal: Terminal) -> None:
    terminal.attach()

    async def judge(group: TrajectoryGroup) -> TrajectoryGroup:
        await asyncio.sleep(0.15)  # as long as a judge takes: the bar redraws at most every 0.1 s
        for trajectory in group.trajectories:
            trajectory.reward = 0.833
        return group

    await gather_trajectory_groups(groups(), after_each=judge)
    assert "reward=0.833" in terminal.drawn() and "reward=0.000" not in terminal.drawn()
