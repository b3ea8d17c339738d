"""Per-name indexes: list, resolve and gc without reading every capture file, at a cost that does
not grow with the versions of a name (layout 3, docs/repo-layout.md "Per-name indexes").

Each name has an index whose *head* is ``names/<name>/summary.json``: the highest number ever
used, the latest visible version, the aliases, and the writes in progress::

    {"summary": 2, "used": 7, "latest": 7, "count": 6, "aliases": {"golden": 3},
     "reserved": {"8": {"by": "host:pid:id", "at": 1733000000.0}}, "removing": [], "changing": {},
     "log": 1, "log_bytes": 4096, "dead": 0}              # a store that appends (a directory)
     "versions": {"3": {"created": ..., "blobs": [...]}}   # a store that cannot (object storage)

Entries (what a listing shows of a version, and the blobs it references, for gc) are kept where
each save costs the same however many versions there are: in a directory, appended as one JSON line
to ``names/<name>/summary-<log>.log`` (the head says how many of its bytes are valid, so a line a
crashed writer left beyond them is only counted once a later writer covers it); on object storage,
in the head itself (one object per name: a listing reads one object per name).

Every writer of a name changes its head with compare-and-swap (:meth:`Store.swap
<modulelens.repo.store.Store.swap>`: an ``flock`` and a rename in a directory, ``If-Match`` on S3)
and announces what it is about to do first, so that a writer that crashes anywhere leaves an index
that readers still read right:

* a save *reserves* its number (``reserved``, ``used`` + 1), publishes the version, then *finishes*
  (its entry in, its reservation out, ``latest``). A reader looks whether each reserved number is
  visible yet (one ``lstat`` or one request each; none in the usual case, where nothing is
  reserved), so a version whose writer crashed before finishing is still listed; the next writer
  adopts it (or drops the reservation of a writer that died before publishing).
* ``rm`` marks the numbers it removes (``removing``: readers no longer show them), removes them,
  then drops their entries; an alias move names the alias in ``changing`` (readers read that
  alias's own file) until its file is written and the head has its new value.

A missing head, a layout-2 summary, or a head whose log cannot be read is rebuilt from a scan of the
name's folders (reading never writes: readers rebuild in memory; writers store what they rebuilt).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import operator
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import xxhash

from modulelens.errors import CaptureNotFoundError, CorruptCaptureError, RemoteRepoError, RepoBusyError
from modulelens.repo.layout import (
    CAPTURE_FILE,
    MAX_VERSION,
    NOTES_FILE,
    SUMMARY_FILE,
    max_metadata_bytes,
    summary_log,
    unquote_name,
)
from modulelens.repo.packs import mentioned_blobs, referenced_blobs
from modulelens.repo.store import Store

__all__ = ["SUMMARY_FILE", "NameIndex", "Summaries", "damaged_entry", "listing_stamp", "version_entry"]

Entry = dict[str, Any]
#: Reads the entries of ``versions`` of a name: number -> entry, or ``None`` for one removed meanwhile.
EntryReader = Callable[[str, Iterable[int]], dict[int, Entry | None]]
T = TypeVar("T")

FORMAT = 2  # "summary": 2 (layout 3); 1 was layout 2's cache, checked by folder stamps
# A reservation whose writer is gone: its process is dead (same host), or it is older than this.
_STALE_RESERVATION_S = 24 * 3600.0
# Compact a log when it holds more lines of removed versions than this and than live entries.
_COMPACT_DEAD = 256
_SWAP_ATTEMPTS = 1000
_SESSION = uuid.uuid4().hex[:12]


def _writer() -> str:
    """Who writes: host and process (a reservation of a dead process is let go), and this session."""
    return f"{os.uname().nodename}:{os.getpid()}:{_SESSION}"  # the host name, without importing socket

# What a read of an index file may raise that means "nothing usable here" (rebuilt from a scan).
_UNREADABLE = (OSError, CorruptCaptureError, CaptureNotFoundError, RemoteRepoError)


def version_entry(metadata: dict[str, Any]) -> Entry:
    """What the index keeps of one version's metadata."""
    return {
        "created": metadata.get("created", ""),
        "tags": list(metadata.get("tags", ())),
        "nbytes": sum(t["nbytes"] for t in metadata.get("tensors", {}).values() if t.get("payload")),
        "module_class": metadata.get("module", {}).get("class", ""),
        "calls": len(metadata.get("calls", ())),
        "blobs": sorted(referenced_blobs(metadata)),
    }


def damaged_entry(raw: bytes, problem: str) -> Entry:
    """The entry of a version whose metadata cannot be read: it still lists (with its problem),
    and gc keeps every payload hash its file mentions, in case a repair needs them."""
    blobs = sorted(mentioned_blobs([raw]))
    return {"created": "", "tags": [], "nbytes": 0, "module_class": "", "calls": 0, "blobs": blobs, "problem": problem}


def complete(entry: Entry | None) -> bool:
    return entry is not None and "blobs" in entry  # a pending entry ({}) is read from capture.json when asked for


@dataclass
class NameIndex:
    """One name's index as it is now: the head, and (:attr:`versions`) the entries when loaded.

    ``versions`` maps each visible version number to its entry, ``{}`` while it is
    pending (known to be visible, its entry not read yet). ``stored`` says whether the head came
    from the store (else it was rebuilt from a scan); ``tag`` is what the next swap compares against.
    """

    used: int = 0
    latest: int = 0
    count: int = 0
    aliases: dict[str, int] = field(default_factory=dict)
    reserved: dict[str, dict[str, Any]] = field(default_factory=dict)
    removing: list[int] = field(default_factory=list)
    changing: dict[str, dict[str, Any]] = field(default_factory=dict)  # alias -> the writer moving it
    log: int = 0
    log_bytes: int = 0
    dead: int = 0
    versions: dict[int, Entry] | None = None
    tag: str | None = None
    stored: bool = False

    def numbers(self) -> list[int]:
        """The visible version numbers (:attr:`versions` must be loaded)."""
        assert self.versions is not None
        return sorted(self.versions)

    def head_json(self, *, appends: bool) -> bytes:
        """The head's bytes: JSON whose first field is a checksum of the rest (a directory rewrites
        the head in place, so a reader can catch a torn read: :func:`_parse_head`)."""
        head: dict[str, Any] = {"summary": FORMAT, "used": self.used, "latest": self.latest, "count": self.count,
                                "aliases": dict(sorted(self.aliases.items())), "reserved": self.reserved,
                                "removing": sorted(self.removing), "changing": self.changing}
        if appends:
            head.update(log=self.log, log_bytes=self.log_bytes, dead=self.dead)
        else:
            head["versions"] = {str(k): _plain(e) for k, e in sorted((self.versions or {}).items())}
        body = json.dumps(head, separators=(",", ":")).encode()[1:]  # from the first key on
        return b'{"check":"' + xxhash.xxh3_64_hexdigest(body).encode() + b'",' + body


def _plain(entry: Entry) -> Entry:
    return {k: v for k, v in entry.items() if k not in ("id", "v")}


def _line(number: int, entry: Entry) -> bytes:
    return json.dumps({"v": number, **_plain(entry)}, separators=(",", ":")).encode() + b"\n"


def _parse_head(raw: bytes | None, *, appends: bool) -> NameIndex | None:
    """A stored head of this format, or ``None`` (missing, a layout-2 summary, damaged, forged, or a
    read torn by a concurrent rewrite in place: its checksum does not match)."""
    try:
        return _checked_head(raw, appends=appends)
    except _BadHeadError:
        return None


class _BadHeadError(Exception):
    """Why a stored head is not used (:func:`head_problem` tells fsck)."""


def head_problem(raw: bytes | None, *, appends: bool) -> str | None:
    """Why a stored head would not be used (readers and writers rebuild the index from the folders
    instead), ``None`` when it would be, or when there is none or it is a layout-2 summary."""
    if not raw or not raw.startswith(b'{"check":"'):
        return None
    try:
        _checked_head(raw, appends=appends)
    except _BadHeadError as error:
        return str(error)
    return None


def _checked_head(raw: bytes | None, *, appends: bool) -> NameIndex | None:
    if not raw or not raw.startswith(b'{"check":"'):
        return None  # missing, or a layout-2 summary (rebuilt, reusing its entries)
    if raw[26:28] != b'",' or xxhash.xxh3_64_hexdigest(raw[28:].rstrip()).encode() != raw[10:26]:
        raise _BadHeadError("its checksum does not match (damaged, or a read torn by a concurrent write)")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise _BadHeadError(f"not JSON ({error})") from None
    if not isinstance(data, dict) or data.get("summary") != FORMAT:
        raise _BadHeadError(f"not an index head of format {FORMAT}")
    try:
        index = _head_fields(data, appends=appends)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
        raise _BadHeadError(str(error)[:200]) from None
    return index


def _number(data: Mapping[str, object], key: str, *, high: int = MAX_VERSION, default: int | None = None) -> int:
    """``data[key]``, a whole number in ``[0, high]`` (a bool, a float or a number out of range is a
    forged or damaged head: ``used = 10**30`` would make the next save ``v1000...001``)."""
    value = data.get(key, default) if default is not None else data[key]
    if type(value) is not int or not 0 <= value <= high:
        raise ValueError(f"{key} is {str(value)[:40]}, not a whole number from 0 to {high:,}")
    return value


def _version_number(value: object, used: int, what: str) -> int:
    """A version number the head names: 1 to ``used`` (the highest number ever taken)."""
    number = int(value) if type(value) is str and value.isdigit() and len(value) <= 10 else value
    if type(number) is not int or not 1 <= number <= used:
        raise ValueError(f"{what} is {str(value)[:40]}, not a version from 1 to used ({used})")
    return number


def _head_fields(data: dict[str, Any], *, appends: bool) -> NameIndex:
    """The head's fields, each checked for its type and range and against the others."""
    used = _number(data, "used")
    latest = _number(data, "latest", high=used)
    aliases, reserved, changing = data["aliases"], data.get("reserved", {}), data.get("changing", {})
    removing = data.get("removing", [])
    if not (type(aliases) is dict and type(reserved) is dict and type(changing) is dict and type(removing) is list):
        raise ValueError("aliases, reserved or changing is not a table, or removing not a list")
    if not all(type(v) is dict for v in (*reserved.values(), *changing.values())):
        raise ValueError("a reservation or an alias move is not a table")
    index = NameIndex(used=used, latest=latest, count=_number(data, "count", default=0),
                      aliases={str(k): _version_number(v, used, f"alias {str(k)[:40]!r}") for k, v in aliases.items()},
                      reserved={str(_version_number(k, used, "a reserved number")): dict(v) for k, v in reserved.items()},
                      removing=[_version_number(n, used, "a number being removed") for n in removing],
                      changing={str(k): dict(v) for k, v in changing.items()}, stored=True)
    if appends:
        index.log, index.dead = _number(data, "log"), _number(data, "dead", default=0)
        index.log_bytes = _number(data, "log_bytes", high=max_metadata_bytes())
    else:
        versions = data["versions"]
        if type(versions) is not dict or not all(type(v) is dict for v in versions.values()):
            raise ValueError("versions is not a table of entries")
        index.versions = {_version_number(k, used, "a listed version"): dict(v) for k, v in versions.items()}
    return index


def _parse_log(data: bytes) -> dict[int, Entry] | None:
    """The entries a log's valid bytes leave (later lines win; ``rm`` lines remove); ``None`` when a
    line is damaged (a power cut tore it: the index is rebuilt). An entry keeps its ``"v"``."""
    if not data:
        return {}
    try:
        lines = json.loads(b"[" + data.rstrip(b"\n").replace(b"\n", b",") + b"]")
        # The usual log, only entries, in one comprehension (a listing's hot path): an ``rm`` line has
        # no "v" and sends the log to the loop below, which also says whether a line is damaged.
        with contextlib.suppress(KeyError, TypeError):
            return {line["v"]: line for line in lines}
        entries: dict[int, Entry] = {}
        for line in lines:
            if "rm" in line:
                entries.pop(line["rm"], None)
            else:
                entries[line["v"]] = line
        return entries
    except (ValueError, RecursionError, TypeError, KeyError):
        return None


def _stale(reservation: dict[str, Any], now: float) -> bool:
    """Whether a reservation's writer is gone: a dead process on this host, or a day old."""
    host, _, rest = str(reservation.get("by", "")).partition(":")
    pid = rest.partition(":")[0]
    if host == os.uname().nodename and pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except OSError:
            pass
    return now - float(reservation.get("at", 0)) > _STALE_RESERVATION_S


class Summaries:
    """The indexes of one repo's names.

    Args:
        store: the repo's store.
        read_entries: reads the entries of versions an index lacks (``Repo``: from their
            ``capture.json``, a damaged one as :func:`damaged_entry`).
        before_write: called before an index is written (``Repo``: marks an older repo layout 3).
    """

    def __init__(self, store: Store, read_entries: EntryReader, before_write: Callable[[], None]) -> None:
        self.store = store
        self._read_entries = read_entries
        self._before_write = before_write
        self._appends = store.appends

    # ------------------------------------------------------------------------------ reading

    def head(self, name: str, prefix: str) -> NameIndex:
        """The head as readers use it (entries not loaded where they are in a log): reserved
        numbers that are visible are added as pending versions, aliases being moved read from
        their files; a missing or older head is rebuilt from a scan, in memory."""
        index = self._stored(prefix)
        if index is None:
            return self._rebuilt(name, prefix, None)
        self._reader_view(name, prefix, index)
        return index

    def heads(self, named: list[tuple[str, str]], *, skip_damaged: bool = False) -> Iterator[tuple[str, str, NameIndex]]:
        """``(name, prefix, head)`` of each ``(name, prefix)``, their heads read together;
        ``skip_damaged``: a name whose folders cannot be read (a link, a file where a folder
        belongs: ``CorruptCaptureError``) is left out instead of raising."""
        raws = self._prefetch(named)
        for name, prefix in named:
            try:
                index = self._stored(prefix, raw=raws.get(prefix))
                if index is None:
                    index = self._rebuilt(name, prefix, None)
                else:
                    self._reader_view(name, prefix, index)
            except CorruptCaptureError:
                if not skip_damaged:
                    raise
                continue
            yield name, prefix, index

    def listings(self, named: list[tuple[str, str]], *, fill: bool = True, persist: bool = False,
                 skip_damaged: bool = False) -> Iterator[tuple[str, str, NameIndex]]:
        """:meth:`listing` of each ``(name, prefix)``; readers read the heads together (on object
        storage, concurrently: one request per name). ``skip_damaged``: as in :meth:`heads`."""
        raws = {} if persist else self._prefetch(named)
        for name, prefix in named:
            try:
                index = self.listing(name, prefix, fill=fill, persist=persist, raw=raws.get(prefix))
            except CorruptCaptureError:
                if not skip_damaged:
                    raise
                continue
            yield name, prefix, index

    def _prefetch(self, named: list[tuple[str, str]]) -> dict[str, bytes]:
        keys = {f"{prefix}/{SUMMARY_FILE}": prefix for _, prefix in named}
        return {keys[key]: data for key, data in self.store.read_many(list(keys)).items()}

    def listing(self, name: str, prefix: str, *, fill: bool = True, persist: bool = False,
                raw: bytes | None = None) -> NameIndex:
        """The index with every entry loaded (``fill``: pending entries read from their capture files;
        ``persist``: a writer stores an index it had to rebuild; ``raw``: its head, read already)."""
        index = self._stored(prefix, tagged=persist, raw=raw)
        if index is not None and index.versions is None:
            entries = self._log_entries(prefix, index)
            if entries is None:  # rewritten meanwhile (compacted): read the head again
                index = self._stored(prefix, tagged=persist)
                entries = None if index is None else self._log_entries(prefix, index)
            if entries is None or index is None:
                index = None
            else:
                index.versions = entries
        if index is None:
            tag = self._tag(prefix) if persist else None  # before the scan: a write after it fails the swap
            index = self._rebuilt(name, prefix, None)
            if persist:
                self._before_write()
                self.fill(name, index)
                with contextlib.suppress(OSError, CorruptCaptureError, RepoBusyError):
                    return self._store_rebuilt(name, prefix, index, tag=tag)
        else:
            self._reader_view(name, prefix, index)
        if fill:
            self.fill(name, index)
        return index

    def fill(self, name: str, index: NameIndex, versions: Iterable[int] | None = None) -> None:
        """Read the entries ``index`` lacks (of ``versions``, default all); a version removed
        meanwhile leaves it."""
        entries = index.versions
        assert entries is not None
        if versions is None:
            # every entry a log holds is complete: the usual listing has nothing to read, and learns
            # that in one pass in C (at 100,000 versions a loop in Python cost 10 ms of ~300)
            if all(map(operator.contains, entries.values(), itertools.repeat("blobs"))):
                return
            wanted = [k for k, e in entries.items() if "blobs" not in e]
        else:
            wanted = [v for v in versions if v in entries and not complete(entries[v])]
        if not wanted:
            return
        for number, entry in self._read_entries(name, wanted).items():
            if entry is None:
                entries.pop(number, None)
            else:
                entries[number] = entry

    def stored_entries(self, name: str, prefix: str) -> tuple[dict[str, Entry], bool] | None:
        """The entries readers take from the stored index without reading capture files (fsck
        checks them: gc frees what they do not list), and whether they must list every version (an
        index of this layout; a layout-2 summary's entries are reused one by one); ``None`` when
        nothing stored is trusted."""
        index = self._stored(prefix)
        if index is None:
            legacy = self._legacy(prefix)
            if not legacy:
                return None
            scan = self.store.scan(prefix, aliases=False)
            return {k: e for k, e in legacy.items() if k.isdigit() and complete(e)
                    and e.get("id") == scan.versions.get(int(k), "absent")}, False
        entries = index.versions if index.versions is not None else self._log_entries(prefix, index)
        if entries is None:
            return None
        pending = {k for k in index.reserved if int(k) not in entries  # visible: readers read their capture files
                   and self.store.exists(f"{prefix}/versions/{k}/{CAPTURE_FILE}")}
        # versions an rm marked (readers no longer show them): one that stopped midway leaves them for
        # gc to finish, so they are marked, not missing
        removing = {str(k): {"removing": True} for k in index.removing}
        return ({str(k): e for k, e in entries.items() if k not in index.removing} | {k: {} for k in pending}
                | removing), True

    def head_problem(self, prefix: str) -> str | None:
        """Why the stored head of the name at ``prefix`` is not used (damaged or forged: the index is
        rebuilt from the folders instead), for fsck; ``None`` when it is used or there is none."""
        for _attempt in range(2):  # (a read torn by a writer rewriting the head fails its checksum once)
            try:
                raw = self.store.read(f"{prefix}/{SUMMARY_FILE}")
            except _UNREADABLE as error:
                return str(error) if isinstance(error, CorruptCaptureError) else None
            problem = head_problem(raw, appends=self._appends)
            if problem is None or "checksum" not in problem:
                break
        if problem is None and raw and (index := _parse_head(raw, appends=self._appends)) is not None \
                and index.versions is None and self._log_entries(prefix, index) is None:
            return "its log cannot be read, or lists versions above the highest number the head says was used"
        return problem

    def _stored(self, prefix: str, *, tagged: bool = False, raw: bytes | None = None) -> NameIndex | None:
        """The stored head, or ``None``; ``tagged`` (a writer about to swap it): with its tag (a
        reader reads without one, which also works offline from the mirror); ``raw``: read already."""
        key = f"{prefix}/{SUMMARY_FILE}"
        tag = None
        if raw is None:
            try:
                raw, tag = self.store.read_tagged(key) if tagged else (self.store.read(key), None)
            except _UNREADABLE:
                return None
        index = _parse_head(raw, appends=self._appends)
        if index is not None:
            index.tag = tag
        return index

    def _tag(self, prefix: str) -> str | None:
        try:
            return self.store.read_tagged(f"{prefix}/{SUMMARY_FILE}")[1]
        except (OSError, CorruptCaptureError):
            return None

    def _log_entries(self, prefix: str, index: NameIndex) -> dict[int, Entry] | None:
        if index.log == 0:
            return {}
        try:
            data = self.store.read(f"{prefix}/{summary_log(index.log)}")
        except _UNREADABLE:
            return None
        if data is None or len(data) < index.log_bytes:
            return None
        entries = _parse_log(data[:index.log_bytes])
        # Each entry's number is one the head says was taken (a log of a forged or damaged head, or
        # a forged line, is not used: the index is rebuilt from the folders). Checked in C passes:
        # a listing of 100,000 versions reads them all.
        if entries and (set(map(type, entries)) != {int} or min(entries) < 1 or max(entries) > index.used):
            return None
        return entries

    def _reader_view(self, name: str, prefix: str, index: NameIndex) -> None:
        """What a stored head says once writes in progress are looked at (never written back)."""
        for number in index.removing:
            if index.versions is not None:
                index.versions.pop(number, None)
        for key in list(index.reserved):
            number = int(key)
            if number not in index.removing and self.store.exists(f"{prefix}/versions/{number}/{CAPTURE_FILE}"):
                index.latest = max(index.latest, number)
                if index.versions is not None:
                    index.versions.setdefault(number, {})
        for alias in index.changing:
            self._alias_from_file(prefix, index, alias)
        if index.versions is not None and index.latest not in index.versions:
            index.latest = max(index.versions, default=0)

    def _alias_file(self, prefix: str, alias: str) -> int | None:
        try:
            data = self.store.read(f"{prefix}/aliases/{alias}")
            return int(data.decode().strip()) if data is not None else None
        except (ValueError, *_UNREADABLE):
            return None

    def _legacy(self, prefix: str) -> dict[str, Entry]:
        """A layout-2 summary's entries (with the identities of their folders), to reuse. Only
        directories kept them (layout 2 wrote no summary object to object storage)."""
        if not self._appends:
            return {}
        try:
            data = json.loads(self.store.read(f"{prefix}/{SUMMARY_FILE}") or b"null")
        except (ValueError, RecursionError, *_UNREADABLE):
            return {}
        if isinstance(data, dict) and data.get("summary") == 1 and isinstance(data.get("versions"), dict):
            return {str(k): v for k, v in data["versions"].items() if isinstance(v, dict)}
        return {}

    def _rebuilt(self, name: str, prefix: str, previous: dict[int, Entry] | None) -> NameIndex:
        """An index from a scan of the name's folders: entries of ``previous`` (by number: numbers
        are never reused) or of a layout-2 summary (by folder identity) kept, the others pending."""
        scan = self.store.scan(prefix)
        legacy = self._legacy(prefix) if previous is None else {}
        versions: dict[int, Entry] = {}
        for number, identity in scan.versions.items():
            kept = (previous or {}).get(number)
            key = str(number)
            if kept is None and key in legacy and legacy[key].get("id") == identity and identity is not None:
                kept = _plain(legacy[key])
            versions[number] = dict(kept) if kept is not None and complete(kept) else {}
        return NameIndex(used=scan.used, latest=max(scan.versions, default=0), count=len(versions),
                         aliases=dict(scan.aliases), versions=versions)

    # ------------------------------------------------------------------------------ writing

    def reserve(self, name: str, prefix: str, count: int = 1) -> tuple[list[int], bool]:
        """Reserve ``count`` new numbers (above every number ever used) for versions about to be
        published; also adopts visible versions of writers that crashed and drops reservations of
        writers that died before publishing. Returns the numbers and whether the index they came from
        was stored (so no tombstone can be at them)."""

        def change(index: NameIndex) -> tuple[list[int], bool]:
            self._tidy(name, prefix, index)
            first = index.used + 1
            now = time.time()
            for number in range(first, first + count):
                index.reserved[str(number)] = {"by": _writer(), "at": now}
            index.used += count
            return list(range(first, first + count)), index.stored
        return self._update(name, prefix, change)[1]

    def finish(self, name: str, prefix: str, entries: dict[int, Entry], *, released: Iterable[int] = ()) -> NameIndex:
        """Record versions just published (their reservations end); ``released``: reserved numbers
        given up unused (taken by a writer the index did not know of: it is rebuilt)."""
        lines = b"".join(_line(n, e) for n, e in sorted(entries.items()))
        appended: dict[int, int] = {}  # log generation -> where our lines end in it
        cancelled: dict[int, int] = {}  # log generation -> where the rm lines of versions removed meanwhile end

        def change(index: NameIndex) -> None:
            if self._appends:
                if entries and index.log == 0:
                    index.log = 1
                if entries and index.log not in appended:
                    appended[index.log] = self.store.append(f"{prefix}/{summary_log(index.log)}", lines)
                index.log_bytes = max(index.log_bytes, appended.get(index.log, 0))
            else:
                assert index.versions is not None
                index.versions.update({n: _plain(e) for n, e in entries.items()})
            # An rm that saw a version reserved and visible may have removed it between its publish
            # and now; its entry must not bring it back (the race row found versions listed whose
            # folders were gone). Looked at after our lines are in: an rm that removes it later
            # appends its own line after ours.
            gone = [n for n in entries if not self.store.exists(f"{prefix}/versions/{n}/{CAPTURE_FILE}")]
            if gone and self._appends:
                if index.log not in cancelled:
                    cancelled[index.log] = self.store.append(f"{prefix}/{summary_log(index.log)}",
                                                             b"".join(json.dumps({"rm": n}).encode() + b"\n" for n in gone))
                index.log_bytes = max(index.log_bytes, cancelled[index.log])
                index.dead += len(gone)
            for number in gone:
                (index.versions or {}).pop(number, None)
            for number in (*entries, *released):
                index.reserved.pop(str(number), None)
            kept = [n for n in entries if n not in gone]
            index.count += len(kept)
            if entries:
                index.used = max(index.used, *entries)
            if kept:
                index.latest = max(index.latest, *kept)
        return self._update(name, prefix, change)[0]

    def begin_removal(self, name: str, prefix: str, numbers: Iterable[int]) -> NameIndex:
        """Mark ``numbers`` as being removed: readers no longer show them from now on."""
        doomed = set(numbers)

        def change(index: NameIndex) -> None:
            index.removing = sorted(set(index.removing) | doomed)
            if index.latest in doomed:
                index.latest = self._latest_below(prefix, index, index.latest)
        return self._update(name, prefix, change)[0]

    def end_removal(self, name: str, prefix: str, numbers: Iterable[int], *, cancelled: Iterable[int] = ()) -> NameIndex:
        """Drop the entries of versions now removed (their tombstones are written); ``cancelled``:
        marked but not removed (an error), shown again."""
        gone = sorted(set(numbers))
        back = set(cancelled)
        appended: dict[int, int] = {}
        lines = b"".join(json.dumps({"rm": n}).encode() + b"\n" for n in gone)

        def change(index: NameIndex) -> None:
            if self._appends:
                if gone and index.log and index.log not in appended:
                    appended[index.log] = self.store.append(f"{prefix}/{summary_log(index.log)}", lines)
                index.log_bytes = max(index.log_bytes, appended.get(index.log, 0))
                index.dead += len(gone)
            else:
                for number in gone:
                    (index.versions or {}).pop(number, None)
            index.removing = [n for n in index.removing if n not in gone and n not in back]
            index.count = max(0, index.count - len(gone))
            if index.latest in gone:
                index.latest = self._latest_below(prefix, index, index.latest)
            if back:
                index.latest = max(index.latest, *back)
        index = self._update(name, prefix, change)[0]
        if self._appends and index.dead > max(_COMPACT_DEAD, index.count):
            with contextlib.suppress(OSError, CorruptCaptureError, RepoBusyError):
                self.compact(name, prefix)
        return index

    def begin_alias(self, name: str, prefix: str, alias: str) -> None:
        """Announce that ``alias`` is being moved (readers read its file until :meth:`end_alias`)."""

        def change(index: NameIndex) -> None:
            index.changing[alias] = {"by": _writer(), "at": time.time()}
        self._update(name, prefix, change)

    def end_alias(self, name: str, prefix: str, alias: str) -> None:
        """The move of ``alias`` ended (done, refused or failed): the head takes its file's value."""

        def change(index: NameIndex) -> None:
            if index.changing.get(alias, {}).get("by") == _writer():
                del index.changing[alias]
            self._alias_from_file(prefix, index, alias)
        self._update(name, prefix, change)

    def _alias_from_file(self, prefix: str, index: NameIndex, alias: str) -> None:
        value = self._alias_file(prefix, alias)
        if value is None:
            index.aliases.pop(alias, None)
        else:
            index.aliases[alias] = value

    def rebuild(self, name: str, prefix: str) -> NameIndex:
        """Rebuild the index from the folders alone and store it (fsck --repair)."""
        self._before_write()
        tag = self._tag(prefix)
        index = self._rebuilt(name, prefix, None)
        index.versions = {k: {} for k in index.versions or {}}  # nothing kept: every entry read again
        self.fill(name, index)
        return self._store_rebuilt(name, prefix, index, tag=tag)

    def compact(self, name: str, prefix: str) -> NameIndex:
        """Write the live entries into a new log (dropping lines of removed versions)."""
        index = self.listing(name, prefix, fill=True, persist=True)  # with the tag of the head it read
        if not index.stored:
            return index
        return self._store_rebuilt(name, prefix, index, tag=index.tag)

    def _store_rebuilt(self, name: str, prefix: str, index: NameIndex, *, tag: str | None) -> NameIndex:
        """Store ``index`` (entries complete) over the head that had ``tag``: a new log generation
        first, then the head; the old log goes once the head names the new one.

        Raises:
            RepoBusyError: another writer changed the head meanwhile, or its lock was held past its deadline.
        """
        stored = self._try_store_rebuilt(prefix, index, tag=tag)
        if stored is None:
            raise RepoBusyError(f"the index of {name} changed while it was rebuilt; run again")
        return stored

    def _try_store_rebuilt(self, prefix: str, index: NameIndex, *, tag: str | None) -> NameIndex | None:
        """:meth:`_store_rebuilt`, ``None`` when another writer changed the head meanwhile (a lock
        held past its deadline still raises: trying again would wait as long again)."""
        old = index.log if index.stored else 0
        index.count = len(index.versions or {})
        index.latest = max(index.versions or {}, default=0)
        if self._appends:
            generation = max(old, self._highest_log(prefix)) + 1
            data = b"".join(_line(k, e) for k, e in sorted((index.versions or {}).items()))
            self.store.write(f"{prefix}/{summary_log(generation)}", data, durable=False)
            index.log, index.log_bytes, index.dead = generation, len(data), 0
        new_tag = self.store.swap(f"{prefix}/{SUMMARY_FILE}", index.head_json(appends=self._appends), tag, durable=False)
        if new_tag is None:
            if self._appends:
                with contextlib.suppress(OSError, CorruptCaptureError):
                    self.store.remove(f"{prefix}/{summary_log(index.log)}")
            return None
        if self._appends:
            for stale in self._log_files(prefix):
                if stale != summary_log(index.log):
                    with contextlib.suppress(OSError, CorruptCaptureError):
                        self.store.remove(f"{prefix}/{stale}")
        index.tag, index.stored = new_tag, True
        return index

    def _log_files(self, prefix: str) -> list[str]:
        return [f for f in self.store.files(prefix) if f.startswith("summary-") and f.endswith(".log")]

    def _highest_log(self, prefix: str) -> int:
        return max((int(f[len("summary-"):-len(".log")]) for f in self._log_files(prefix)
                    if f[len("summary-"):-len(".log")].isdigit()), default=0)

    def _update(self, name: str, prefix: str, change: Callable[[NameIndex], T]) -> tuple[NameIndex, T]:
        """Apply ``change`` to the head with compare-and-swap, again on a fresh read whenever
        another writer changed it first. A missing or older head, or a log that cannot be appended
        to (damaged, or a link planted there), is rebuilt (and stored, in a new log) first."""
        self._before_write()
        key = f"{prefix}/{SUMMARY_FILE}"
        rebuild = False
        for _attempt in range(_SWAP_ATTEMPTS):
            raw, tag = self.store.read_tagged(key)
            index = None if rebuild else _parse_head(raw, appends=self._appends)
            if index is None:
                rebuilt = self._rebuilt(name, prefix, None)
                self.fill(name, rebuilt)
                stored = self._try_store_rebuilt(prefix, rebuilt, tag=tag)
                if stored is None:
                    continue  # changed meanwhile: read it again
                index, tag, rebuild = stored, stored.tag, False
            index.tag = tag
            try:
                result = change(index)
            except (OSError, CorruptCaptureError):
                rebuild = True  # its log cannot take a line: a new log, then again
                continue
            head = index.head_json(appends=self._appends)
            new_tag = self.store.swap(key, head, tag, durable=False)
            if new_tag is not None:
                index.tag = new_tag
                return index, result
        raise RepoBusyError(f"the index of {name} kept changing under {_SWAP_ATTEMPTS} attempts to update it")

    def _tidy(self, name: str, prefix: str, index: NameIndex) -> None:
        """Settle what writers that are gone left in progress: a version they published is adopted
        (its entry read from its capture file), a number they never published is let go, an alias
        they were moving takes its file's value."""
        now = time.time()
        for alias, mover in list(index.changing.items()):
            if _stale(mover, now):
                del index.changing[alias]
                self._alias_from_file(prefix, index, alias)
        adopted: dict[int, Entry] = {}
        for key, reservation in list(index.reserved.items()):
            if not _stale(reservation, now):
                continue
            number = int(key)
            if self.store.exists(f"{prefix}/versions/{number}/{CAPTURE_FILE}"):
                entry = self._read_entries(name, [number]).get(number)
                if entry is not None:
                    adopted[number] = entry
            del index.reserved[key]
        if not adopted:
            return
        if self._appends:
            index.log = index.log or 1
            end = self.store.append(f"{prefix}/{summary_log(index.log)}",
                                    b"".join(_line(n, e) for n, e in sorted(adopted.items())))
            index.log_bytes = max(index.log_bytes, end)
        else:
            assert index.versions is not None
            index.versions.update({n: _plain(e) for n, e in adopted.items()})
        index.count += len(adopted)
        index.latest = max(index.latest, *adopted)

    def _latest_below(self, prefix: str, index: NameIndex, below: int) -> int:
        """The highest visible version under ``below`` that is not being removed."""
        removing = set(index.removing)
        if index.versions is not None:
            return max((k for k in index.versions if k < below and k not in removing), default=0)
        for number in range(below - 1, 0, -1):  # usually one step: the one before was not removed
            if number not in removing and self.store.exists(f"{prefix}/versions/{number}/{CAPTURE_FILE}"):
                return number
        return 0


def listing_stamp(store: Store) -> str:
    """A digest of every name's index head and notes file (``Repo.listing_stamp``): it changes
    whenever a listing may."""
    folders = sorted(f"names/{quoted}" for quoted in store.names() if unquote_name(quoted) is not None)
    keys = [f"{folder}/{file}" for folder in folders for file in (SUMMARY_FILE, NOTES_FILE)]
    found = store.read_many(keys) if keys else {}
    digest = hashlib.blake2b(digest_size=16)
    for key in keys:
        data = (found.get(key) or b"").rstrip()  # a head is padded with spaces, to be rewritten in place
        digest.update(f"{key}\0{len(data) if key in found else -1}\0".encode())
        digest.update(data)
    return digest.hexdigest()
