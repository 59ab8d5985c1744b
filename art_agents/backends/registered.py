"""A TrainableModel registered on its backend for the length of a `with` block: what `art-agents train`,
`art-agents eval` and the AutoRL and MCP•RL runs each start from."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from art_agents.backends.local import LocalBackend
from art_agents.backends.remote import RemoteBackend
from art_agents.model import TrainableModel
from art_agents.train_config import ModelConfig


@asynccontextmanager
async def registered_model(
    name: str,
    project: str,
    base_model: str,
    config: ModelConfig | None = None,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    art_path: str | Path | None = None,
) -> AsyncIterator[TrainableModel]:
    """The model, registered on the server at `base_url` (a RemoteBackend), or with `base_url=None` on a
    LocalBackend keeping its files under `art_path`; the backend is closed when the block ends."""
    backend = RemoteBackend(base_url, api_key) if base_url is not None else LocalBackend(art_path)
    model = TrainableModel(name=name, project=project, base_model=base_model, config=config)
    try:
        await model.register(backend)
        yield model
    finally:
        await backend.close()
