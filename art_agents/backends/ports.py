"""A free TCP port on the loopback interface, for a server this process is about to start."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that nothing listens on right now (the OS picks it; another process may take it later)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
