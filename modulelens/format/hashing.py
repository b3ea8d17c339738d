"""The content hash that names a payload (torch-free, so the repo can be read without torch)."""

from __future__ import annotations

import blake3

HASH_ALGORITHM = "blake3"


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
