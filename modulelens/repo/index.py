"""Per-name summaries: list, show, resolve and gc without parsing every capture file.

``names/<name>/summary.json`` holds, for each version of the name, what a listing shows (created,
tags, payload bytes, module class, call count) and the blobs it references (for gc), plus the
name's aliases. It is a cache: the truth stays the ``versions/`` and ``aliases/`` folders, and the
summary records the state of those folders it was built from, so a reader can tell in two
``stat`` calls whether it is current::

    {"summary": 1,
     "versions_key": [mtime_ns, nlink] | null,  "aliases_key": [mtime_ns] | null,
     "versions": {"3": {"id": [inode, ctime_ns], "created": ..., "tags": [...], "nbytes": ...,
                        "module_class": ..., "calls": ..., "blobs": ["blake3:...", ...]}},
     "aliases": {"golden": 3}}

Adding or removing a version renames an entry into or out of ``versions/`` and moving an alias
renames a file into ``aliases/``; each changes that folder's mtime (and a version changes its link
count). A key is recorded only when the folder had not changed for a second before it was read:
the kernel stamps mtimes from a coarse clock, so two changes within one tick can share an mtime,
but a change made after the key was read always gets a later one. A summary that does not match
(or has no key) is rebuilt from the folders: entries whose version folder is the same one (inode and
ctime) are kept, and only new versions' ``capture.json`` files are read. Writes are atomic renames;
two writers racing may each leave out the other's version, which the next reader puts back. So
concurrent savers, ``rm`` and alias moves never make a listing wrong, only occasionally slower.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modulelens.errors import CaptureNotFoundError, CorruptCaptureError
from modulelens.repo.files import read_regular, require_dir
from modulelens.repo.packs import referenced_blobs

SUMMARY_FILE = "summary.json"
_SETTLED_NS = 1_000_000_000  # a folder unchanged this long has an mtime no later change can repeat


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


def summarize(versions: list[int], aliases: dict[str, int],
              read_metadata: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
    """A summary built from scratch (repos without a local index: remote ones)."""
    return {"summary": 1, "versions_key": None, "aliases_key": None,
            "versions": {str(v): version_entry(read_metadata(v)) for v in versions}, "aliases": dict(aliases)}


def _folder_key(path: str, now_ns: int, *, nlink: bool) -> tuple[list[int] | None, bool]:
    """``(key, settled)`` of a folder: its mtime (and link count), and whether it is old enough to
    be trusted; ``([], True)`` for a folder that does not exist."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return [], True
    key = [stat.st_mtime_ns, stat.st_nlink] if nlink else [stat.st_mtime_ns]
    return key, stat.st_mtime_ns < now_ns - _SETTLED_NS


def current_keys(name_dir: Path) -> tuple[list[int], list[int]]:
    """The keys a summary of ``name_dir`` must record for readers to trust it as current."""
    now = time.time_ns()
    return (_folder_key(f"{name_dir}/versions", now, nlink=True)[0],
            _folder_key(f"{name_dir}/aliases", now, nlink=False)[0])


class NameIndex:
    """The summary of one name in a local repo.

    Args:
        name_dir: ``<root>/names/<quoted name>`` (a string: a listing builds one index per name,
            and pathlib's joins cost more than the stats).
        read_metadata: reads a version's capture metadata (only versions the summary lacks).
        write_atomic: writes a file atomically (``Repo._atomic_write``).
    """

    def __init__(self, name_dir: str, read_metadata: Callable[[int], dict[str, Any]],
                 write_atomic: Callable[[Path, bytes], None]) -> None:
        self.name_dir = name_dir
        self._versions = f"{name_dir}/versions"
        self._aliases_dir = f"{name_dir}/aliases"
        self._file = f"{name_dir}/{SUMMARY_FILE}"
        self._read_metadata = read_metadata
        self._write_atomic = write_atomic

    def read(self, cached: dict[str, Any] | None = None,
             fresh: dict[int, dict[str, Any]] | None = None, *, persist: bool = False,
             rebuild: bool = False) -> dict[str, Any]:
        """The current summary: ``cached`` (a summary read before) or the file when its keys match
        the folders, else rebuilt. ``fresh`` gives entries of versions just written (so a save does
        not re-read its own capture.json). A rebuilt summary is written back only with ``persist``
        (by writers: save, rm, alias, gc, fsck --repair): reading a repo never modifies it, so a
        read-only repo, or a fixture, lists as it is. ``rebuild`` ignores what is stored."""
        now = time.time_ns()
        vkey, vsettled = _folder_key(self._versions, now, nlink=True)
        akey, asettled = _folder_key(self._aliases_dir, now, nlink=False)
        if not fresh and not rebuild and cached is not None and cached["versions_key"] == vkey and cached["aliases_key"] == akey:
            return cached
        stored = None if rebuild else self._load()
        if not fresh and stored is not None and stored.get("versions_key") == vkey and stored.get("aliases_key") == akey:
            return stored
        summary = self._rebuild(stored or {}, fresh or {})
        summary["versions_key"] = vkey if vsettled else None
        summary["aliases_key"] = akey if asettled else None
        if summary == stored or not persist:
            return summary
        with contextlib.suppress(OSError):  # a read-only repo still lists, just without the cache
            if os.path.isdir(self.name_dir):
                self._write_atomic(Path(self._file), json.dumps(summary, separators=(",", ":")).encode())
        return summary

    def _load(self) -> dict[str, Any] | None:
        try:
            data = json.loads(read_regular(self._file))
        except (OSError, ValueError, CorruptCaptureError):
            return None
        return data if isinstance(data, dict) and data.get("summary") == 1 else None

    def _rebuild(self, old: dict[str, Any], fresh: dict[int, dict[str, Any]]) -> dict[str, Any]:
        previous = old.get("versions", {})
        versions: dict[str, Any] = {}
        with contextlib.suppress(FileNotFoundError), os.scandir(self._versions) as found:
            for entry in found:
                if not entry.name.isdigit():
                    continue
                try:
                    stat = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed meanwhile
                identity = [stat.st_ino, stat.st_ctime_ns]
                kept = previous.get(entry.name)
                if kept is not None and kept.get("id") == identity:
                    versions[entry.name] = kept
                    continue
                number = int(entry.name)
                data = fresh.get(number)
                if data is None:
                    try:
                        data = version_entry(self._read_metadata(number))
                    except CaptureNotFoundError:
                        continue  # removed meanwhile
                    except CorruptCaptureError as error:  # one damaged version never hides the others
                        data = damaged_entry(self._raw_metadata(number), str(error))
                versions[entry.name] = {"id": identity, **data}
        ordered = dict(sorted(versions.items(), key=lambda item: int(item[0])))
        return {"summary": 1, "versions_key": None, "aliases_key": None, "versions": ordered,
                "aliases": self._aliases()}

    def _raw_metadata(self, number: int) -> bytes:
        try:
            require_dir(Path(self._versions, str(number)))  # never read through a linked version folder
            return read_regular(Path(self._versions, str(number), "capture.json"))
        except (OSError, CorruptCaptureError):
            return b""

    def _aliases(self) -> dict[str, int]:
        result = {}
        with contextlib.suppress(FileNotFoundError), os.scandir(self._aliases_dir) as found:
            for entry in found:
                if not entry.name.startswith("."):  # a linked or odd alias is skipped here, reported by fsck
                    with contextlib.suppress(ValueError, OSError, CorruptCaptureError):
                        result[entry.name] = int(read_regular(entry.path).decode().strip())
        return dict(sorted(result.items()))
