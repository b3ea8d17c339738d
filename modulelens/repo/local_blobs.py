"""Blob files of a repo in a directory checked or copied byte by byte: a copy from another repo
hashed as it is written (:func:`copy_hashed`), and a pack's members checked against their hashes
(:func:`pack_members_damage`, fsck).
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

from modulelens.errors import CorruptCaptureError
from modulelens.format.hashing import ContentHasher, hash_bytes
from modulelens.repo.files import open_regular
from modulelens.repo.markers import MARK_MIN_BYTES, ChunkHasher
from modulelens.repo.packs import read_header

if TYPE_CHECKING:
    from modulelens.repo.markers import ChunkDigests

_COPY_STEP = 8 << 20  # bytes read, hashed and written at a time by a copy from another repo


def copy_hashed(source: Path, staged: Path, digest: str) -> tuple[int, ChunkDigests]:
    """Copy ``source`` to the new file ``staged`` (read-only), hashing the very bytes written, and
    computing the marker's chunk hashes on the way; returns the size and those chunk hashes.
    Reads and writes :data:`_COPY_STEP` bytes at a time (no memory map: a full disk is then an
    ``OSError``, not a ``BufferError`` from a map still exported while it closes).

    Raises:
        CorruptCaptureError: the bytes do not hash to ``digest``.
    """
    hasher = ContentHasher()
    with os.fdopen(open_regular(source), "rb", buffering=0) as reader:
        size = os.fstat(reader.fileno()).st_size
        chunker = ChunkHasher(size)
        step = max(_COPY_STEP // chunker.chunk, 1) * chunker.chunk  # whole chunks: no carry-over
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
        with os.fdopen(fd, "wb", buffering=0) as writer:
            if size > MARK_MIN_BYTES and hasattr(os, "posix_fallocate"):
                try:
                    os.posix_fallocate(fd, 0, size)  # a full disk fails here, before anything is copied
                except OSError as error:
                    if error.errno in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    # (not every filesystem supports it)
            while data := reader.read(step):
                hasher.update(data)
                if size >= MARK_MIN_BYTES:
                    chunker.update(data)
                view = memoryview(data)
                written = 0
                while written < len(view):
                    written += writer.write(view[written:])
    actual = hasher.digest()
    if actual != digest:
        raise CorruptCaptureError(f"{source} does not hash to {digest} (its content hashes to {actual}); "
                                  "nothing was copied")
    return size, chunker.digests()


def pack_members_damage(path: Path, wanted: Collection[tuple[str, int]]) -> str | None:
    """Why the pack at ``path`` does not hold each ``(member hash, nbytes)`` of ``wanted`` as
    its hash says (fsck's full check), or ``None`` when every one is there and hashes to its name."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return "missing"
    except CorruptCaptureError as error:
        return str(error)
    try:
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
            try:
                header = read_header(mapped, str(path))
            except CorruptCaptureError as error:
                return str(error)
            for member, nbytes in sorted(wanted):
                offset, stored = header.get(member.partition(":")[2], (0, -1))
                if stored != nbytes:
                    return f"member {member} is missing or has the wrong size"
                if hash_bytes(mapped[offset:offset + nbytes]) != member:
                    return f"member {member} does not match its hash"
    finally:
        os.close(fd)
    return None
