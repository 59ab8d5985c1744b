"""ART's `art.local` import path: `from art_agents.local import LocalBackend`."""

from art_agents.backend import LocalBackend

__all__ = ["LocalBackend"]
