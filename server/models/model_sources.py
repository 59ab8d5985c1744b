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
    def find(base_model: str, gguf_file: str | None = None, *, timeout: float = 10.0) -> None:
        """Fail in seconds, naming the fix, where loading would fail anyway: a folder that is not there,
        or a hub id that is neither cached nor reachable (the hub client retries for ~30 s first)."""
        path = Path(base_model).expanduser()
        if path.exists():
            return
        if not HUB_ID.fullmatch(base_model):
            raise ServiceError(400, f"base_model {base_model!r}: no such folder on the server")
        from huggingface_hub import constants, try_to_load_from_cache

        if isinstance(try_to_load_from_cache(base_model, gguf_file or "config.json"), str):
            return
        if constants.HF_HUB_OFFLINE:
            raise ServiceError(
                400,
                f"base_model {base_model!r} is not in this server's hub cache and the hub is off (HF_HUB_OFFLINE=1): "
                "give a local folder, or download it first (`hf download ID`) where the hub is reachable",
            )
        _ask_hub(base_model, timeout)

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


def _ask_hub(repo_id: str, timeout: float) -> None:
    """One quick metadata request, so an offline server or a wrong id is said at once instead of after retries."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(repo_id, timeout=timeout)
    except GatedRepoError as exc:
        raise ServiceError(
            400,
            f"base_model {repo_id!r} is gated: accept its licence on the hub and log the server in (`hf auth login`)",
        ) from exc
    except RepositoryNotFoundError as exc:
        raise ServiceError(
            400, f"base_model {repo_id!r}: no such folder on the server, and no such model on the hub"
        ) from exc
    except Exception as exc:  # no network, DNS, proxy, timeout: the library's exception types vary with its backend
        raise ServiceError(
            400,
            f"base_model {repo_id!r} is not in this server's hub cache and the hub cannot be reached "
            f"({type(exc).__name__}): the server is offline? give a local folder, or download the model first",
        ) from exc
