"""Backends: where a TrainableModel is served and trained.

`protocol` holds the `Backend` Protocol; `remote` the `RemoteBackend` that talks to an `art-agents serve`
anywhere over HTTP; `local` the `LocalBackend` that starts one on this machine; `transport` and
`server_capture` record a rollout's calls (in the client's httpx transport, or on the server by a
rollout-scoped URL); `ports` finds a free loopback port.
"""

from art_agents.backends.local import DEFAULT_ART_PATH, LocalBackend
from art_agents.backends.protocol import Backend
from art_agents.backends.remote import RemoteBackend

__all__ = ["DEFAULT_ART_PATH", "Backend", "LocalBackend", "RemoteBackend"]
