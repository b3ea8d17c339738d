"""fsck's view of a repo in a directory: entries its layout does not have, links, stale staging
(:class:`LocalAuditor`), and the quarantine that ``fsck --repair`` moves them into
(:class:`LocalQuarantine`); also the directory-only names of the layout (docs/repo-layout.md).

Nothing here follows a link or descends into what is not a real folder: a repo may come from
someone else.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
import uuid
from pathlib import Path
from urllib.parse import quote, unquote

from modulelens.errors import InvalidNameError
from modulelens.repo.files import require_dir, write_new_file
from modulelens.repo.layout import (
    CAPTURE_FILE,
    HEX64,
    MARKER,
    MAX_VERSION,
    NOTES_FILE,
    REPORTS,
    SUMMARY_FILE,
    is_summary_log,
    is_version_number,
)
from modulelens.repo.markers import marker_path
from modulelens.repo.names import validate_alias, validate_name
from modulelens.repo.store import Audit, Finding, Quarantine
from modulelens.repo.trust import TRUST_FILE

TOMBSTONE = ".removed"  # versions/<N>.removed: N was used by a version since removed
QUARANTINE = "quarantine"
LOCK_FILES = ("lock", "lock-gate")
#: Entries the layout allows at the root (docs/repo-layout.md); ``.trust.json.<pid>`` is a setting being written.
ROOT_ENTRIES = frozenset({MARKER, "blobs", "names", "tmp", *LOCK_FILES, TRUST_FILE, QUARANTINE})
_ROOT_FOLDERS = frozenset({"blobs", "names", "tmp", QUARANTINE})
_TOMBSTONE_RE = re.compile(r"[0-9]+\.removed")
_SHARD_RE = re.compile(r"[0-9a-f]{2}")


def is_dir(path: Path) -> bool:
    """Whether ``path`` is a real folder (``lstat``: a link is not)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def writer_alive(staging_name: str) -> bool:
    """Whether the process that made ``tmp/<pid>-<uuid>...`` still runs on this machine."""
    pid, _, rest = staging_name.partition("-")
    if not pid.isdigit() or not rest:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, owned by another user
        return True
    return True


def _scan(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as found:
            return sorted(found, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []


class LocalAuditor:
    """Walks a repo directory for entries its layout does not have and for links (fsck); never
    follows a link and never descends into what is not a real folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.audit = Audit()

    def run(self) -> Audit:
        for entry in _scan(self.root):
            path = self.root / entry.name
            if entry.name not in ROOT_ENTRIES and not entry.name.startswith(f".{TRUST_FILE}."):
                self._foreign(path, "not part of a repo's layout")
            elif self._entry_ok(path, want_dir=entry.name in _ROOT_FOLDERS):
                if entry.name == "names":
                    for name in _scan(path):
                        if self._entry_ok(path / name.name, want_dir=True):
                            self._name(path / name.name)
                elif entry.name == "blobs":
                    self._blobs(path)
        self._staging()
        return self.audit

    def _finding(self, kind: str, path: Path, detail: str) -> None:
        self.audit.findings.append(Finding(kind, str(path.relative_to(self.root)), detail))

    def _foreign(self, path: Path, why: str) -> None:
        self._finding("foreign", path, why)

    def _entry_ok(self, path: Path, *, want_dir: bool) -> bool:
        """Whether ``path`` is a real folder (``want_dir``) or regular file; records a finding if not."""
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return False  # removed meanwhile
        if stat.S_ISLNK(info.st_mode):
            self._finding("symlink", path, "a symbolic link; never followed")
            return False
        if (stat.S_ISDIR(info.st_mode) if want_dir else stat.S_ISREG(info.st_mode)):
            return True
        self._foreign(path, f"not a {'folder' if want_dir else 'regular file'}")
        return False

    def _name(self, folder: Path) -> None:
        name = unquote(folder.name)
        try:
            validate_name(name)
        except InvalidNameError as error:
            self._foreign(folder, f"not a capture name: {error}")
            return
        if quote(name, safe="") != folder.name:
            self._foreign(folder, f"not how the name {name!r} is stored")
            return
        for entry in _scan(folder):
            path = folder / entry.name
            # a file of the name's own: its index (head, logs) or its notes (repo/notes.py)
            name_file = entry.name in (SUMMARY_FILE, NOTES_FILE) or is_summary_log(entry.name)
            if entry.name not in ("versions", "aliases") and not name_file:
                self._foreign(path, "not part of a name's layout")
            elif self._entry_ok(path, want_dir=not name_file):
                if entry.name == "versions":
                    self._versions(path)
                elif entry.name == "aliases":
                    self._aliases(path)

    def _versions(self, folder: Path) -> None:
        for entry in _scan(folder):
            path = folder / entry.name
            if _TOMBSTONE_RE.fullmatch(entry.name) and is_version_number(entry.name.removesuffix(TOMBSTONE)):
                self._entry_ok(path, want_dir=False)
            elif not is_version_number(entry.name):
                self._foreign(path, f"not a version number (1 to {MAX_VERSION:,}) or tombstone")
            elif self._entry_ok(path, want_dir=True):
                self._version(path)

    def _version(self, folder: Path) -> None:
        for entry in _scan(folder):
            path = folder / entry.name
            if entry.name == REPORTS:
                if self._entry_ok(path, want_dir=True):
                    for report in _scan(path):
                        self._entry_ok(path / report.name, want_dir=False)
            elif entry.name != CAPTURE_FILE:  # capture.json itself is read and judged by fsck
                self._foreign(path, "not part of a version's layout")

    def _aliases(self, folder: Path) -> None:
        for entry in _scan(folder):
            path = folder / entry.name
            try:
                validate_alias(entry.name)
            except InvalidNameError as error:
                self._foreign(path, f"not an alias name: {error}")
                continue
            self._entry_ok(path, want_dir=False)

    def _blobs(self, blobs: Path) -> None:
        for shard in _scan(blobs):
            folder = blobs / shard.name
            if not _SHARD_RE.fullmatch(shard.name):
                self._foreign(folder, "not a blob folder")
                continue
            if not self._entry_ok(folder, want_dir=True):
                continue
            for entry in _scan(folder):
                path = folder / entry.name
                hexdigest = entry.name.removesuffix(".ok")
                if not HEX64.fullmatch(hexdigest) or hexdigest[:2] != shard.name:
                    self._foreign(path, "not a blob")
                else:
                    self._entry_ok(path, want_dir=False)

    def _staging(self) -> None:
        if not is_dir(self.root / "tmp"):
            return  # a link or a file: reported with the root's entries
        for entry in _scan(self.root / "tmp"):
            if entry.is_symlink():
                self._entry_ok(self.root / "tmp" / entry.name, want_dir=False)
            elif not writer_alive(entry.name):
                self.audit.stale_staging += 1


class LocalQuarantine(Quarantine):
    """``quarantine/<UTC time>-<id>/``: everything moved keeps its relative path, never deleted."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.run = root / QUARANTINE / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        self.location = str(self.run)
        self.moved: set[str] = set()

    def prepare(self) -> list[Finding]:
        found = []
        for key, want_dir in ((QUARANTINE, True), *((lock, False) for lock in LOCK_FILES)):
            try:
                info = os.lstat(self.root / key)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(info.st_mode):
                found.append(Finding("symlink", key, "a symbolic link; never followed"))
            elif (stat.S_ISDIR(info.st_mode) if want_dir else stat.S_ISREG(info.st_mode)) is False:
                found.append(Finding("foreign", key, f"not a {'folder' if want_dir else 'regular file'}"))
        for finding in found:
            if finding.key == QUARANTINE:  # moved into a new, real quarantine folder, by way of a name beside it
                aside = self.root / f".{QUARANTINE}-{uuid.uuid4().hex[:8]}"
                os.rename(self.root / QUARANTINE, aside)
                self.run.mkdir(parents=True)
                os.rename(aside, self.run / QUARANTINE)
                self.moved.add(QUARANTINE)
            else:
                self.move(finding.key)
        return found

    def _ready(self) -> None:
        """The run's folder, in a quarantine folder that is a real one (never moved through a link)."""
        if not self.run.exists():
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.root / QUARANTINE)
            require_dir(self.root / QUARANTINE)
            self.run.mkdir(exist_ok=True)

    def move(self, key: str) -> str | None:
        if key in self.moved or any(key.startswith(m + "/") for m in self.moved):
            return None  # already moved with its folder
        path, target = self.root / key, self.run / key
        folder = self.root
        for part in key.split("/")[:-1]:  # the entry itself may be a link; the folders on the way may not
            folder = folder / part
            if not is_dir(folder):
                return None
        self._ready()
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(path, target)
        except (FileNotFoundError, NotADirectoryError):
            return None
        self.moved.add(key)
        if path.parent.parent == self.root / "blobs" and HEX64.fullmatch(path.name):
            with contextlib.suppress(FileNotFoundError):  # its verification marker goes with it
                os.rename(marker_path(path), marker_path(target))
        return str(target.relative_to(self.root))

    def retire(self, prefix: str) -> str | None:
        # The number stays used: a later save never takes a quarantined version's number.
        with contextlib.suppress(FileExistsError):
            write_new_file(self.root / f"{prefix}{TOMBSTONE}", b"", mode=0o644)
        return self.move(prefix)

    def finish(self, report: bytes) -> None:
        if self.moved:
            self._ready()
            (self.run / "fsck.json").write_bytes(report)
