"""LiteLLM through art_agents uses its bundled price map: no fetch at import, no warnings, offline or not.

LiteLLM fetches the map from `LITELLM_MODEL_COST_MAP_URL` at import unless `LITELLM_LOCAL_MODEL_COST_MAP` is
true. Here that URL is a real loopback server counting requests, and the variable is removed from the child's
environment (conftest sets it for the suite), so the test sees what a user's shell would give.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from scripted_openai import LoopbackServer


class CostMapServer:
    """Answers any GET with an empty price map and counts the requests."""

    def __init__(self) -> None:
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server.requests += 1
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self._server = LoopbackServer(Handler)
        self.url = f"{self._server.url}/model_prices.json"
        self._server.start()

    def close(self) -> None:
        self._server.close()


@pytest.fixture
def cost_map() -> Iterator[CostMapServer]:
    server = CostMapServer()
    yield server
    server.close()


def import_in_child(code: str, url: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    env |= {"LITELLM_MODEL_COST_MAP_URL": url, **extra}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_litellm_imported_through_art_agents_fetches_no_price_map_and_warns_nothing(cost_map: CostMapServer) -> None:
    ours = import_in_child("from art_agents.llm import import_litellm; import_litellm()", cost_map.url)
    assert ours.returncode == 0, ours.stderr
    assert cost_map.requests == 0 and ours.stderr == "" and ours.stdout == ""

    # a notebook that imports a part of art_agents, then litellm itself (its own provider), gets the same
    notebook = import_in_child("import art_agents.ruler, litellm", cost_map.url)
    assert notebook.returncode == 0 and cost_map.requests == 0 and notebook.stderr == ""

    # the opt-in: LiteLLM's own default fetches the fresh map (which is how the server above counts a fetch)
    fresh = import_in_child("import art_agents.llm, litellm", cost_map.url, LITELLM_LOCAL_MODEL_COST_MAP="False")
    assert fresh.returncode == 0, fresh.stderr
    assert cost_map.requests >= 1
