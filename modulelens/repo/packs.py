"""Packed payloads: the small payloads of one save stored together in one blob.

A capture of thousands of small tensors (recommendation models, many recorded calls) spent most of
its save and load time on per-file work: one create, preallocation, rename and mmap per payload
(issue 15 measured 21x safetensors on save, 4-6x on load). Payloads under :data:`PACK_BELOW` bytes
are therefore written into packs, at most :data:`PACK_MAX_BYTES` each, while larger payloads keep
their own blob (deduplicated across versions, memory-mapped lazily).

A pack is an ordinary blob: named by the blake3 hash of its whole file, verified, garbage-collected,
pushed, pulled and cached exactly like a payload blob. Its layout (docs/format.md, "Packs")::

    8 bytes     little-endian u64 N: length of the JSON header
    N bytes     {"format": "modulelens.pack", "version": 1, "members": {"<payload hex>": [offset, nbytes]}}
                padded with spaces so the first member starts on a 64-byte boundary
    ...         each member's bytes at its offset (absolute, 64-byte aligned), zero padding between

Capture metadata names its packs in ``packs`` (``[{"payload": "blake3:...", "nbytes": N}]``) and a
packed tensor entry carries ``"pack": <index into packs>`` next to its own ``payload`` hash, so the
content address of every tensor is unchanged and identical small payloads are stored once per pack.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import mmap
import operator
import os
import re
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from modulelens.errors import CorruptCaptureError
from modulelens.format.hashing import HASH_ALGORITHM, HEX64, hash_bytes
from modulelens.repo.files import open_regular, read_regular

if TYPE_CHECKING:
    import torch

    from modulelens.format.spec import TensorEntry
    from modulelens.repo.store import Store

# Measured with benchmarks/bench_repo.py (threshold sweep, 64 payloads per size, median of 7
# interleaved rounds, load average ~12 on 2 cores): per payload, its own blob vs a pack member costs
# 0.72 vs 0.04 ms at 4 KiB, 2.7 vs 1.7 ms at 256 KiB, 10.3 vs 9.2 ms at 1 MiB and 24.8 vs 39.5 ms at
# 4 MiB (a pack is assembled in memory). Below 1 MiB packing wins; above it a blob of its own is as
# cheap and keeps dedup across versions and lazy mmap. 1 MiB is also where verification markers
# start, so loose blobs are exactly the ones trusted by their marker.
PACK_BELOW = 1 << 20
# Bounds the memory a save needs to assemble one pack and the size of one upload to object storage.
PACK_MAX_BYTES = 64 << 20
# Bounds a pack's header, which a load parses whole: 64 MiB of 1-byte members made a header of a
# million members (~95 MiB of JSON; parsing one took 1.3 GiB and 13 s, issue 35). A member's entry
# is at most ~95 bytes, so a pack of at most this many has a header under PACK_HEADER_MAX_BYTES.
PACK_MAX_MEMBERS = 65536
# Larger headers are refused before they are parsed (also leaves room for packs written before the
# member bound: up to ~170,000 members).
PACK_HEADER_MAX_BYTES = 16 << 20
_ALIGN = 64
_FORMAT = "modulelens.pack"
_LENGTH = struct.Struct("<Q")


def _aligned(offset: int) -> int:
    return (offset + _ALIGN - 1) // _ALIGN * _ALIGN


def referenced_blobs(metadata: dict[str, Any]) -> dict[str, int]:
    """Every blob a capture needs, ``{digest: nbytes}``: its loose payloads and its packs (not the
    members of packs, which are not blobs of their own).

    Example::

        repo.download(referenced_blobs(repo.read_metadata("ranker/mlp", 3)))
    """
    blobs = {e["payload"]: e["nbytes"] for e in metadata.get("tensors", {}).values()
             if e.get("payload") and "pack" not in e}
    blobs.update({p["payload"]: p["nbytes"] for p in metadata.get("packs", ())})
    return blobs


_MENTION = re.compile(rb"blake3:[0-9a-f]{64}")


def mentioned_blobs(raws: Iterable[bytes]) -> set[str]:
    """Every payload hash the bytes of some ``capture.json`` files mention (``blake3:<hex>``), read
    without parsing them: a superset of their :func:`referenced_blobs` (pack members too), also for
    a file too damaged to parse. What gc keeps when an index may lie costs a scan in C per version,
    not a parse (benchmarks/bench_repo.py); the versions of a name share most hashes, so they are
    decoded once each. A hash written with JSON escapes (no writer does) is found by parsing such a file."""
    mentions: set[bytes] = set()
    found: set[str] = set()
    for raw in raws:
        mentions.update(_MENTION.findall(raw))
        if b"\\u" in raw:
            with contextlib.suppress(ValueError, RecursionError, TypeError, AttributeError, KeyError):
                found.update(referenced_blobs(json.loads(raw)))
    return found | {m.decode() for m in mentions}


# ------------------------------------------------------------------------------------ writing


@dataclass
class PackPlan:
    """The members of one pack: payload hex -> (offset, view), in write order."""

    members: dict[str, tuple[int, memoryview]]
    size: int = 0


def plan_packs(small: list[tuple[str, memoryview]]) -> list[PackPlan]:
    """Group ``(digest, bytes)`` pairs into packs of at most :data:`PACK_MAX_BYTES` of members and
    :data:`PACK_MAX_MEMBERS` members (a payload already in a pack is stored once)."""
    plans: list[PackPlan] = []
    seen: set[str] = set()
    current = PackPlan({})
    filled = 0
    for digest, data in small:
        hexdigest = digest.partition(":")[2]
        if hexdigest in seen:
            continue
        seen.add(hexdigest)
        if current.members and (filled + len(data) > PACK_MAX_BYTES or len(current.members) >= PACK_MAX_MEMBERS):
            plans.append(current)
            current, filled = PackPlan({}), 0
        current.members[hexdigest] = (filled, data)
        filled = _aligned(filled + len(data))
    if current.members:
        plans.append(current)
    return plans


def build_pack(plan: PackPlan) -> tuple[bytearray, dict[str, int]]:
    """The pack file's bytes, and member hex -> absolute offset."""
    relative = {h: (off, len(data)) for h, (off, data) in plan.members.items()}
    # The header's length depends on the offsets it lists, and they on the header's length: write
    # offsets relative to a data start, then shift them once that start is fixed (it only grows
    # by alignment, and the JSON of larger numbers is at most a few bytes longer per member).
    probe = json.dumps({"format": _FORMAT, "version": 1, "members": relative}, separators=(",", ":"))
    start = _aligned(_LENGTH.size + len(probe) + 20 * len(relative) + 64)
    absolute = {h: [start + off, n] for h, (off, n) in relative.items()}
    header = json.dumps({"format": _FORMAT, "version": 1, "members": absolute}, separators=(",", ":")).encode()
    header = header.ljust(start - _LENGTH.size)
    end = max((off + n for off, n in absolute.values()), default=start)
    buffer = bytearray(end)
    buffer[:_LENGTH.size] = _LENGTH.pack(len(header))
    buffer[_LENGTH.size:start] = header
    view = memoryview(buffer)
    for hexdigest, (_, data) in plan.members.items():
        offset = absolute[hexdigest][0]
        view[offset:offset + len(data)] = data
    view.release()
    return buffer, {h: v[0] for h, v in absolute.items()}


# ------------------------------------------------------------------------------------ reading


def read_header(data: memoryview | bytes | mmap.mmap, where: str) -> dict[str, tuple[int, int]]:
    """``{payload hex: (offset, nbytes)}`` of a pack's bytes, checked to be what this module writes
    (a pack named by its hash may still come from anyone: its header is checked like any input).

    Raises:
        CorruptCaptureError: the bytes are not a modulelens pack.
    """
    try:
        (length,) = _LENGTH.unpack_from(data, 0)
        if length > len(data) - _LENGTH.size:
            raise ValueError(f"a header of {length} bytes in a pack of {len(data)}")
        if length > PACK_HEADER_MAX_BYTES:  # refused before it is parsed
            raise ValueError(f"a header of {length:,} bytes, more than the {PACK_HEADER_MAX_BYTES:,} of a pack of "
                             f"at most {PACK_MAX_MEMBERS:,} members")
        header = json.loads(bytes(data[_LENGTH.size:_LENGTH.size + length]))
        if not isinstance(header, dict) or header.get("format") != _FORMAT:
            raise ValueError("not a modulelens pack")
        if not isinstance(header.get("members"), dict):
            raise ValueError("its members are not a table")
        names, places = list(header["members"]), list(header["members"].values())
        # A load of many small tensors reads thousands of members: each check is one pass in C
        # (per member in Python, they took longer than parsing the header).
        if not _all_hex64(names):
            raise ValueError(f"a member is not named by a payload hash: {_first(names, _not_hex64)[:80]!r}")
        if set(map(type, places)) - {list} or set(map(len, places)) - {2}:
            raise ValueError(f"a member's place is not [offset, length]: {str(_first(places, _not_pair))[:80]}")
        numbers = list(itertools.chain.from_iterable(places))
        if set(map(type, numbers)) - {int} or min(numbers, default=0) < 0:  # (a bool is not an int here)
            raise ValueError(f"a member's place is not [offset, length]: {str(_first(places, _not_span))[:80]}")
    except (ValueError, KeyError, TypeError, struct.error, RecursionError) as error:
        raise CorruptCaptureError(f"{where} is not a valid payload pack: {str(error)[:200]}") from None
    offsets, sizes = numbers[0::2], numbers[1::2]
    if min(offsets, default=len(data)) < _LENGTH.size + length or max(map(operator.add, offsets, sizes), default=0) > len(data):
        outside = next(n for n, (o, size) in zip(names, places, strict=True)
                       if o < _LENGTH.size + length or o + size > len(data))
        raise CorruptCaptureError(f"{where}: member {outside} lies outside the pack")
    return dict(zip(names, map(tuple, places), strict=True))  # (pairs, checked above)


def _all_hex64(names: list[str]) -> bool:
    """Whether every name is 64 lowercase hex digits (a regex over them all took 1.5 ms at 5,600)."""
    joined = "".join(names)
    try:  # (fromhex also takes upper case and spaces: only lowercase hex survives the round trip)
        return set(map(len, names)) <= {64} and bytes.fromhex(joined).hex() == joined
    except ValueError:
        return False


_Item = TypeVar("_Item")


def _first(items: list[_Item], bad: Callable[[_Item], bool]) -> _Item:
    return next(item for item in items if bad(item))


def _not_hex64(name: str) -> bool:
    return not HEX64.fullmatch(name)


def _not_pair(place: object) -> bool:
    return type(place) is not list or len(place) != 2


def _not_span(place: list[object]) -> bool:
    return not all(type(v) is int and v >= 0 for v in place)


def check_members(path: Path) -> None:
    """Check that every member of the pack at ``path`` hashes to the name its header gives it.

    A pack is named by the hash of its whole file, which says nothing about whether its header
    points each payload hash at those very bytes: a received pack whose header pointed the bias's
    hash at the weight's bytes loaded the wrong bias, silently (issue 21). Loads therefore check
    every member whenever they check the pack's own hash (:meth:`Store.blob_file
    <modulelens.repo.store.Store.blob_file>` with ``pack=True``).

    Raises:
        CorruptCaptureError: a member does not match its hash, or the header is not a pack's.
    """
    with os.fdopen(open_regular(path), "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            raise CorruptCaptureError(f"{path} is not a valid payload pack: it is empty")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                for hexdigest, (offset, nbytes) in read_header(mapped, str(path)).items():
                    if hash_bytes(view[offset:offset + nbytes], threads=False).partition(":")[2] != hexdigest:
                        raise CorruptCaptureError(f"pack {path}: member {hexdigest} does not match its hash")
            finally:
                view.release()


class _Pack:
    """One pack, memory-mapped once. Members are handed out as copy-on-write views of a private
    mapping; a member asked for a second time is copied from a read-only mapping, so every tensor
    handed out is independent (what the loader promises for parameters vs ``Capture.tensor``)."""

    def __init__(self, path: Path) -> None:
        with os.fdopen(open_regular(path), "rb") as handle:  # never through a link (check_blob lstat'd it)
            self._private = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
            self._pristine = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        self.members = read_header(self._pristine, str(path))
        self._handed: set[str] = set()

    def tensor(self, hexdigest: str, dtype: torch.dtype, nbytes: int) -> torch.Tensor:
        offset, stored = self.members[hexdigest]
        if stored != nbytes:
            raise CorruptCaptureError(f"pack member {hexdigest} has {stored} bytes, expected {nbytes}")
        import torch  # here, not at the top: listing captures must not import torch

        if hexdigest in self._handed:
            return torch.frombuffer(bytearray(self._pristine[offset:offset + nbytes]), dtype=dtype)
        self._handed.add(hexdigest)
        # A storage of its own that starts at the member (not a slice of one storage over the
        # file): readers rebuild views with as_strided, whose offsets count from the storage start.
        return torch.frombuffer(self._private, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset)

    def member_bytes(self, hexdigest: str) -> bytes:
        offset, nbytes = self.members[hexdigest]
        return self._pristine[offset:offset + nbytes]


class Payloads:
    """The payloads of one capture in one repo: loose blobs and pack members alike.

    Args:
        store: the store of the repo holding the capture (an object store downloads into its
            cache first).
        metadata: the capture's metadata (its ``tensors`` and ``packs``).

    Example::

        payloads = repo.payloads(repo.read_metadata("lin", 1))
        weight = payloads.open_tensor(entry)      # entry = metadata["tensors"]["t0"]
    """

    def __init__(self, store: Store, metadata: dict[str, Any]) -> None:
        self.store = store
        self._packs = list(metadata.get("packs", ()))
        self._open: dict[int, _Pack] = {}

    def read_ahead(self, entries: Iterable[dict[str, Any]]) -> None:
        """Start reading what the checks of these entries' payloads will read, all at once, before
        a load opens them one by one (:meth:`~modulelens.repo.store.Store.read_ahead`)."""
        blobs = {entry["payload"]: entry["nbytes"] for entry in entries
                 if "pack" not in entry and isinstance(entry.get("payload"), str) and type(entry.get("nbytes")) is int}
        if blobs:
            self.store.read_ahead(blobs)

    def _pack(self, index: int) -> _Pack:
        pack = self._open.get(index)
        if pack is None:
            try:
                info = self._packs[index]
            except (IndexError, TypeError):
                raise CorruptCaptureError(f"a tensor refers to pack {index!r}, which the capture does not list") from None
            path = self.store.blob_file(info["payload"], info["nbytes"], pack=True)
            try:
                pack = _Pack(path)
            except FileNotFoundError:  # freed meanwhile by a gc (after an rm of the version being loaded)
                raise CorruptCaptureError(f"payload {info['payload']} is missing (freed since it was checked)") from None
            self._open[index] = pack
        return pack

    def _member(self, index: int, payload: str) -> tuple[_Pack, str]:
        """The pack at ``index`` of the capture's packs and the member name of ``payload`` in it."""
        pack = self._pack(index)
        hexdigest = _hex(payload)
        if hexdigest not in pack.members:
            raise CorruptCaptureError(f"payload {payload} is missing from pack {self._packs[index]['payload']}")
        return pack, hexdigest

    def open_tensor(self, entry: dict[str, Any], dtype: torch.dtype) -> torch.Tensor:
        """A tensor entry's payload, shaped; never shares memory with the stored bytes' file."""
        shape = entry["shape"]
        import torch  # here, not at the top: listing captures must not import torch

        numel = 1
        for size in shape:
            numel *= size
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        if "pack" not in entry:
            # copy-on-write: nothing is read until used, and writing to the tensor never touches the blob
            path = self.store.blob_file(entry["payload"], entry["nbytes"])
            return torch.from_file(str(path), shared=False, size=numel, dtype=dtype).view(shape)
        pack, hexdigest = self._member(entry["pack"], entry["payload"])
        return pack.tensor(hexdigest, dtype, entry["nbytes"]).view(shape)

    def check(self, entry: dict[str, Any], *, full: bool = False) -> None:
        """Check one payload: its blob (or its pack) by size and hash, and a pack member's own hash
        with ``full``.

        Raises:
            CorruptCaptureError: the payload is missing, truncated or does not match its hash.
        """
        if "pack" not in entry:
            self.store.blob_file(entry["payload"], entry["nbytes"], full=full)
            return
        if full:
            info = self._packs[entry["pack"]]
            self.store.blob_file(info["payload"], info["nbytes"], full=True, pack=True)
        pack, hexdigest = self._member(entry["pack"], entry["payload"])
        if full and hash_bytes(pack.member_bytes(hexdigest)) != entry["payload"]:
            raise CorruptCaptureError(f"pack member {entry['payload']} is corrupted")

    def read_bytes(self, entry: TensorEntry) -> bytes:
        """A payload's raw bytes (row-major, little-endian, as stored)."""
        if "pack" not in entry:
            return read_regular(self.store.blob_file(entry["payload"], entry["nbytes"]))
        pack, hexdigest = self._member(entry["pack"], entry["payload"])
        return pack.member_bytes(hexdigest)


def _hex(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    if algorithm != HASH_ALGORITHM:
        raise CorruptCaptureError(f"malformed payload hash {digest!r}")
    return hexdigest


def pack_payloads(metadata: dict[str, Any], small: dict[str, memoryview]) -> Iterator[tuple[str, bytearray]]:
    """Hash ``small`` payloads (tensor id -> bytes), pack them and record the packs in
    ``metadata``; yields each pack's ``(digest, bytes)`` for the caller to store, one at a time
    (memory holds one pack). A pack already stored (an identical save) is then not written again."""
    entries = metadata["tensors"]
    # Inline hashing: for payloads under 1 MiB a worker thread's hand-off costs more than the hash.
    digests = {tid: hash_bytes(data, threads=False) for tid, data in small.items()}
    packs = metadata.setdefault("packs", [])
    where: dict[str, int] = {}
    for plan in plan_packs([(digest, small[tid]) for tid, digest in digests.items()]):
        data, _ = build_pack(plan)
        digest = hash_bytes(memoryview(data))
        yield digest, data
        where.update(dict.fromkeys(plan.members, len(packs)))
        packs.append({"payload": digest, "nbytes": len(data)})
    for tid, digest in digests.items():
        entries[tid]["payload"] = digest
        entries[tid]["pack"] = where[digest.partition(":")[2]]
