"""`art-agents trainer-node` before it has a group: bad arguments refused in one line before torch loads, a store
that does not answer said in a line or two (torch's C++ retries silenced) and given up on after `--wait-s`, and the
server's store open from registering the model, so nodes connect before the first step."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from server_fixtures import free_port, start_server
from test_server_admin import register

from art_agents.server.training import trainer_node
from art_agents.server.training.group_store import GroupStore


def node(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "art_agents", "trainer-node", "--node-rank", "1", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("address", ["127.0.0.1:70000", "127.0.0.1:0", "127.0.0.1", "127.0.0.1:port"])
def test_an_address_out_of_form_or_range_is_one_line(address: str) -> None:
    done = node("--rendezvous", address)
    assert done.returncode == 2 and not done.stdout
    assert done.stderr.splitlines() == [f"error: a rendezvous address is HOST:PORT with PORT 1-65535, not {address!r}"]


@pytest.mark.parametrize(
    ("address", "found"),
    [("no-such-host.invalid:29400", "no-such-host.invalid does not resolve"), ("127.0.0.1:{port}", "nothing listens")],
    ids=["unknown host", "closed port"],
)
def test_a_store_that_never_answers_is_a_line_while_waiting_and_one_when_giving_up(address: str, found: str) -> None:
    address = address.format(port=free_port())
    done = node("--rendezvous", address, "--wait-s", "1")
    assert done.returncode == 1
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) == 2, lines  # was 130-150 lines of torch's C++ errors in 12 s, and no end
    assert f"waiting for the server's store at {address} (gives up after 1 s, Ctrl-C stops)" in lines[0]
    assert lines[1].startswith(f"error: node 1: no store answered at {address} for 1 s ({found}")


def test_a_long_wait_is_said_again_with_what_is_found_there(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(trainer_node, "REPORT_S", 0.0)
    address = f"127.0.0.1:{free_port()}"
    with caplog.at_level(logging.INFO, "art_agents.trainer_node"), pytest.raises(trainer_node.StoreUnreachable):
        trainer_node._connect(address, 1, wait_s=0.5)
    assert caplog.messages
    assert all(m.startswith(f"node 1: still waiting for {address}, since ") for m in caplog.messages)
    assert "nothing listens on port" in caplog.messages[0]


def test_the_server_hosts_the_store_from_registering_until_it_stops(tiny_model_path: Path, tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    config = {"trainer_processes": 1, "trainer_nodes": 2, "trainer_rendezvous": address}
    with start_server(tmp_path / "art") as url:
        assert register(url, "nodes", tiny_model_path, **config).status_code == 200
        assert GroupStore.connect(address, timeout_s=10).latest() == 0  # a node connects before any train call
        taken = register(url, "same-port", tiny_model_path, **config)
        assert taken.status_code == 400
        assert taken.json()["detail"].startswith(f"cannot host the trainer rendezvous at {address}: ")
        assert "pick a free port for ModelConfig.trainer_rendezvous" in taken.json()["detail"]
    with socket.socket() as probe:  # closed with the model: the port is free again
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("0.0.0.0", int(address.rsplit(":", 1)[1])))
