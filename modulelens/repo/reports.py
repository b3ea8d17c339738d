"""Reports stored with a version (``reports/`` in its folder: profile, verify, ...): written, listed
and read back checked (:func:`~modulelens.format.reports.validate_report`), over the
:class:`~modulelens.repo.store.Store` interface (docs/repo-layout.md)."""

from __future__ import annotations

import json
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


def add_report(repo: Repo, ref: str, kind: str, data: Mapping[str, object]) -> Path | str:
    """Store a tool's report (profile, verify, ...) with the version it was made on; returns
    where it is (a path, or a URL)."""
    name, version = repo.resolve(ref)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
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
