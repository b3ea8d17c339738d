"""``modulelens fsck``: check a repo against its layout and the capture format; repair a local one.

One check for every store, through the :class:`~modulelens.repo.store.Store` interface. It reads
everything and writes nothing (it works on a read-only repo and takes no lock):

* every version's ``capture.json`` against the format (:func:`~modulelens.format.validate.validate_capture`),
  and its ``name``/``version`` against its key;
* every payload a version references, loose or a pack, as deeply as the store can without
  downloading it (:meth:`Store.verify_blobs <modulelens.repo.store.Store.verify_blobs>`: a
  directory checks presence, size, the full hash and each pack member's own hash; an object store
  presence and size from one listing);
* aliases (a readable number naming a version that exists and is not damaged), and each name's
  ``summary.json`` when readers would trust it as current (a wrong one could make gc free payloads
  a version needs);
* what the store finds beside the layout (:meth:`~modulelens.repo.store.Store.audit`: in a
  directory, entries the layout does not have, entries of the wrong kind and symbolic links
  anywhere, the top-level folders and lock files included), and the layout marker
  (``modulelens-repo.json``): a repo whose marker cannot be read is still read, but not written.

Orphan payloads (left by ``rm``) and staging left by dead writers are not damage: they are counted
and left to ``gc`` (``gc --tmp-older-than 0``).

``repair=True`` needs a store that can move things aside (a directory; :attr:`Store.can_repair
<modulelens.repo.store.Store.can_repair>`). It takes the repo's exclusive lock (as gc does) and
moves what is broken into ``quarantine/<UTC time>-<id>/`` at the same relative path, never
deleting anything (a lock file or ``quarantine`` folder that is a link, or of the wrong kind, is
moved aside first: the repair needs them): a version with damaged metadata or payloads (its number stays used: a
tombstone is left), a damaged payload (so a later save of the same content writes it again instead
of skipping it as present), foreign entries and links, dangling aliases (their content is kept in
the quarantined file), a damaged layout marker (then written afresh). It then rebuilds every name's summary and records the report in
``quarantine/<run>/fsck.json``. Where a store can repair, a version that needs a damaged payload is
reported itself (it is what the repair moves); elsewhere the payload is.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote

from modulelens.errors import CorruptCaptureError, InvalidNameError, RemoteRepoError
from modulelens.format.spec import FORMAT_VERSION
from modulelens.format.validate import validate_capture
from modulelens.repo.index import damaged_entry
from modulelens.repo.layout import HEX64, MARKER, SUMMARY_FILE, blob_key, capture_key, notes_key, unquote_name, version_key
from modulelens.repo.names import validate_alias
from modulelens.repo.notes import parse_notes
from modulelens.repo.packs import referenced_blobs
from modulelens.repo.store import Quarantine

if TYPE_CHECKING:
    from modulelens.repo.repository import Repo

#: Problem kinds, for scripts (docs/cli-json.md).
KINDS = ("metadata", "missing-payload", "corrupt-payload", "alias", "summary", "notes", "foreign", "symlink")


@dataclass(frozen=True)
class Problem:
    """One thing found broken: ``kind`` (one of :data:`KINDS`), the repo ``path`` it concerns, and
    a one-line ``detail``; ``repaired`` says whether ``--repair`` dealt with it."""

    kind: str
    path: str
    detail: str
    repaired: bool = False

    def to_dict(self) -> dict[str, object]:
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

    def to_dict(self) -> dict[str, object]:
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
    key: str  # its folder's key
    blobs: dict[str, int] = field(default_factory=dict)
    members: list[tuple[str, str, int]] = field(default_factory=list)  # (pack digest, member digest, nbytes)
    broken: bool = False


def fsck(repo: Repo, *, repair: bool = False) -> FsckReport:
    """Check (and with ``repair``, quarantine what is broken in) ``repo``.

    Args:
        repo: the :class:`~modulelens.repo.repository.Repo` to check.
        repair: move broken versions, payloads, foreign entries and dangling aliases into
            ``quarantine/`` and rebuild the summaries (under the repo's exclusive lock).

    Returns:
        The :class:`FsckReport`; ``report.clean`` is false while a problem is left.

    Raises:
        UsageError: ``repair`` on a store that cannot move things aside (a remote repo: pull into a
            local repo and repair that).
        CorruptCaptureError: ``repair`` cannot move an entry aside (a folder on its way is not a real one).

    Example::

        report = modulelens.Repo("/data/captures").fsck()
        for problem in report.problems:
            print(problem.kind, problem.path, problem.detail)
    """
    report = FsckReport(repo=repo.location, repair=repair)
    if not repair:
        _Checker(repo, report).run()
        return report
    quarantine = repo.store.quarantine()
    cleared = quarantine.prepare()  # (a lock that is a link would keep the repair from locking the repo)
    with repo.exclusive_lock():
        checker = _Checker(repo, report)
        for finding in cleared:
            checker.problem(finding.kind, finding.key, finding.detail)
            report.actions.append(f"moved {finding.key} to {quarantine.location}/{finding.key}")
        checker.run()
        _repair(repo, checker, quarantine, report)
    return report


class _Checker:
    def __init__(self, repo: Repo, report: FsckReport) -> None:
        self.repo = repo
        self.store = repo.store
        self.report = report
        self.versions: list[_Version] = []
        self.aliases: list[tuple[str, str]] = []  # (alias key, why it is broken)
        self.move: list[str] = []  # foreign entries, links and damaged blobs to quarantine
        self.names: dict[str, str] = {}  # name -> its folder's key
        self.mentioned: set[str] = set()  # blob hex digests any version (even a damaged one) names
        self.marker_damaged = False

    def problem(self, kind: str, key: str, detail: str) -> None:
        self.report.problems.append(Problem(kind, key, detail))

    def run(self) -> None:
        audit = self.store.audit()
        for finding in audit.findings:
            self.problem(finding.kind, finding.key, finding.detail)
            self.move.append(finding.key)
        self.report.stale_staging = audit.stale_staging
        if self.repo.layout_problem is not None:
            self.problem("metadata", MARKER, self.repo.layout_problem.replace(f"{self.store.where(MARKER)}: ", ""))
            self.marker_damaged = True
            if MARKER not in self.move:
                self.move.append(MARKER)
        try:
            quoted_names = sorted(self.store.names())
        except CorruptCaptureError:
            quoted_names = []  # names/ is a link or not a folder: the audit reports it
        for quoted in quoted_names:
            name = unquote_name(quoted)
            if name is not None and quote(name, safe="") == quoted:  # other folders: the audit's
                self._name(name, f"names/{quoted}")
        self._payloads()
        for name, prefix in self.names.items():  # after payloads: an alias of a damaged version dangles
            good = {v.number for v in self.versions if v.name == name and not v.broken}
            self._aliases(name, prefix, good)
            self._summary(name, prefix)
        self._orphans()

    def _name(self, name: str, prefix: str) -> None:
        self.report.names += 1
        self.names[name] = prefix
        self._notes(name)
        try:
            numbers = self.store.scan(prefix, aliases=False).versions
        except CorruptCaptureError:
            return  # its versions/ is a link or not a folder: the audit reports it
        for number in numbers:
            self._version(name, number)

    def _version(self, name: str, number: int) -> None:
        version = _Version(name, number, version_key(name, number))
        self.versions.append(version)
        self.report.versions += 1
        key = capture_key(name, number)
        where = str(self.store.where(key))
        raw = b""
        try:
            raw = self.store.read(key, immutable=True) or b""
            if not raw:
                raise CorruptCaptureError(f"{where}: missing or empty")
            data = json.loads(raw)
            validate_capture(data, where)
            if data.get("name") not in (None, name) or data.get("version") not in (None, number):
                raise CorruptCaptureError(f"{where}: records {data.get('name')}:v{data.get('version')}, "
                                          f"stored as {name}:v{number}")
        except (ValueError, RecursionError, OSError, CorruptCaptureError, RemoteRepoError) as error:
            self.problem("metadata", key, str(error).replace(f"{where}: ", ""))
            self.mentioned.update(d.partition(":")[2] for d in damaged_entry(raw, "")["blobs"])
            version.broken = True
            return
        if data["format_version"] > FORMAT_VERSION:
            self.report.actions.append(f"{name}:v{number} is in capture format {data['format_version']}, newer than "
                                       f"this modulelens reads ({FORMAT_VERSION}): only what the repo uses of it was checked")
        version.blobs = referenced_blobs(data)
        packs = data.get("packs", [])
        version.members = [(packs[e["pack"]]["payload"], e["payload"], e["nbytes"])
                           for e in data["tensors"].values() if e.get("payload") and "pack" in e]
        self.mentioned.update(d.partition(":")[2] for d in version.blobs)

    def _notes(self, name: str) -> None:
        """The name's notes file (descriptions, edited tags: repo/notes.py) must be one: a damaged
        one leaves listings with the captured tags and refuses edits; a repair moves it aside."""
        key = notes_key(name)
        try:
            parse_notes(self.store.read(key), key)
        except CorruptCaptureError as error:
            self.problem("notes", key, str(error).replace(f"{key}: ", ""))
            self.move.append(key)
        except (OSError, RemoteRepoError) as error:
            self.problem("notes", key, f"unreadable ({error})")

    def _numbers(self, name: str) -> set[int]:
        return {v.number for v in self.versions if v.name == name}

    def _payloads(self) -> None:
        """Every referenced blob once (then each pack member), as deeply as the store can."""
        needed: dict[str, int] = {}
        members: dict[str, set[tuple[str, int]]] = {}
        for version in self.versions:
            needed.update(version.blobs)
            for pack, member, nbytes in version.members:
                members.setdefault(pack, set()).add((member, nbytes))
        check = self.store.verify_blobs(needed, members)
        self.report.payloads_checked += check.checked
        self.report.bytes_checked += check.bytes
        if check.note:
            self.report.actions.append(check.note)
        bad = check.damaged
        for digest, why in sorted(bad.items()):
            try:
                key = blob_key(digest)
            except CorruptCaptureError:
                continue  # a malformed hash names no blob: the version's problem says so
            if why != "missing":
                self.problem("corrupt-payload", key, why)
                self.move.append(key)
            elif not self.store.can_repair:
                self.problem("missing-payload", key, why)
        for version in self.versions:
            damaged = sorted(d for d in version.blobs if d in bad)
            if damaged and not version.broken:
                version.broken = True
                if self.store.can_repair:  # the version is what a repair moves aside
                    self.problem("missing-payload" if "missing" in bad[damaged[0]] else "corrupt-payload",
                                 version.key, f"{version.name}:v{version.number} needs {len(damaged)} damaged "
                                 f"payload(s): {damaged[0]} ({bad[damaged[0]]})")

    def _aliases(self, name: str, prefix: str, good: set[int]) -> None:
        folder = f"{prefix}/aliases"
        try:
            filenames = self.store.files(folder)
        except CorruptCaptureError:
            return  # aliases/ is a link or not a folder: the audit reports it
        for filename in filenames:
            try:
                validate_alias(filename)
            except InvalidNameError:
                continue  # not an alias: the audit's
            key = f"{folder}/{filename}"
            try:
                target = int((self.store.read(key) or b"").decode().strip())
            except (ValueError, OSError, CorruptCaptureError, RemoteRepoError) as error:
                self._alias(key, f"unreadable ({error})")
                continue
            if target not in good:
                self._alias(key, f"points at v{target}, which " + (
                    "is damaged" if target in self._numbers(name) else "does not exist"))

    def _alias(self, key: str, why: str) -> None:
        self.problem("alias", key, why)
        self.aliases.append((key, why))

    def _summary(self, name: str, prefix: str) -> None:
        """The entries readers take from the name's stored index without reading capture files
        (repo/index.py) must agree with the versions on blobs: gc frees what they do not list."""
        key = f"{prefix}/{SUMMARY_FILE}"
        why = self.repo.summary_problem(name)
        if why is not None:
            self.problem("summary", key, f"not used ({why}); readers rebuild the index from the folders")
            return
        stored = self.repo.stored_summary(name)
        if stored is None:
            return  # nothing stored is trusted: readers rebuild it from the folders
        listed, lists_all = stored
        truth = {v.number: sorted(v.blobs) for v in self.versions if v.name == name and not v.broken}
        for number, blobs in truth.items():
            entry = listed.get(str(number))
            if entry is not None and entry.get("removing"):
                continue  # an rm marked it and stopped midway (killed): gc finishes the removal
            if entry is None and lists_all:
                self.problem("summary", key, f"does not list v{number}")
                return
            if entry and sorted(entry.get("blobs", ())) != blobs:
                self.problem("summary", key, f"wrong about v{number}")
                return
        # an entry marked as being removed may have lost its folder already (the rm was killed after
        # removing it, before dropping the entry): gc finishes that removal, as above
        shown = {int(k) for k, entry in listed.items() if k.isdigit() and not entry.get("removing")}
        if shown - set(truth) - self._numbers(name):
            self.problem("summary", key, "lists versions that do not exist")

    def _orphans(self) -> None:
        try:
            blobs = self.store.blobs()
        except CorruptCaptureError:
            return  # blobs/ is a link or not a folder: the audit reports it
        for hexdigest, blob in blobs.items():
            if HEX64.fullmatch(hexdigest) and blob.key == f"blobs/{hexdigest[:2]}/{hexdigest}" \
                    and hexdigest not in self.mentioned:
                self.report.orphan_blobs += 1
                self.report.orphan_bytes += blob.size


# ------------------------------------------------------------------------------------ repair


def _repair(repo: Repo, checker: _Checker, quarantine: Quarantine, report: FsckReport) -> None:
    def moved(key: str, to: str | None) -> None:
        if to is not None:
            report.actions.append(f"moved {key} to {to}")

    for version in checker.versions:
        if version.broken:
            moved(version.key, quarantine.retire(version.key))
    for key, _ in checker.aliases:
        moved(key, quarantine.move(key))
    for key in checker.move:
        moved(key, quarantine.move(key))
    if checker.marker_damaged:
        repo.rewrite_layout_marker()
        report.actions.append(f"wrote {MARKER} afresh")
    for name, prefix in checker.names.items():
        with contextlib.suppress(CorruptCaptureError):
            if repo.store.is_folder(prefix):
                repo.rebuild_summary(name)
    report.actions.append(f"rebuilt the summaries of {len(checker.names)} names")
    if report.stale_staging:
        report.actions.append(f"left {report.stale_staging} staging entries of dead writers: "
                              "`modulelens gc --tmp-older-than 0` frees them")
    gone = quarantine.moved
    report.problems[:] = [Problem(p.kind, p.path, p.detail, repaired=_covered(p, gone)) for p in report.problems]
    if gone:
        report.quarantine = quarantine.location
        quarantine.finish(json.dumps(report.to_dict(), indent=1).encode())


def _covered(problem: Problem, moved: set[str]) -> bool:
    """Whether repairing dealt with ``problem``: its path (or a folder above it) was quarantined,
    or it was a summary (all are rebuilt)."""
    if problem.kind == "summary":
        return True
    path = problem.path
    return any(path == m or path.startswith(m + "/") for m in moved)
