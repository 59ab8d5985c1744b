"""Shared fixtures. Heavy fixtures (the tiny model, a running server) live in their own modules."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))

from scripted_openai import ScriptedOpenAI
from server_fixtures import backend, server, server_url, store, tiny_model_path, tokenizer  # noqa: F401


@pytest.fixture
def scripted() -> Iterator[ScriptedOpenAI]:
    with ScriptedOpenAI() as endpoint:
        yield endpoint
