"""A free TCP port on 127.0.0.1 for a server a test or benchmark starts (the kernel picks
it; the socket is closed again, so a rare race with another process remains)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
