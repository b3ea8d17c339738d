"""Verification markers of large payloads: skip re-hashing unchanged blobs, still catch bit rot.

Hashing a multi-GB payload on every load would dominate load time, so a blob of at least
``MARK_MIN_BYTES`` gets a marker ``<blob>.ok`` when its full hash is checked (on write, on a full
check). The marker records the blob's size and mtime, when it was fully checked, and a short hash
of each of its (at most ``MAX_CHUNKS``) chunks. On load (docs/security.md, "Bit rot"):

* size or mtime differ from the marker, or the marker is unreadable: the whole blob is re-hashed;
* the last full check is older than ``FULL_CHECK_EVERY_S``: the whole blob is re-hashed;
* otherwise ``SAMPLED_CHUNKS`` chunks picked at random are re-hashed and compared.

So damage that changes size or mtime is always caught; damage that keeps both (bit rot, a write
that restored the mtime) is caught on each load with probability ``SAMPLED_CHUNKS / chunks``
(every time for blobs of up to ``SAMPLED_CHUNKS`` MiB), within a month at the latest, and always by
``load(..., verify=True)`` / ``fsck``.

Chunk hashes are xxh3-64, not blake3: they detect accidental damage, not tampering (whoever can
rewrite a blob can rewrite its marker; the blake3 content hash is what names the payload). On a
save they are computed from the bytes in memory, beside the content hash, in the hashing thread:
an earlier version re-read each new blob and blake3-hashed its chunks on the saving thread, which
made a 1 GiB save ~2.4x safetensors instead of ~1.2x (benchmarks/bench_save_load.py). xxh3 costs
0.12 s of CPU per GiB here, blake3 0.48 s.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import time
from pathlib import Path

import xxhash

from modulelens.errors import CorruptCaptureError
from modulelens.repo.files import open_regular, read_regular

MARK_MIN_BYTES = 1 << 20
MIN_CHUNK = 1 << 20
MAX_CHUNKS = 64
SAMPLED_CHUNKS = 4
FULL_CHECK_EVERY_S = 30 * 24 * 3600
CHUNK_HASH = "xxh3_64"
ChunkDigests = tuple[int, list[str]]


def chunk_size(size: int) -> int:
    """Bytes per chunk: 1 MiB, or more so that a blob has at most ``MAX_CHUNKS`` chunks."""
    return max(MIN_CHUNK, -(-size // MAX_CHUNKS))


def _chunk_digest(data: memoryview | bytes) -> str:
    return xxhash.xxh3_64_hexdigest(data)


def chunk_digests(data: memoryview) -> ChunkDigests:
    """``(chunk size, hash of each chunk)`` of a payload's bytes, as its marker records them."""
    chunk = chunk_size(len(data))
    return chunk, [_chunk_digest(data[i:i + chunk]) for i in range(0, len(data), chunk)]


def marker_path(blob: Path) -> Path:
    return blob.with_name(blob.name + ".ok")


def write_marker(blob: Path, chunks: ChunkDigests | None = None) -> None:
    """Record ``blob`` (just fully verified) with its chunk hashes: ``chunks`` when the caller
    computed them from the bytes it wrote, otherwise read from the file. Backdates the blob's mtime
    first: any later write stamps the current time, which can then never equal the recorded one,
    even on filesystems with coarse timestamps. A plain write, not write-and-rename: a torn or
    stale marker only fails to match, and the blob is then re-hashed."""
    backdated = time.time_ns() - 2_000_000_000
    try:
        with os.fdopen(open_regular(blob), "rb") as handle:  # never through a link planted in the repo
            os.utime(handle.fileno(), ns=(backdated, backdated))
            info = os.fstat(handle.fileno())
            if chunks is None:
                chunks = _chunks(handle.fileno(), info.st_size)
        record = {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "checked": time.time(),
                  "chunk_hash": CHUNK_HASH, "chunk": chunks[0], "chunks": chunks[1]}
        fd = os.open(marker_path(blob), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "w") as marker:
            marker.write(json.dumps(record))
    except (OSError, CorruptCaptureError):
        pass  # no marker: the blob is fully hashed on its next load


def _chunks(fd: int, size: int) -> ChunkDigests:
    if size == 0:
        return chunk_size(0), []
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            return chunk_digests(view)
        finally:
            view.release()


def sampled_check(blob: Path, info: os.stat_result) -> bool | None:
    """``True``: the marker matches and the sampled chunks hash as recorded; ``False``: a sampled
    chunk differs (the blob is damaged); ``None``: no usable marker, or a full check is due."""
    try:
        record = json.loads(read_regular(marker_path(blob)))
        if (record["size"], record["mtime_ns"]) != (info.st_size, info.st_mtime_ns):
            return None
        if time.time() - float(record["checked"]) > FULL_CHECK_EVERY_S:
            return None
        if record.get("chunk_hash") != CHUNK_HASH:
            return None  # a marker from before xxh3 chunks: the full check rewrites it
        chunk, chunks = int(record["chunk"]), list(record["chunks"])
    except (OSError, ValueError, KeyError, TypeError, CorruptCaptureError):
        return None
    if chunk != chunk_size(info.st_size) or len(chunks) != -(-info.st_size // chunk):
        return None
    picks = random.sample(range(len(chunks)), min(SAMPLED_CHUNKS, len(chunks)))
    with os.fdopen(open_regular(blob), "rb") as handle:
        for index in picks:
            handle.seek(index * chunk)
            if _chunk_digest(handle.read(chunk)) != chunks[index]:
                return False
    return True
