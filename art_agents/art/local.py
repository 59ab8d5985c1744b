"""ART's `art.local` import path: `from art_agents.local import LocalBackend`."""

from art_agents.backends.local import LocalBackend

__all__ = ["LocalBackend"]
