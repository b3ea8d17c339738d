"""The content hash that names a payload (torch-free, so the repo can be read without torch)."""

from __future__ import annotations

import re

import blake3

HASH_ALGORITHM = "blake3"
HEX64 = re.compile(r"[0-9a-f]{64}")  # the hex digest a payload hash ends in (and a blob's file name)


def hash_bytes(data: memoryview | bytes, *, threads: bool = True) -> str:
    """Content hash of a payload, prefixed with its algorithm (``blake3:<hex>``).

    Example::

        >>> hash_bytes(b"")[:7]
        'blake3:'
    """
    use_threads = threads and len(data) > (1 << 22)
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO) if use_threads else blake3.blake3()
    hasher.update(data)
    return f"{HASH_ALGORITHM}:{hasher.hexdigest()}"


class ContentHasher:
    """The content hash of bytes that arrive in pieces (a payload copied between repos).

    Example::

        hasher = ContentHasher()
        for piece in pieces:
            hasher.update(piece)
        assert hasher.digest() == hash_bytes(b"".join(pieces))
    """

    def __init__(self) -> None:
        self._hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)

    def update(self, data: memoryview | bytes) -> None:
        self._hasher.update(data)

    def digest(self) -> str:
        """``blake3:<hex>`` of everything given so far."""
        return f"{HASH_ALGORITHM}:{self._hasher.hexdigest()}"
