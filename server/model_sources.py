"""Which base models a server may load: a hub id, or a local folder the operator allowed.

A server reachable by others must not load (or reveal the existence of) arbitrary folders of its
machine: with `folders` set, a local path outside them is refused whatever it holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from art_agents.server.errors import ServiceError

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclass(frozen=True)
class ModelSources:
    """`folders=None` allows any local folder (the operator's own loopback server)."""

    folders: tuple[Path, ...] | None = None

    @classmethod
    def of(cls, folders: Sequence[str | Path] | None) -> ModelSources:
        return cls(None if folders is None else tuple(Path(f).expanduser().resolve() for f in folders))

    def check(self, base_model: str) -> None:
        """Refuse (403) a local `base_model` outside the allowed folders; hub ids always pass."""
        if self.folders is None:
            return
        path = Path(base_model).expanduser()
        if HUB_ID.fullmatch(base_model) and not path.exists():
            return
        resolved = path.resolve()
        if not any(resolved.is_relative_to(folder) for folder in self.folders):
            raise ServiceError(
                403,
                f"base_model {base_model!r} is neither a hub id nor inside the folders this server loads models "
                "from; the operator can allow its folder with `art-agents serve --model-dir`",
            )

    @staticmethod
    def load_error(base_model: str) -> str:
        """What a client is told when loading failed (the reason, which may name server paths, is logged)."""
        path = Path(base_model).expanduser()
        if not HUB_ID.fullmatch(base_model) and not path.exists():
            return f"base_model {base_model!r}: no such folder on the server"
        return (
            f"cannot load base_model {base_model!r} (the server log has the reason): give a local folder with a "
            "transformers model (e.g. one made by `art-agents tiny-model PATH`), or a hub id the server can "
            "download or has cached"
        )
