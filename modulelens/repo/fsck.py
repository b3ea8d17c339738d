"""``modulelens fsck``: check a local repo against its layout and the capture format; repair it.

The check reads everything and writes nothing (it works on a read-only repo and takes no lock):

* every version's ``capture.json`` against the format (:func:`~modulelens.format.validate.validate_capture`),
  and its ``name``/``version`` against its folder;
* every payload a version references, loose or a pack: present, a regular file, its size, its
  full hash, and each pack member's own hash;
* aliases (a valid name, a number, an existing version), tombstones, and each name's
  ``summary.json`` when readers would trust it as current (a wrong one could make gc free
  payloads a version needs);
* entries the layout does not have, and symbolic links anywhere in the repo.

Orphan payloads (left by ``rm``) and staging left by dead writers are not damage: they are counted
and left to ``gc`` (``gc --tmp-older-than 0``).

``repair=True`` takes the repo's exclusive lock (as gc does) and moves what is broken into
``quarantine/<UTC time>-<id>/`` at the same relative path, never deleting anything: a version with
damaged metadata or payloads (its number stays used: a tombstone is left), a damaged payload
(so a later save of the same content writes it again instead of skipping it as present), foreign
entries and links, dangling aliases (their content is kept in the quarantined file). It then
rebuilds every name's summary and records the report in ``quarantine/<run>/fsck.json``.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import stat
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from modulelens.errors import CorruptCaptureError, InvalidNameError, UsageError
from modulelens.format.hashing import hash_bytes
from modulelens.format.validate import validate_capture
from modulelens.repo.files import open_regular, read_regular, require_dir, write_new_file
from modulelens.repo.index import SUMMARY_FILE, current_keys, damaged_entry
from modulelens.repo.names import validate_alias, validate_name
from modulelens.repo.packs import read_header, referenced_blobs

if TYPE_CHECKING:
    from modulelens.repo.local import Repo

QUARANTINE = "quarantine"
#: Entries the layout allows at the root (docs/repo-layout.md); ``.trust.json.<pid>`` is a setting being written.
ROOT_ENTRIES = frozenset({"modulelens-repo.json", "blobs", "names", "tmp", "lock", "lock-gate", "trust.json", QUARANTINE})
_HEX64 = re.compile(r"[0-9a-f]{64}")
_TOMBSTONE = re.compile(r"[0-9]+\.removed")

#: Problem kinds, for scripts (docs/cli-json.md).
KINDS = ("metadata", "missing-payload", "corrupt-payload", "alias", "summary", "foreign", "symlink")


@dataclass(frozen=True)
class Problem:
    """One thing found broken: ``kind`` (one of :data:`KINDS`), the repo ``path`` it concerns, and
    a one-line ``detail``; ``repaired`` says whether ``--repair`` dealt with it."""

    kind: str
    path: str
    detail: str
    repaired: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "detail": self.detail, "repaired": self.repaired}


@dataclass
class FsckReport:
    """What :func:`fsck` found (and, with ``repair``, did)."""

    repo: str
    names: int = 0
    versions: int = 0
    payloads_checked: int = 0
    bytes_checked: int = 0
    problems: list[Problem] = field(default_factory=list)
    orphan_blobs: int = 0
    orphan_bytes: int = 0
    stale_staging: int = 0
    repair: bool = False
    actions: list[str] = field(default_factory=list)
    quarantine: str | None = None

    @property
    def clean(self) -> bool:
        """No problem is left (none found, or every one repaired)."""
        return all(p.repaired for p in self.problems)

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo": self.repo, "clean": self.clean, "names": self.names, "versions": self.versions,
            "payloads_checked": self.payloads_checked, "bytes_checked": self.bytes_checked,
            "problems": [p.to_dict() for p in self.problems], "orphan_blobs": self.orphan_blobs,
            "orphan_bytes": self.orphan_bytes, "stale_staging": self.stale_staging, "repair": self.repair,
            "actions": list(self.actions), "quarantine": self.quarantine,
        }


@dataclass
class _Version:
    name: str
    number: int
    path: Path
    blobs: dict[str, int] = field(default_factory=dict)
    members: list[tuple[str, str, int]] = field(default_factory=list)  # (pack digest, member digest, nbytes)
    broken: bool = False


def fsck(repo: Repo, *, repair: bool = False) -> FsckReport:
    """Check (and with ``repair``, quarantine what is broken in) the local repo ``repo``.

    Args:
        repo: a local :class:`~modulelens.repo.local.Repo`.
        repair: move broken versions, payloads, foreign entries and dangling aliases into
            ``quarantine/`` and rebuild the summaries (under the repo's exclusive lock).

    Returns:
        The :class:`FsckReport`; ``report.clean`` is false while a problem is left.

    A remote repo (``s3://``...) gets a read-only check: every version's metadata against the
    format, and every referenced payload's presence and size from one listing of its blobs (not
    their hashes, which would download everything: ``load(..., verify=True)`` hashes what it
    downloads), aliases, and unreferenced payloads.

    Raises:
        UsageError: ``repair`` on a remote repo (pull into a local repo and repair that).
        CorruptCaptureError: ``repair`` while the repo's ``quarantine`` is a link (remove it first).

    Example::

        report = modulelens.Repo("/data/captures").fsck()
        for problem in report.problems:
            print(problem.kind, problem.path, problem.detail)
    """
    if repo.is_remote:
        if repair:
            raise UsageError(f"fsck --repair works on local repos only ({repo.location}); pull what you need into "
                             "a local repo and repair that")
        return _remote_fsck(repo)
    report = FsckReport(repo=str(repo.root), repair=repair)
    if not repair:
        _Checker(repo, report).run()
        return report
    with repo.exclusive_lock():
        checker = _Checker(repo, report)
        checker.run()
        _repair(repo, checker, report)
    return report


class _Checker:
    def __init__(self, repo: Repo, report: FsckReport) -> None:
        self.repo = repo
        self.root = repo.root
        self.report = report
        self.versions: list[_Version] = []
        self.aliases: list[tuple[Path, str]] = []  # (alias file, why it is broken)
        self.move: list[Path] = []  # foreign entries, links and damaged blobs to quarantine
        self.summaries: dict[str, Path] = {}  # name -> its folder
        self.mentioned: set[str] = set()  # blob hex digests any version (even a damaged one) names

    def problem(self, kind: str, path: Path, detail: str) -> None:
        self.report.problems.append(Problem(kind, str(path.relative_to(self.root)), detail))

    def run(self) -> None:
        self._root_entries()
        names = self.root / "names"
        for entry in _scan(names):
            if self._entry_ok(names / entry.name, want_dir=True):
                self._name(names / entry.name)
        self._payloads()
        for name, folder in self.summaries.items():  # after payloads: an alias of a damaged version dangles
            good = {v.number for v in self.versions if v.name == name and not v.broken}
            self._aliases(folder / "aliases", good)
            self._summary(name, folder)
        self._blobs()
        self._staging()

    def _entry_ok(self, path: Path, *, want_dir: bool) -> bool:
        """Whether ``path`` is a real folder (``want_dir``) or regular file; records a problem if not."""
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return False  # removed meanwhile
        if stat.S_ISLNK(info.st_mode):
            self.problem("symlink", path, "a symbolic link; never followed")
            self.move.append(path)
            return False
        if (stat.S_ISDIR(info.st_mode) if want_dir else stat.S_ISREG(info.st_mode)):
            return True
        self.problem("foreign", path, f"not a {'folder' if want_dir else 'regular file'}")
        self.move.append(path)
        return False

    def _foreign(self, path: Path, why: str) -> None:
        self.problem("foreign", path, why)
        self.move.append(path)

    def _root_entries(self) -> None:
        for entry in _scan(self.root):
            path = self.root / entry.name
            if entry.name not in ROOT_ENTRIES and not entry.name.startswith(".trust.json."):
                self._foreign(path, "not part of a repo's layout")
            elif entry.name in ("blobs", "names", "tmp", QUARANTINE):
                self._entry_ok(path, want_dir=True)
            else:
                self._entry_ok(path, want_dir=False)

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
        self.report.names += 1
        self.summaries[name] = folder
        for entry in _scan(folder):
            path = folder / entry.name
            if entry.name not in ("versions", "aliases", SUMMARY_FILE):
                self._foreign(path, "not part of a name's layout")
            elif self._entry_ok(path, want_dir=entry.name != SUMMARY_FILE) and entry.name == "versions":
                self._versions(name, path)

    def _versions(self, name: str, folder: Path) -> None:
        for entry in _scan(folder):
            path = folder / entry.name
            if _TOMBSTONE.fullmatch(entry.name):
                self._entry_ok(path, want_dir=False)
            elif not entry.name.isdigit():
                self._foreign(path, "not a version number or tombstone")
            elif self._entry_ok(path, want_dir=True):
                self._version(name, int(entry.name), path)

    def _version(self, name: str, number: int, folder: Path) -> None:
        version = _Version(name, number, folder)
        self.report.versions += 1
        for entry in _scan(folder):
            path = folder / entry.name
            if entry.name == "reports":
                if self._entry_ok(path, want_dir=True):
                    for report in _scan(path):
                        self._entry_ok(path / report.name, want_dir=False)
            elif entry.name != "capture.json":
                self._foreign(path, "not part of a version's layout")
        meta_path = folder / "capture.json"
        try:
            raw = read_regular(meta_path)
        except (CorruptCaptureError, OSError) as error:
            self.problem("metadata", meta_path, str(error))
            version.broken = True
            self.versions.append(version)
            return
        try:
            data = json.loads(raw)
            validate_capture(data, str(meta_path))
            if data.get("name") not in (None, name) or data.get("version") not in (None, number):
                raise CorruptCaptureError(f"{meta_path}: records {data.get('name')}:v{data.get('version')}, "
                                          f"stored as {name}:v{number}")
        except (ValueError, RecursionError, CorruptCaptureError) as error:
            self.problem("metadata", meta_path, str(error).replace(f"{meta_path}: ", ""))
            self.mentioned.update(d.partition(":")[2] for d in damaged_entry(raw, "")["blobs"])
            version.broken = True
            self.versions.append(version)
            return
        version.blobs = referenced_blobs(data)
        packs = data.get("packs", [])
        version.members = [(packs[e["pack"]]["payload"], e["payload"], e["nbytes"])
                           for e in data["tensors"].values() if e.get("payload") and "pack" in e]
        self.mentioned.update(d.partition(":")[2] for d in version.blobs)
        self.versions.append(version)

    def _aliases(self, folder: Path, good: set[int]) -> None:
        for entry in _scan(folder):
            path = folder / entry.name
            try:
                validate_alias(entry.name)
            except InvalidNameError as error:
                self._foreign(path, f"not an alias name: {error}")
                continue
            if not self._entry_ok(path, want_dir=False):
                continue
            try:
                target = int(read_regular(path).decode().strip())
            except (ValueError, OSError, CorruptCaptureError) as error:
                self._alias(path, f"unreadable ({error})")
                continue
            if target not in good:
                self._alias(path, f"points at v{target}, which " + (
                    "is damaged" if target in self._numbers(folder.parent) else "does not exist"))

    def _alias(self, path: Path, why: str) -> None:
        self.problem("alias", path, why)
        self.aliases.append((path, why))

    def _numbers(self, name_dir: Path) -> set[int]:
        return {v.number for v in self.versions if v.path.parent.parent == name_dir}

    def _summary(self, name: str, folder: Path) -> None:
        path = folder / SUMMARY_FILE
        try:
            stored = json.loads(read_regular(path))
        except FileNotFoundError:
            return  # none yet: readers compute it
        except (ValueError, OSError, CorruptCaptureError) as error:
            self.problem("summary", path, f"unreadable ({error})")
            return
        if not isinstance(stored, dict) or stored.get("summary") != 1:
            self.problem("summary", path, "not a summary this modulelens writes")
            return
        vkey, akey = current_keys(folder)
        if (stored.get("versions_key"), stored.get("aliases_key")) != (vkey, akey):
            return  # not trusted by readers: they rebuild it
        truth = {v.number: sorted(v.blobs) for v in self.versions if v.name == name and not v.broken}
        listed = stored.get("versions") if isinstance(stored.get("versions"), dict) else {}
        for number, blobs in truth.items():
            entry = listed.get(str(number))
            if not isinstance(entry, dict) or sorted(entry.get("blobs", ())) != blobs:
                self.problem("summary", path, f"marked current but wrong about v{number}")
                return
        if {int(k) for k in listed if k.isdigit()} - set(truth) - self._numbers(folder):
            self.problem("summary", path, "marked current but lists versions that do not exist")

    def _payloads(self) -> None:
        """Full hash of every referenced blob (once each), then each pack member's own hash."""
        bad: dict[str, str] = {}
        needed: dict[str, int] = {}
        for version in self.versions:
            needed.update(version.blobs)
        for digest, nbytes in sorted(needed.items()):
            why = self._check_blob(digest, nbytes)
            if why:
                bad[digest] = why
        members: dict[str, set[tuple[str, int]]] = {}
        for version in self.versions:
            for pack, member, nbytes in version.members:
                if pack not in bad:
                    members.setdefault(pack, set()).add((member, nbytes))
        for pack, wanted in members.items():
            why = self._check_members(pack, wanted)
            if why:
                bad[pack] = why
                self.problem("corrupt-payload", self.repo.blob_path(pack), why)
        for version in self.versions:
            damaged = sorted(d for d in version.blobs if d in bad)
            if damaged and not version.broken:
                version.broken = True
                self.problem("missing-payload" if "missing" in bad[damaged[0]] else "corrupt-payload",
                             version.path, f"{version.name}:v{version.number} needs {len(damaged)} damaged "
                             f"payload(s): {damaged[0]} ({bad[damaged[0]]})")

    def _check_blob(self, digest: str, nbytes: int) -> str | None:
        try:
            path = self.repo.blob_path(digest)
        except CorruptCaptureError as error:
            return str(error)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return "missing"
        if not stat.S_ISREG(info.st_mode):
            return "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"  # found by _blobs
        if info.st_size != nbytes:
            self.problem("corrupt-payload", path, f"{info.st_size} bytes, expected {nbytes}")
            self.move.append(path)
            return "truncated or extended"
        self.report.payloads_checked += 1
        self.report.bytes_checked += nbytes
        try:
            actual = _hash_file(path, nbytes)
        except FileNotFoundError:  # freed meanwhile by a gc after an rm of its last version
            return "missing"
        if actual != digest:
            self.problem("corrupt-payload", path, f"content hashes to {actual}")
            self.move.append(path)
            return "hash differs"
        return None

    def _check_members(self, pack: str, wanted: set[tuple[str, int]]) -> str | None:
        path = self.repo.blob_path(pack)
        try:
            fd = open_regular(path)
        except FileNotFoundError:
            return "missing"
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

    def _blobs(self) -> None:
        blobs = self.root / "blobs"
        for shard in _scan(blobs):
            folder = blobs / shard.name
            if not re.fullmatch(r"[0-9a-f]{2}", shard.name):
                self._foreign(folder, "not a blob folder")
                continue
            if not self._entry_ok(folder, want_dir=True):
                continue
            for entry in _scan(folder):
                path = folder / entry.name
                hexdigest = entry.name.removesuffix(".ok")
                if not _HEX64.fullmatch(hexdigest) or hexdigest[:2] != shard.name:
                    self._foreign(path, "not a blob")
                elif self._entry_ok(path, want_dir=False) and hexdigest == entry.name \
                        and hexdigest not in self.mentioned:
                    self.report.orphan_blobs += 1
                    self.report.orphan_bytes += os.lstat(path).st_size

    def _staging(self) -> None:
        from modulelens.repo.local import writer_alive

        for entry in _scan(self.root / "tmp"):
            if entry.is_symlink():
                self._entry_ok(self.root / "tmp" / entry.name, want_dir=False)
            elif not writer_alive(entry.name):
                self.report.stale_staging += 1


def _scan(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as found:
            return sorted(found, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _hash_file(path: Path, size: int) -> str:
    if size == 0:
        return hash_bytes(b"")
    fd = open_regular(path)
    try:
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
            return hash_bytes(memoryview(mapped))
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------ repair


def _repair(repo: Repo, checker: _Checker, report: FsckReport) -> None:
    root = repo.root
    if os.path.lexists(root / QUARANTINE):
        require_dir(root / QUARANTINE)  # never move anything through a link planted there
    run = root / QUARANTINE / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}"
    moved: set[str] = set()

    def quarantine(path: Path) -> bool:
        relative = str(path.relative_to(root))
        if relative in moved or any(relative.startswith(m + "/") for m in moved):
            return True  # already moved with its folder
        target = run / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(path, target)
        except FileNotFoundError:
            return False
        moved.add(relative)
        report.actions.append(f"moved {relative} to {target.relative_to(root)}")
        if path.parent.parent == root / "blobs" and _HEX64.fullmatch(path.name):
            with contextlib.suppress(FileNotFoundError):  # its verification marker goes with it
                os.rename(path.with_name(path.name + ".ok"), target.with_name(path.name + ".ok"))
        return True

    for version in checker.versions:
        if version.broken:
            # The number stays used: a later save never takes a quarantined version's number.
            with contextlib.suppress(FileExistsError):
                write_new_file(version.path.with_name(f"{version.number}.removed"), b"", mode=0o644)
            quarantine(version.path)
    for path, _ in checker.aliases:
        quarantine(path)
    for path in checker.move:
        quarantine(path)
    for name in checker.summaries:
        if (root / "names" / quote(name, safe="")).is_dir():
            repo.rebuild_summary(name)
    report.actions.append(f"rebuilt the summaries of {len(checker.summaries)} names")
    if report.stale_staging:
        report.actions.append(f"left {report.stale_staging} staging entries of dead writers: "
                              "`modulelens gc --tmp-older-than 0` frees them")
    gone = {str(p) for p in moved}
    report.problems[:] = [Problem(p.kind, p.path, p.detail, repaired=_covered(p, gone)) for p in report.problems]
    if moved:
        report.quarantine = str(run)
        (run / "fsck.json").write_text(json.dumps(report.to_dict(), indent=1))


def _covered(problem: Problem, moved: set[str]) -> bool:
    """Whether repairing dealt with ``problem``: its path (or a folder above it) was quarantined,
    or it was a summary (all are rebuilt)."""
    if problem.kind == "summary":
        return True
    path = problem.path
    return any(path == m or path.startswith(m + "/") for m in moved)


# ------------------------------------------------------------------------------------ remote


def _remote_fsck(repo: Repo) -> FsckReport:
    """Metadata, payload presence and sizes, and aliases of a remote repo, from listings."""
    report = FsckReport(repo=repo.location)
    sizes = {key.rsplit("/", 1)[-1]: int(info.get("size", info.get("Size", -1)))
             for key, info in repo.store.list("blobs").items()}
    referenced: set[str] = set()
    for name in repo.names():
        report.names += 1
        prefix = f"names/{quote(name, safe='')}"
        good = set()
        for number in repo.version_numbers(name):
            report.versions += 1
            where = f"{prefix}/versions/{number}/capture.json"
            try:
                blobs = referenced_blobs(repo.read_metadata(name, number))
            except CorruptCaptureError as error:
                report.problems.append(Problem("metadata", where, str(error)))
                continue
            referenced.update(d.partition(":")[2] for d in blobs)
            damaged = [(d, n) for d, n in sorted(blobs.items()) if sizes.get(d.partition(":")[2]) != n]
            for digest, nbytes in damaged:
                hexdigest = digest.partition(":")[2]
                found = sizes.get(hexdigest)
                report.problems.append(Problem(
                    "missing-payload" if found is None else "corrupt-payload", f"blobs/{hexdigest[:2]}/{hexdigest}",
                    f"needed by {name}:v{number}: " + ("missing" if found is None else f"{found} bytes, expected {nbytes}")))
            report.payloads_checked += len(blobs) - len(damaged)
            report.bytes_checked += sum(n for d, n in blobs.items() if (d, n) not in damaged)
            if not damaged:
                good.add(number)
        for alias, number in repo.aliases(name).items():
            if number not in good:
                report.problems.append(Problem("alias", f"{prefix}/aliases/{alias}",
                                               f"points at v{number}, which is damaged or does not exist"))
    orphans = set(sizes) - referenced
    report.orphan_blobs, report.orphan_bytes = len(orphans), sum(sizes[h] for h in orphans)
    report.actions.append("remote repo: payload sizes checked from the listing, not their hashes")
    return report
