"""Ports for the servers the tests start (weed, torchrun's rendezvous) on loopback."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def _ephemeral_range() -> range:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


def free_port() -> int:
    """A port free now and outside the kernel's ephemeral range. A port from ``bind(0)`` is an
    ephemeral one, which any outgoing connection of the busy test run can take before weed binds
    it (weed then exits 255: a CI run lost its S3 tests so; a torchrun rendezvous fails)."""
    ephemeral = _ephemeral_range()
    for _ in range(200):
        port = random.randint(10000, 65000)
        if port in ephemeral:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port outside the ephemeral range")
