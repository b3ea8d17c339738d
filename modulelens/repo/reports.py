"""Reports stored with a version (``reports/`` in its folder: profile, verify, ...): written, listed
and read back checked (:func:`~modulelens.format.reports.validate_report`), over the
:class:`~modulelens.repo.store.Store` interface (docs/repo-layout.md)."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from modulelens.errors import CaptureNotFoundError, CorruptCaptureError
from modulelens.repo.layout import reports_key
from modulelens.repo.names import validate_report_file

if TYPE_CHECKING:
    from modulelens.repo.repository import Repo

# A report's file name as the tools write it: KIND-STAMP-ID.json (add_report); the stamp orders
# reports before they are read. A pushed report keeps its name, whatever it is.
_STAMP_FORMAT = "%Y%m%dT%H%M%SZ"
_STAMP_IN_NAME = re.compile(r"-(\d{8}T\d{6}Z)-")


def add_report(repo: Repo, ref: str, kind: str, data: Mapping[str, object]) -> Path | str:
    """Store a tool's report (profile, verify, ...) with the version it was made on; returns
    where it is (a path, or a URL)."""
    name, version = repo.resolve(ref)
    stamp = time.strftime(_STAMP_FORMAT, time.gmtime())
    key = f"{reports_key(name, version)}/{kind}-{stamp}-{uuid.uuid4().hex[:8]}.json"
    write_report(repo, name, version, key,
                 json.dumps({"kind": kind, "created": stamp, **data}, indent=1, default=str).encode())
    return repo.store.where(key)


def put_report(repo: Repo, name: str, version: int, filename: str, data: bytes) -> None:
    """Store a report file under its original name (push/pull), once it is checked like a
    capture's metadata (:func:`~modulelens.format.reports.validate_report`).

    Raises:
        CorruptCaptureError: the report is not JSON or not a report (nothing is written).
    """
    parse_report(data, f"report {filename} of {name}:v{version}")
    write_report(repo, name, version, f"{reports_key(name, version)}/{validate_report_file(filename)}", data)


def write_report(repo: Repo, name: str, version: int, key: str, data: bytes) -> None:
    """Write one report file of ``name:v{version}`` at ``key``.

    Raises:
        CaptureNotFoundError: the version was removed meanwhile.
    """
    repo._require_layout()
    try:
        repo.store.write(key, data)
    except FileNotFoundError:  # the version's folder is gone (removed meanwhile)
        raise CaptureNotFoundError(f"{name}:v{version} does not exist in {repo.location}") from None


def report_files(repo: Repo, name: str, version: int) -> dict[str, bytes]:
    """A version's report files by file name (for copying them to another repo); a report that
    cannot be read safely (a link) is left out, never copied from outside the repo."""
    folder = reports_key(name, version)
    try:
        files = repo.store.files(folder)
    except CorruptCaptureError:
        return {}  # reports/ is a link or not a folder: never copied from outside the repo (fsck reports it)
    found = repo.store.read_many([f"{folder}/{f}" for f in files if f.endswith(".json")])
    return {key.rsplit("/", 1)[1]: data for key, data in sorted(found.items())}


def reports(repo: Repo, ref: str, kind: str | None = None, *,
            problems: list[str] | None = None) -> list[dict[str, object]]:
    """The reports stored with ``ref`` (of ``kind`` only, when given), each with its ``path``.

    A report that cannot be read or is not a report (:func:`~modulelens.format.reports.validate_report`)
    is left out; ``problems``, when given, gets one line per report left out, naming it and why.
    """
    name, version = repo.resolve(ref)
    folder = reports_key(name, version)
    try:
        files = repo.store.files(folder)
    except CorruptCaptureError as error:
        if problems is not None:
            problems.append(str(error))
        return []  # reports/ is a link or not a folder: skipped like an unreadable report (fsck reports it)
    keys = [f"{folder}/{f}" for f in files if f.endswith(".json") and (kind is None or f.startswith(kind + "-"))]
    found = repo.store.read_many(keys)
    reports = []
    for key in keys:
        if key in found:
            try:
                data = parse_report(found[key], f"report {key.rsplit('/', 1)[-1]}")
            except CorruptCaptureError as error:
                if problems is not None:
                    problems.append(str(error))
                continue
            reports.append({"path": str(repo.store.where(key)), **data})
    return reports


def parse_report(data: bytes, where: str) -> dict[str, object]:
    """A report file's JSON, checked (:func:`~modulelens.format.reports.validate_report`).

    Raises:
        CorruptCaptureError: not JSON (or nested past what the parser takes), or not a report.
    """
    from modulelens.format.reports import validate_report

    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise CorruptCaptureError(f"{where}: not JSON ({type(error).__name__})") from None
    return validate_report(parsed, where)


class VersionReports:
    """The reports stored with one version, newest first, read and checked only where a page shows
    them: the file names are listed (one directory read), a window of them read and checked
    (:func:`parse_report`) when asked. Reading and checking all 3,000 of a
    version's reports took 0.1 s once cached and 0.75 s for a first view, on every request, for a
    page that shows 20 (benchmarks/bench_ui.py --huge).

    Newest first is by the time in each file name, then the name (``created`` inside a file is
    known only once it is read); a file named otherwise (a report pushed from elsewhere) comes last.
    """

    def __init__(self, repo: Repo, name: str, version: int) -> None:
        self._repo = repo
        self.ref = f"{name}:v{version}"
        folder = reports_key(name, version)
        self.problem: str | None = None  # the folder itself cannot be read (a link, not a folder)
        try:
            files = [f for f in repo.store.files(folder) if f.endswith(".json")]
        except CorruptCaptureError as error:
            files, self.problem = [], str(error)
        files.sort(key=lambda f: (_report_stamp(f), f), reverse=True)
        self.files = files
        self._folder = folder

    def __len__(self) -> int:
        return len(self.files)

    def count(self, kind: str) -> int:
        """How many of the files are named as ``kind`` reports (``KIND-...``)."""
        return sum(f.startswith(kind + "-") for f in self.files)

    def read(self, start: int = 0, stop: int | None = None, *,
             kind: str | None = None) -> tuple[list[dict[str, object]], list[str]]:
        """Files ``start:stop`` (of those named as ``kind`` reports, when given), read and checked:
        the reports, each with its ``path``, and one line for each file that is not a report (naming
        it and why; the folder's own problem first)."""
        files = [f for f in self.files if f.startswith(kind + "-")] if kind is not None else self.files
        keys = [f"{self._folder}/{f}" for f in files[start:stop]]
        found = self._repo.store.read_many(keys)
        reports: list[dict[str, object]] = []
        problems = [self.problem] if self.problem and start == 0 else []
        for key in keys:
            where = f"report {key.rsplit('/', 1)[-1]}"
            if key not in found:
                problems.append(f"{where}: cannot be read (removed meanwhile, or not a regular file)")
                continue
            try:
                reports.append({"path": str(self._repo.store.where(key)), **parse_report(found[key], where)})
            except CorruptCaptureError as error:
                problems.append(str(error))
        return reports, problems


def _report_stamp(filename: str) -> str:
    match = _STAMP_IN_NAME.search(filename)
    return match.group(1) if match else ""
