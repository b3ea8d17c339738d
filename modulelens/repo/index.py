"""Per-name summaries: list, show, resolve and gc without parsing every capture file.

A summary holds, for each version of a name, what a listing shows (created, tags, payload bytes,
module class, call count) and the blobs it references (for gc), plus the name's aliases::

    {"summary": 1,
     "versions_key": [mtime_ns, nlink] | null,  "aliases_key": [mtime_ns] | null,
     "versions": {"3": {"id": [inode, ctime_ns], "created": ..., "tags": [...], "nbytes": ...,
                        "module_class": ..., "calls": ..., "blobs": ["blake3:...", ...]}},
     "aliases": {"golden": 3}}

It is a cache: the truth stays the name's ``versions/`` and ``aliases/`` folders
(:meth:`Store.scan <modulelens.repo.store.Store.scan>`). A store that can tell cheaply whether
those folders changed (:meth:`~modulelens.repo.store.Store.stamps`: a directory, by their mtime
and link count) keeps the summary in ``names/<name>/summary.json`` with the stamps it was built
from, so a reader checks it in two ``stat`` calls. A stamp is recorded only when the folder had not
changed for a second before it was read: the kernel stamps mtimes from a coarse clock, so two
changes within one tick can share an mtime, but a change made after the stamp was read always gets
a later one. A summary that does not match (or has no stamp) is rebuilt from a scan: entries whose
version is the same one (its identity: inode and ctime of its folder) are kept, and the others are
read from their ``capture.json`` when someone needs them. Writes are atomic; two writers racing may
each leave out the other's version, which the next reader puts back. So concurrent savers, ``rm``
and alias moves never make a listing wrong, only occasionally slower.

A store without stamps (object storage: its writes would need compare-and-swap for every save)
keeps no summary object: each reader scans (one LIST) and reads the manifests it needs, which the
store caches (versions are immutable). Issue 25's per-name index objects would plug in here, as a
store's stamps (an ETag) and a summary written with a conditional write.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from modulelens.errors import CorruptCaptureError
from modulelens.repo.layout import SUMMARY_FILE
from modulelens.repo.packs import referenced_blobs
from modulelens.repo.store import Stamps, Store

__all__ = ["SUMMARY_FILE", "Summaries", "damaged_entry", "version_entry"]

Summary = dict[str, Any]
#: Reads the entries of ``versions`` of a name: number -> entry, or ``None`` for one removed meanwhile.
EntryReader = Callable[[str, Iterable[int]], dict[int, dict[str, Any] | None]]


def version_entry(metadata: dict[str, Any]) -> dict[str, Any]:
    """What the summary keeps of one version's metadata."""
    return {
        "created": metadata.get("created", ""),
        "tags": list(metadata.get("tags", ())),
        "nbytes": sum(t["nbytes"] for t in metadata.get("tensors", {}).values() if t.get("payload")),
        "module_class": metadata.get("module", {}).get("class", ""),
        "calls": len(metadata.get("calls", ())),
        "blobs": sorted(referenced_blobs(metadata)),
    }


def damaged_entry(raw: bytes, problem: str) -> dict[str, Any]:
    """The summary of a version whose metadata cannot be read: it still lists (with its problem),
    and gc keeps every payload hash its file mentions, in case a repair needs them."""
    blobs = sorted({m.decode() for m in re.findall(rb"blake3:[0-9a-f]{64}", raw)})
    return {"created": "", "tags": [], "nbytes": 0, "module_class": "", "calls": 0, "blobs": blobs, "problem": problem}


def _complete(entry: dict[str, Any]) -> bool:
    return "blobs" in entry  # a pending entry holds only the version's identity


class Summaries:
    """The summaries of one repo's names, kept in memory while its folders do not change.

    Args:
        store: the repo's store.
        read_entries: reads the entries of versions a summary lacks (``Repo``: from their
            ``capture.json``, a damaged one as :func:`damaged_entry`).
    """

    def __init__(self, store: Store, read_entries: EntryReader) -> None:
        self.store = store
        self._read_entries = read_entries
        self._kept: dict[str, Summary] = {}

    def get(self, name: str, prefix: str, *, fresh: dict[int, dict[str, Any]] | None = None,
            persist: bool = False, keep: bool = True, rebuild: bool = False, complete: bool = False) -> Summary:
        """The current summary of ``name`` (its folder ``prefix``).

        Args:
            fresh: entries of versions just written (so a save never re-reads its own capture.json).
            persist: store a rebuilt summary (writers only: reading a repo never modifies it, so a
                read-only repo, or a fixture, lists as it is).
            keep: keep it in memory (a walk over every name keeps nothing it will not ask for again:
                2,000 versions' summaries kept alive made the garbage collector a sixth of a listing).
            rebuild: ignore what is stored (fsck --repair).
            complete: fill every entry (a listing, gc); otherwise entries are read when asked for.
        """
        cached = None if rebuild else self._kept.get(name)
        stamps = self.store.stamps(prefix)
        summary, stored = self._current(prefix, stamps, cached, fresh or {}, rebuild=rebuild)
        if summary is not stored and (complete or (persist and stamps is not None)):
            self.fill(name, summary)  # (a stored summary is complete: only complete ones are stored)
        if persist and stamps is not None and summary is not stored and summary is not cached and summary != stored:
            with contextlib.suppress(OSError, CorruptCaptureError):  # a read-only repo still lists, just without the cache
                if self.store.is_folder(prefix):
                    self.store.write(f"{prefix}/{SUMMARY_FILE}", json.dumps(summary, separators=(",", ":")).encode(),
                                     durable=False)
        if keep:
            self._kept[name] = summary
        return summary

    def forget(self, name: str) -> None:
        self._kept.pop(name, None)

    def fill(self, name: str, summary: Summary, versions: Iterable[int] | None = None) -> None:
        """Read the entries ``summary`` lacks (of ``versions``, default all); a version removed
        meanwhile leaves the summary."""
        entries = summary["versions"]
        wanted = [int(k) for k, e in entries.items() if not _complete(e)] if versions is None else \
            [v for v in versions if str(v) in entries and not _complete(entries[str(v)])]
        if not wanted:
            return
        for number, entry in self._read_entries(name, wanted).items():
            if entry is None:
                entries.pop(str(number), None)
            else:
                entries[str(number)] = {"id": entries[str(number)].get("id"), **entry}

    def _current(self, prefix: str, stamps: Stamps | None, cached: Summary | None,
                 fresh: dict[int, dict[str, Any]], *, rebuild: bool) -> tuple[Summary, Summary | None]:
        """``(summary, the stored one)``: the kept or stored summary while the stamps match, else one
        rebuilt from a scan (entries of unchanged versions kept, the others pending)."""
        stored = None
        if stamps is not None:
            keys = (stamps.versions, stamps.aliases)
            if not fresh and cached is not None and (cached["versions_key"], cached["aliases_key"]) == keys:
                return cached, None
            stored = None if rebuild else self._load(prefix)
            if not fresh and stored is not None and (stored.get("versions_key"), stored.get("aliases_key")) == keys:
                return stored, stored
        scan = self.store.scan(prefix)
        previous = (stored or cached or {}).get("versions", {})
        versions: dict[str, dict[str, Any]] = {}
        for number, identity in scan.versions.items():
            key = str(number)
            kept = previous.get(key)
            if number in fresh:
                versions[key] = {"id": identity, **fresh[number]}
            elif kept is not None and kept.get("id") == identity and _complete(kept):
                versions[key] = kept
            else:
                versions[key] = {"id": identity}
        summary: Summary = {"summary": 1, "versions_key": None, "aliases_key": None, "versions": versions,
                            "aliases": scan.aliases}
        if stamps is not None:
            summary["versions_key"] = stamps.versions if stamps.versions_settled else None
            summary["aliases_key"] = stamps.aliases if stamps.aliases_settled else None
        return summary, stored

    def _load(self, prefix: str) -> Summary | None:
        try:
            data = json.loads(self.store.read(f"{prefix}/{SUMMARY_FILE}") or b"null")
        except (OSError, ValueError, RecursionError, CorruptCaptureError):
            return None
        return data if isinstance(data, dict) and data.get("summary") == 1 else None
