"""Bit rot under a verification marker, as the disk makes it: bytes change and no system call
records it (size, mtime, ctime and inode stay as the marker has them).

A test cannot change a file without changing its ctime, which the marker records (so any change
made through the file system is found by a full hash on the next load: repo/markers.py). To test
the sampled chunk check, which is what finds damage made *without* a system call, the marker is
recorded again after the damage with the chunk hashes of the intact bytes, for this user and repo.
"""

from __future__ import annotations

import os
from pathlib import Path

import modulelens
from modulelens.format.provenance import user_key
from modulelens.repo.markers import MarkerKey, chunk_digests, write_marker
from modulelens.repo.trust import repo_identity


def rot(repo: modulelens.Repo, blob: Path, offsets: list[int], *, pack: bool = False) -> None:
    """Flip one bit at each offset of ``blob``, leaving a marker that still describes the file
    (``pack``: as one that was checked as a pack, member by member)."""
    intact = chunk_digests(memoryview(blob.read_bytes()))
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as handle:
        for offset in offsets:
            handle.seek(offset)
            byte = handle.read(1)[0]
            handle.seek(offset)
            handle.write(bytes([byte ^ 0x10]))
    os.chmod(blob, 0o444)
    write_marker(blob, MarkerKey.derive(user_key(), repo_identity(repo.root)), intact, pack=pack)
