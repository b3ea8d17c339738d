"""Copying versions between repos (``push``/``pull``): blobs the target lacks, then the manifest.

The manifest is committed last, so a copy interrupted at any point (even ``kill -9``) leaves no
visible version in the target, and running it again uploads only what is still missing. A version
already in the target (same capture content, whatever its number there) is not copied twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from modulelens.errors import CaptureNotFoundError, CorruptCaptureError
from modulelens.format.hashing import hash_bytes
from modulelens.repo.names import parse_ref
from modulelens.repo.packs import referenced_blobs

if TYPE_CHECKING:
    from modulelens.repo.repository import Repo, VersionInfo

_WORKERS = 8
# Versions committed together (one reservation, one index update): a push stopped midway redoes at
# most this many versions' index work (their blobs stay, and are not uploaded again).
_BATCH = 256
# Fields a repo sets on its own copy; everything else is the capture and identifies it.
_LOCAL_FIELDS = ("name", "version", "origin")


@dataclass
class TransferReport:
    """What a push or pull did: ``copied`` refs (as named in the target, and their ``versions``),
    versions the target already had (``present``), payload blobs and bytes uploaded, and aliases set."""

    copied: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    blobs_copied: int = 0
    bytes_copied: int = 0
    aliases: list[str] = field(default_factory=list)
    versions: list[VersionInfo] = field(default_factory=list)  # the copied versions, as in the target
    reports_skipped: list[str] = field(default_factory=list)  # reports (and notes) not copied: damaged

    def to_dict(self) -> dict[str, object]:
        return {"copied": self.copied, "present": self.present, "blobs_copied": self.blobs_copied,
                "bytes_copied": self.bytes_copied, "aliases": self.aliases, "reports_skipped": self.reports_skipped}


def content_id(metadata: Mapping[str, object]) -> str:
    """A version's identity across repos: the hash of its capture.json without the fields each
    repo sets for itself (name, version number, origin)."""
    body = {k: v for k, v in metadata.items() if k not in _LOCAL_FIELDS}
    return hash_bytes(json.dumps(body, sort_keys=True, default=str).encode())


def copy_versions(source: Repo, target: Repo, ref: str, *, aliases: bool = False,
                  record_origin: bool = True, find_existing: bool = True) -> TransferReport:
    """Copy ``ref`` from ``source`` to ``target``: ``name:v3``/``name:alias``/``name:latest`` one
    version, a bare ``name`` every version. Tags, metadata and reports come along; with
    ``aliases`` the source's aliases of the copied versions are set in the target too.

    Many versions go in batches: one hold of the target (one lease on object storage) for the whole
    copy, each blob looked for once, and per batch one reservation and one index update for all of
    its versions (``Repo.commit_versions``), so a push costs about one request per version beside
    its payloads (tests/repo/test_scale_remote.py counts them).

    Args:
        source: the repo to read (a remote one downloads through its cache).
        target: the repo to write.
        ref: what to copy.
        aliases: also move the target's aliases of the same names to the copied versions.
        record_origin: note the source repo and ref in each copy's ``origin`` (off for a capture
            staged locally on its way to the repo it was made for: the staging folder is no origin).
        find_existing: look for each version in the target first (the content ids its index keeps;
            a version without one is read). Off only for a capture being uploaded for the first
            time: it was just made, so the target cannot have it (a retry with ``push`` looks again).

    Returns:
        A :class:`TransferReport` (``bytes_copied`` counts payload bytes written to the target).

    Raises:
        CaptureNotFoundError: ``ref`` does not exist in ``source``.

    Example::

        copy_versions(Repo(), Repo("s3://team/captures"), "ranker/top_mlp:v3", aliases=True)
    """
    parsed = parse_ref(ref)
    versions = source.version_numbers(parsed.name) if parsed.selector is None else [source.resolve(parsed)[1]]
    if not versions:
        raise CaptureNotFoundError(f"no capture named {parsed.name!r} in {source.location}")
    name = parsed.name
    report = TransferReport()
    existing = _contents(target, name) if find_existing else {}
    source_aliases = source.aliases(name) if aliases else {}
    target_of: dict[int, int] = {}  # source version -> its version in the target
    todo: list[tuple[int, dict[str, Any], str]] = []
    same_as: dict[int, str] = {}  # source versions whose content is already on its way in this copy
    for version in versions:
        meta = source.read_metadata(name, version)
        key = content_id(meta)
        if key in existing:
            report.present.append(f"{name}:v{existing[key]}")
            target_of[version] = existing[key]
        elif any(key == k for _, _, k in todo):
            same_as[version] = key
        else:
            if record_origin:
                meta["origin"] = {"repo": source.location, "ref": f"{name}:v{version}"}
            todo.append((version, meta, key))
    if todo:
        with target.writing() as hold, \
                ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="modulelens-copy") as pool:
            present: set[str] = set()  # blobs found in (or copied to) the target under this hold
            for start in range(0, len(todo), _BATCH):
                batch = todo[start:start + _BATCH]
                while True:
                    for version, meta, _ in batch:
                        _copy_blobs(source, target, name, version, meta, report, present, pool)
                    if hold.intact():  # else a gc may have run meanwhile: look again
                        break
                    present.clear()
                infos = target.commit_versions(name, [meta for _, meta, _ in batch], [key for _, _, key in batch])
                for (version, _, key), info in zip(batch, infos, strict=True):
                    report.versions.append(info)
                    report.copied.append(info.ref)
                    target_of[version] = existing[key] = info.version
    for version, key in same_as.items():
        target_of[version] = existing[key]
        report.present.append(f"{name}:v{existing[key]}")
    target_aliases = target.aliases(name) if source_aliases else {}
    _copy_notes(source, target, name, target_of, report)
    for version in versions:
        _copy_reports(source, target, name, version, target_of[version], report)
        for alias, aliased in source_aliases.items():
            if aliased == version and target_aliases.get(alias) != target_of[version]:
                target.set_alias(f"{name}:v{target_of[version]}", alias)
                report.aliases.append(f"{name}:{alias}")
    return report


def _contents(target: Repo, name: str) -> dict[str, int]:
    """Content id -> version of every version of ``name`` in ``target``: from its index (one read
    per name), reading the manifest only of versions committed without one (saved directly)."""
    found = {}
    for version, entry in target.index_entries(name).items():
        key = entry.get("content")
        found[key if isinstance(key, str) else content_id(target.read_metadata(name, version))] = version
    return found


def _copy_blobs(source: Repo, target: Repo, name: str, version: int, meta: dict[str, Any],
                report: TransferReport, present: set[str], pool: ThreadPoolExecutor) -> None:
    blobs = referenced_blobs(meta)
    packs = {pack["payload"] for pack in meta.get("packs", ())}
    unknown = [d for d in blobs if d not in present]
    missing = [d for d, there in zip(unknown, pool.map(target.has_blob, unknown), strict=True) if not there]
    source.download({d: blobs[d] for d in missing}, label=f"{name}:v{version}")

    def copy(digest: str) -> int:
        # checked in the source as a load checks it (a pack's members too), then every byte hashed
        # as it is copied (never linked, never taken as verified: it is another repo's file)
        return target.put_blob_file(digest, source.check_blob(digest, blobs[digest], pack=digest in packs),
                                    missing=True)

    sizes = list(pool.map(copy, missing))
    present.update(blobs)
    report.blobs_copied += len(missing)
    report.bytes_copied += sum(sizes)


def _copy_reports(source: Repo, target: Repo, name: str, version: int, target_version: int,
                  report: TransferReport) -> None:
    """Copy a version's reports; one that is not a report (checked like metadata) stays behind, named."""
    reports = source.report_files(name, version)
    if not reports:
        return  # (no listing of the target's reports: one request less per copied version)
    have = set(target.report_files(name, target_version))
    for filename, data in reports.items():
        if filename not in have:
            try:
                target.put_report(name, target_version, filename, data)
            except CorruptCaptureError as error:
                report.reports_skipped.append(str(error))


def _copy_notes(source: Repo, target: Repo, name: str, target_of: dict[int, int], report: TransferReport) -> None:
    """Copy the descriptions and edited tags of the copied versions (repo/notes.py), where the
    target's versions have none of their own; a damaged notes file stays behind, named."""
    try:
        notes = {version: entry for version, entry in source.name_notes(name).items() if version in target_of}
    except CorruptCaptureError as error:
        report.reports_skipped.append(f"notes of {name} not copied: {error}")
        return
    for version, entry in sorted(notes.items()):
        target.set_notes(f"{name}:v{target_of[version]}", entry, keep_existing=True)
