"""Verification markers of large payloads: skip re-hashing unchanged blobs, still catch bit rot.

Hashing a multi-GB payload on every load would dominate load time, so a blob of at least
``MARK_MIN_BYTES`` gets a marker ``<blob>.ok`` when its full hash is checked (on write, on a full
check). The marker records the blob's size and mtime, when it was fully checked, and a short hash
of each of its chunks (64 KiB, or more so that a blob has at most ``MAX_CHUNKS``). On load
(docs/security.md, "Bit rot"):

* size or mtime differ from the marker, or the marker is unreadable: the whole blob is re-hashed;
* the last full check is older than ``FULL_CHECK_EVERY_S``: the whole blob is re-hashed;
* otherwise the chunks are re-hashed and compared: all of them for a blob of up to
  ``WHOLE_CHECK_MAX_BYTES``, ``SAMPLED_CHUNKS`` consecutive ones from a random start for a larger one.

So damage that keeps size and mtime (bit rot, a write that restored the mtime) is caught on every
load of a blob of up to 4 MiB, on each load with probability ``SAMPLED_CHUNKS / chunks`` for a
larger one, within a month at the latest, and always by ``load(..., verify=True)`` / ``fsck``.

Why these sizes: the sampled check is on the path to a runnable module, which issue 15 wants
within 1.1x of building it on the meta device and memory-mapping ``torch.load``. Sampling four 1 MiB
chunks per blob made a 1 GiB load of 16 blobs 2.1x that recipe (64 MiB hashed, ~15 ms);
8 chunks of 64 KiB hash 512 KiB per large blob (benchmarks/bench_save_load.py).

Chunk hashes are xxh3-64, not blake3: they detect accidental damage, not tampering (whoever can
rewrite a blob can rewrite its marker; the blake3 content hash is what names the payload). On a
save they are computed from the bytes in memory, beside the content hash, in the hashing thread:
an earlier version re-read each new blob and blake3-hashed its chunks on the saving thread, which
made a 1 GiB save ~2.4x safetensors instead of ~1.2x. xxh3 costs 0.12 s of CPU per GiB here,
blake3 0.48 s. The marker stores the chunk hashes as one string of 16 hex digits each, which
parses ~20x faster than a JSON list of a thousand strings.
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
MIN_CHUNK = 64 << 10
MAX_CHUNKS = 1024
WHOLE_CHECK_MAX_BYTES = 4 << 20
SAMPLED_CHUNKS = 8
FULL_CHECK_EVERY_S = 30 * 24 * 3600
CHUNK_HASH = "xxh3_64"
_DIGITS = 16  # hex digits of one xxh3-64 chunk hash
ChunkDigests = tuple[int, str]  # (chunk size, the chunks' hashes as one hex string)


def chunk_size(size: int) -> int:
    """Bytes per chunk: 1 MiB, or more so that a blob has at most ``MAX_CHUNKS`` chunks."""
    return max(MIN_CHUNK, -(-size // MAX_CHUNKS))


def _chunk_digest(data: memoryview | bytes) -> bytes:
    return xxhash.xxh3_64_digest(data)


def chunk_digests(data: memoryview) -> ChunkDigests:
    """``(chunk size, hashes of the chunks)`` of a payload's bytes, as its marker records them."""
    chunk = chunk_size(len(data))
    return chunk, b"".join([_chunk_digest(data[i:i + chunk]) for i in range(0, len(data), chunk)]).hex()


def marker_path(blob: Path) -> Path:
    return Path(f"{blob}.ok")


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
        return chunk_size(0), ""
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            return chunk_digests(view)
        finally:
            view.release()


def sampled_check(blob: Path, info: os.stat_result) -> bool | None:
    """``True``: the marker matches and the checked chunks hash as recorded; ``False``: a chunk
    differs (the blob is damaged); ``None``: no usable marker, or a full check is due."""
    try:
        record = json.loads(read_regular(marker_path(blob)))
        if (record["size"], record["mtime_ns"]) != (info.st_size, info.st_mtime_ns):
            return None
        if time.time() - float(record["checked"]) > FULL_CHECK_EVERY_S:
            return None
        chunk, chunks = int(record["chunk"]), record["chunks"]
        if record.get("chunk_hash") != CHUNK_HASH or not isinstance(chunks, str):
            return None  # a marker of an older layout (other chunk hashes, a list): the full check rewrites it
    except (OSError, ValueError, KeyError, TypeError, CorruptCaptureError):
        return None
    count = -(-info.st_size // chunk)
    if chunk != chunk_size(info.st_size) or len(chunks) != count * _DIGITS:
        return None
    # all chunks of a small blob; of a larger one, SAMPLED_CHUNKS consecutive ones from a random
    # start (wrapping around), read with one or two system calls: each chunk is as likely to be
    # checked as with scattered picks, at a third of the cost per blob
    start, length = (0, count) if info.st_size <= WHOLE_CHECK_MAX_BYTES else (random.randrange(count), SAMPLED_CHUNKS)
    runs = [(start, min(length, count - start))]
    if length > runs[0][1]:
        runs.append((0, length - runs[0][1]))
    fd = open_regular(blob)
    try:
        for first, number in runs:
            data = memoryview(os.pread(fd, number * chunk, first * chunk))
            for i in range(number):
                expected = chunks[(first + i) * _DIGITS:(first + i + 1) * _DIGITS]
                if _chunk_digest(data[i * chunk:(i + 1) * chunk]).hex() != expected:
                    return False
    finally:
        os.close(fd)
    return True
