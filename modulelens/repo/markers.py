"""Verification markers of large payloads: skip re-hashing unchanged blobs, still catch bit rot.

Hashing a multi-GB payload on every load would dominate load time, so a blob of at least
``MARK_MIN_BYTES`` (a pack of at least ``MARK_MIN_PACK_BYTES``, whose full check hashes every member
too) gets a marker ``<blob>.ok`` when its full hash is checked (a large blob on write too). The marker
records the blob's size, mtime, ctime and inode, when it was fully checked, whether it was
checked as a pack (every member against its hash), and a short hash of each of its chunks (64 KiB,
or more so that a blob has at most ``MAX_CHUNKS``). On load (docs/security.md, "Bit rot"):

* the marker is not one this user made for this repo, size, mtime, ctime or inode differ from
  it, or it is unreadable: the whole blob is re-hashed;
* the last full check is older than ``FULL_CHECK_EVERY_S``: the whole blob is re-hashed;
* otherwise ``SAMPLED_CHUNKS`` consecutive chunks from a random start are re-hashed and compared.

**Markers are bound to one repo and one user** (issue 21): a repo arrives with the markers of
whoever sent it (a tarball, ``cp -a``, rsync keep the times they match), so a marker is trusted
only when it carries a MAC (HMAC-SHA256) under a key derived from the user's signing key
(:mod:`modulelens.format.provenance`: the one per-user secret, never in a repo) over this repo's
identity (real path, device, inode, user: :func:`modulelens.repo.trust.repo_identity`), the blob's
name and the marker's record. Anything else (a marker of another repo or user, of an older
modulelens, one made up) only means "hash it in full". The ctime in the record means any change to
the file after its check (a write, even one that puts the mtime back, a ``chmod``, a new hard
link) makes the next load hash it in full; only damage no system call made (bit rot) is left to
the sampled chunks. Without a usable key (no home directory, a key others could read) no marker
is trusted or written: every load hashes in full.

So damage that keeps size, mtime and ctime (bit rot) is caught on every load of a payload under
``MARK_MIN_BYTES`` (1 MiB: no marker, hashed in full), on each load with probability
``SAMPLED_CHUNKS / chunks`` for a marked one (2/16 at 1 MiB, 2/1,024 from 64 MiB), within a month at
the latest, and always by ``load(..., verify=True)`` / ``fsck``; a change made through the file
system, on the next load.

Why these sizes: the sampled check is on the path to a runnable module, which issue 37 wants
within 1.2x of building it on the meta device and memory-mapping ``torch.load``, flat in the number
of weight files. Sampling four 1 MiB chunks per blob made a 1 GiB load of 16 blobs 2.1x that recipe
(64 MiB hashed, ~15 ms); 8 chunks of 64 KiB (512 KiB a blob) cost 30 us a blob with the blobs in
the page cache, most of the per-file cost of a load, and 8 random disk reads a blob without;
2 chunks (128 KiB, one read) cost 8 us. The sample is a net for damage between full checks, not the
check itself: the marker's identity (inode, size, mtime, ctime) catches every change made through
the file system, and the monthly full hash, ``fsck`` and ``verify=True`` catch bit rot for sure.
Marked blobs of up to 4 MiB were once re-hashed whole on every load: a 1 GiB model in 256 weight
files of 4 MiB hashed all of its 1 GiB on each load, 2.5x the recipe where 16 files of 64 MiB were
0.7x (benchmarks/bench_save_load.py --files), so every marked blob is now sampled alike and the
cost of a load stays flat in the number of weight files.

Chunk hashes are xxh3-64, not blake3: they detect accidental damage, not tampering (the MAC keeps
anyone without the key from writing a marker; the blake3 content hash is what names the payload).
On a save they are computed from the bytes in memory, beside the content hash, in the hashing
thread: an earlier version re-read each new blob and blake3-hashed its chunks on the saving
thread, which made a 1 GiB save ~2.4x safetensors instead of ~1.2x. xxh3 costs 0.12 s of CPU per
GiB here, blake3 0.48 s.

The marker's layout is made for the load path (a 1 GiB load checks 16 of them): the record's JSON
on one line, its MAC on the next, then the chunk hashes as raw bytes, 8 bytes a chunk. The MAC covers
the record and the hashes as read (no second encoding) and is checked before anything is parsed;
the JSON that is parsed holds no hashes. Version 2 held them in the JSON as one hex string: twice
the bytes to MAC and a 16 KiB string to parse (the sampled check of a 64 MiB blob took 73 us, 55 us
now, timed in a loop). A version 2 marker is not trusted: its blob is hashed in full once and
marked anew. The checked chunks are read one at a time into one buffer: a 4 MiB blob read whole
into a new ``bytes`` page-faulted its way through it on every load (a 1 MiB pack: 0.60 ms, now 0.07 ms).
"""

from __future__ import annotations

import json
import mmap
import os
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from modulelens.errors import CorruptCaptureError
from modulelens.repo.files import open_regular, read_regular

MARK_MIN_BYTES = 1 << 20
# a pack is marked from a smaller size: its full check also hashes every member (check_members),
# twice the work of hashing a blob, on every load
MARK_MIN_PACK_BYTES = 64 << 10
MIN_CHUNK = 64 << 10
MAX_CHUNKS = 1024
SAMPLED_CHUNKS = 2
FULL_CHECK_EVERY_S = 30 * 24 * 3600
CHUNK_HASH = "xxh3_64"
MARKER_VERSION = 3  # 3: hashes as raw bytes after the MAC; 2 (hashes in the JSON) and 1 (no MAC) are never trusted
# Where a sampled check starts: a generator of its own, since a load must leave the job's global
# `random` as it was (a recorded call stores that state, format/host_rng.py; a seeded job expects
# its own draws only).
_SAMPLE_STARTS = random.Random()
# Starts chosen ahead by read_ahead(), by blob path, taken by the blob's next sampled check.
_PLANNED: dict[str, int] = {}
_PLANNED_MAX = 4096
_MAX_MARKER_BYTES = 64 << 10  # 1,024 chunk hashes and the record: a larger file is not a marker
_DIGEST_BYTES = 8  # one xxh3-64 chunk hash
_XXHASH_HOLDS_GIL_UP_TO = 64 << 10  # python-xxhash releases the GIL only while hashing more bytes
ChunkDigests = tuple[int, bytes]  # (chunk size, the chunks' hashes one after the other, 8 bytes each)
# Marker records whose MAC this process checked, by blob and marker identity (see _trusted_record);
# cleared when full (a record and up to 8 KiB of hashes each).
_VOUCHED: dict[tuple[Any, ...], tuple[dict[str, Any], bytes]] = {}
_VOUCHED_MAX = 4096


@dataclass(frozen=True)
class MarkerKey:
    """What makes a marker this user's, for this repo: a secret derived from the user's signing key
    (domain-separated from the provenance MACs made with the same key) and the repo's identity.

    Example::

        key = MarkerKey.derive(user_key(), repo_identity(root))
        write_marker(blob, key)
    """

    secret: bytes
    binding: bytes

    @classmethod
    def derive(cls, user_key: bytes, identity: Mapping[str, object]) -> MarkerKey:
        import hashlib  # here, not at the top: every `ls` imports this module and makes no marker
        import hmac  # (loading OpenSSL took 3 ms of it)

        secret = hmac.new(user_key, b"modulelens verification markers v2", hashlib.sha256).digest()
        return cls(secret, json.dumps(dict(identity), sort_keys=True, separators=(",", ":")).encode())

    def mac(self, blob_name: str, record: bytes, digests: bytes) -> bytes:
        """The MAC (hex) of a marker's ``record`` (its first line, as written) and chunk ``digests``
        for the blob ``blob_name``."""
        import hmac  # one-shot hmac.digest: a third of hmac.new(...).hexdigest()'s cost on a marker

        message = b"\n".join((self.binding, blob_name.encode(), record, digests))
        return hmac.digest(self.secret, message, "sha256").hex().encode()

    def vouches(self, blob_name: str, record: bytes, digests: bytes, mac: bytes) -> bool:
        """Whether ``mac`` is this key's MAC of ``record`` and ``digests`` for ``blob_name``
        (compared in constant time)."""
        import hmac

        return hmac.compare_digest(self.mac(blob_name, record, digests), mac)


def chunk_size(size: int) -> int:
    """Bytes per chunk: 64 KiB, or more so that a blob has at most ``MAX_CHUNKS`` chunks."""
    return max(MIN_CHUNK, -(-size // MAX_CHUNKS))


def _chunk_digest(data: memoryview | bytes | bytearray) -> bytes:
    return xxhash.xxh3_64_digest(data)


def _whole_chunk_digests(view: memoryview, chunk: int) -> list[bytes]:
    """The digests of ``view``'s chunks (its length a multiple of ``chunk``), letting other threads
    have the GIL between them.

    python-xxhash holds the GIL while it hashes up to 64 KiB, the size of most chunks, so a plain
    loop of them on a background thread (a recorded call's weights streamed to the repo while the
    job runs, tracing/weights.py) held it for milliseconds at a time: the job's thread, which gives
    it up in every torch op, then waited up to the interpreter's switch interval (5 ms) to get it
    back, and a loop of matrix products beside such a loop ran ~6x slower (benchmarks/bench_markers.py,
    "beside a job"). A ``time.sleep(0)`` after each such chunk hands the GIL to a thread that waits
    for it (~1.1x there, the hashing itself)."""
    if chunk > _XXHASH_HOLDS_GIL_UP_TO:  # each hash lets the GIL go by itself
        return [_chunk_digest(view[i:i + chunk]) for i in range(0, len(view), chunk)]
    digests: list[bytes] = []
    for start in range(0, len(view), chunk):
        digests.append(_chunk_digest(view[start:start + chunk]))
        time.sleep(0)
    return digests


def chunk_digests(data: memoryview) -> ChunkDigests:
    """``(chunk size, hashes of the chunks)`` of a payload's bytes, as its marker records them."""
    chunk = chunk_size(len(data))
    view = memoryview(data).cast("B")
    whole = len(view) // chunk * chunk
    tail = [_chunk_digest(view[whole:])] if whole < len(view) else []
    return chunk, b"".join([*_whole_chunk_digests(view[:whole], chunk), *tail])


class ChunkHasher:
    """:func:`chunk_digests` of bytes that arrive in pieces (a copy streamed from another repo)."""

    def __init__(self, size: int) -> None:
        self.chunk = chunk_size(size)
        self._digests: list[bytes] = []
        self._pending = bytearray()

    def update(self, data: memoryview | bytes) -> None:
        view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
        if self._pending:  # a chunk begun by an earlier piece: completed from this one first
            take = min(self.chunk - len(self._pending), len(view))
            self._pending += view[:take]
            view = view[take:]
            if len(self._pending) < self.chunk:
                return
            self._digests.append(_chunk_digest(self._pending))
            self._pending.clear()
        # whole chunks hashed where they are (a weight streamed in pieces of whole chunks is never copied)
        whole = len(view) // self.chunk * self.chunk
        self._digests.extend(_whole_chunk_digests(view[:whole], self.chunk))
        self._pending += view[whole:]

    def digests(self) -> ChunkDigests:
        tail = [_chunk_digest(self._pending)] if self._pending else []
        return self.chunk, b"".join([*self._digests, *tail])


def marker_path(blob: Path) -> Path:
    return Path(f"{blob}.ok")


def write_marker(blob: Path, key: MarkerKey | None, chunks: ChunkDigests | None = None, *, pack: bool = False) -> None:
    """Record ``blob`` (just fully verified; ``pack``: and every member of the pack it is) with its
    chunk hashes: ``chunks`` when the caller computed them from the bytes it wrote, otherwise read
    from the file. Nothing without a ``key``. Backdates the blob's mtime first: any later write stamps
    the current time, which can then never equal the recorded one, even on filesystems with coarse
    timestamps. A plain write, not write-and-rename: a torn or stale marker only fails its MAC or
    no longer matches, and the blob is then re-hashed."""
    if key is None:
        return
    backdated = time.time_ns() - 2_000_000_000
    try:
        with os.fdopen(open_regular(blob), "rb") as handle:  # never through a link planted in the repo
            os.utime(handle.fileno(), ns=(backdated, backdated))
            info = os.fstat(handle.fileno())
            if chunks is None:
                chunks = _chunks(handle.fileno(), info.st_size)
        record = json.dumps({"marker": MARKER_VERSION, "size": info.st_size, "mtime_ns": info.st_mtime_ns,
                             "ctime_ns": info.st_ctime_ns, "ino": info.st_ino, "checked": time.time(),
                             "pack": pack, "chunk_hash": CHUNK_HASH, "chunk": chunks[0]}).encode()
        fd = os.open(marker_path(blob), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "wb") as marker:
            marker.write(b"".join((record, b"\n", key.mac(blob.name, record, chunks[1]), b"\n", chunks[1])))
    except (OSError, CorruptCaptureError):
        pass  # no marker: the blob is fully hashed on its next load


def _chunks(fd: int, size: int) -> ChunkDigests:
    if size == 0:
        return chunk_size(0), b""
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            return chunk_digests(view)
        finally:
            view.release()


def split_marker(data: bytes) -> tuple[bytes, bytes, bytes]:
    """A marker file's ``(record, MAC, chunk hashes)``, as written (nothing checked or parsed).

    Example::

        record, mac, digests = split_marker(marker_path(blob).read_bytes())
        trusted = key.vouches(blob.name, record, digests, mac)
    """
    record, _, rest = data.partition(b"\n")  # neither the JSON nor the hex MAC holds a newline;
    mac, _, digests = rest.partition(b"\n")  # the raw hashes after them may
    return record, mac, digests


def _trusted_record(blob: Path, info: os.stat_result, key: MarkerKey) -> tuple[dict[str, Any], bytes] | None:
    """The marker's record and chunk hashes when this user made it for this repo and blob, and the
    blob is the very file (same inode, size, mtime and ctime) that was checked, less than a month ago.

    A record whose MAC this process checked is kept (``_VOUCHED``) under the identity of the blob
    and of the marker file (inode, size, mtime, ctime) and the key: a load of a 16-blob capture
    read, MAC'd and parsed 16 markers again each time (16 us a blob, a fifth of the sampled check,
    benchmarks/bench_save_load.py). A changed blob or marker misses the memo and is read afresh; a
    memo hit is a record this key vouched for, for this very blob file."""
    try:
        marker = os.lstat(marker_path(blob))
        memo_key = (str(blob), info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, marker.st_ino,
                    marker.st_size, marker.st_mtime_ns, marker.st_ctime_ns, key.secret, key.binding)
        found_digests = _VOUCHED.get(memo_key)
        if found_digests is None:
            data = read_regular(marker_path(blob), limit=_MAX_MARKER_BYTES)  # a larger file is not a marker
            record, mac, digests = split_marker(data)
            if not key.vouches(blob.name, record, digests, mac):
                return None  # another repo's, user's or modulelens's marker, or one made up: hash in full
            found_digests = json.loads(record), digests
            if len(_VOUCHED) >= _VOUCHED_MAX:
                _VOUCHED.clear()
            _VOUCHED[memo_key] = found_digests
        found, digests = found_digests
        if (found["marker"], found["size"], found["mtime_ns"], found["ctime_ns"], found["ino"]) != \
                (MARKER_VERSION, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino):
            return None
        if time.time() - float(found["checked"]) > FULL_CHECK_EVERY_S:
            return None
    except (OSError, ValueError, KeyError, TypeError, CorruptCaptureError):
        return None
    return found, digests


def read_ahead(blob: Path, size: int) -> None:
    """Choose the chunks the next sampled check of ``blob`` compares, and ask the kernel to start
    reading them and the blob's marker now (``POSIX_FADV_WILLNEED``), so that the checks of a load's
    many weight files wait for the disk about once instead of twice a file. With the files out of
    the page cache a 1 GiB load of 16 files read 32 small pieces one after another (1.9x the mmap
    recipe, benchmarks/bench_save_load.py, cold); in the cache this costs a few system calls a file.
    Nothing is checked here: a file that cannot be opened is left to the check."""
    if size < MARK_MIN_BYTES or not hasattr(os, "posix_fadvise"):
        return
    chunk = chunk_size(size)
    count = -(-size // chunk)
    start = _SAMPLE_STARTS.randrange(count)
    if len(_PLANNED) >= _PLANNED_MAX:  # plans of checks that never ran (a load that failed first)
        _PLANNED.clear()
    _PLANNED[str(blob)] = start
    ranges = [((start + i) % count * chunk, chunk) for i in range(min(SAMPLED_CHUNKS, count))]
    for path, wanted in ((marker_path(blob), [(0, 0)]), (blob, ranges)):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            for offset, length in wanted:
                os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


def sampled_check(blob: Path, info: os.stat_result, key: MarkerKey | None, *, pack: bool = False) -> bool | None:
    """``True``: this user's marker for this repo matches ``info`` (and was made checking ``blob``
    as a pack, with ``pack``) and the checked chunks hash as recorded; ``False``: a chunk differs
    (the blob is damaged); ``None``: no usable marker (none, not bound to this repo and user, stale),
    or a full check is due."""
    trusted = _trusted_record(blob, info, key) if key is not None else None
    if trusted is None:
        return None
    record, digests = trusted
    chunk = record.get("chunk")
    if (pack and record.get("pack") is not True) or record.get("chunk_hash") != CHUNK_HASH or type(chunk) is not int:
        return None
    count = -(-info.st_size // chunk)
    if chunk != chunk_size(info.st_size) or len(digests) != count * _DIGEST_BYTES:
        return None
    # SAMPLED_CHUNKS consecutive chunks from a random start (wrapping around): each chunk is as
    # likely to be checked as with scattered picks. Each is read into one reused buffer.
    start = _PLANNED.pop(str(blob), -1)
    if not 0 <= start < count:
        start = _SAMPLE_STARTS.randrange(count)
    indices = [(start + i) % count for i in range(min(SAMPLED_CHUNKS, count))]
    buffer = bytearray(chunk)
    fd = open_regular(blob)
    try:
        for index in indices:
            got = os.preadv(fd, [buffer], index * chunk)
            if _chunk_digest(memoryview(buffer)[:got]) != digests[index * _DIGEST_BYTES:(index + 1) * _DIGEST_BYTES]:
                return False
    finally:
        os.close(fd)
    return True
