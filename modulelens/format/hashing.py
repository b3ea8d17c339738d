"""The content hash that names a payload (torch-free, so the repo can be read without torch)."""

from __future__ import annotations

import os
import re

import blake3

HASH_ALGORITHM = "blake3"
HEX64 = re.compile(r"[0-9a-f]{64}")  # the hex digest a payload hash ends in (and a blob's file name)
_THREADED_ABOVE = 1 << 22  # bytes: below this, starting the threads costs more than they save

# blake3 hashes large inputs on a pool of threads (rayon's), started on first use. A process
# forked after that (multiprocessing's default start method on Linux, DataLoader workers) inherits
# the pool's bookkeeping but not its threads, and its first threaded hash waits for them forever:
# a hash of 5 MiB after a fork hung with 0 CPU used (stress/hostile_repo2.py forks one child per
# case). So a child forked after the pool started hashes on its own thread.
_pool_started = False
_pool_usable = True


def _forked() -> None:
    global _pool_usable
    if _pool_started:
        _pool_usable = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _hasher(threads: bool) -> blake3.blake3:
    global _pool_started
    if threads and _pool_usable:
        _pool_started = True
        return blake3.blake3(max_threads=blake3.blake3.AUTO)
    return blake3.blake3()


def hash_bytes(data: memoryview | bytes, *, threads: bool = True) -> str:
    """Content hash of a payload, prefixed with its algorithm (``blake3:<hex>``).

    Example::

        >>> hash_bytes(b"")[:7]
        'blake3:'
    """
    hasher = _hasher(threads and len(data) > _THREADED_ABOVE)
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

    def __init__(self, *, threads: bool = True) -> None:
        self._hasher = _hasher(threads)  # (pieces of 8 MiB: threads pay, unless the cores are the job's)

    def update(self, data: memoryview | bytes) -> None:
        self._hasher.update(data)

    def digest(self) -> str:
        """``blake3:<hex>`` of everything given so far."""
        return f"{HASH_ALGORITHM}:{self._hasher.hexdigest()}"
