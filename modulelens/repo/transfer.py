"""Copying versions between repos (``push``/``pull``): blobs the target lacks, then the manifest.

The manifest is committed last, so a copy interrupted at any point (even ``kill -9``) leaves no
visible version in the target, and running it again uploads only what is still missing. A version
already in the target (same capture content, whatever its number there) is not copied twice.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from modulelens.errors import CaptureNotFoundError
from modulelens.format.hashing import hash_bytes
from modulelens.repo.names import parse_ref
from modulelens.repo.packs import referenced_blobs

if TYPE_CHECKING:
    from modulelens.repo.repository import Repo, VersionInfo

_WORKERS = 8
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

    def to_dict(self) -> dict[str, Any]:
        return {"copied": self.copied, "present": self.present, "blobs_copied": self.blobs_copied,
                "bytes_copied": self.bytes_copied, "aliases": self.aliases}


def content_id(metadata: dict[str, Any]) -> str:
    """A version's identity across repos: the hash of its capture.json without the fields each
    repo sets for itself (name, version number, origin)."""
    body = {k: v for k, v in metadata.items() if k not in _LOCAL_FIELDS}
    return hash_bytes(json.dumps(body, sort_keys=True, default=str).encode())


def copy_versions(source: Repo, target: Repo, ref: str, *, aliases: bool = False,
                  record_origin: bool = True, find_existing: bool = True) -> TransferReport:
    """Copy ``ref`` from ``source`` to ``target``: ``name:v3``/``name:alias``/``name:latest`` one
    version, a bare ``name`` every version. Tags, metadata and reports come along; with
    ``aliases`` the source's aliases of the copied versions are set in the target too.

    Args:
        source: the repo to read (a remote one downloads through its cache).
        target: the repo to write.
        ref: what to copy.
        aliases: also move the target's aliases of the same names to the copied versions.
        record_origin: note the source repo and ref in each copy's ``origin`` (off for a capture
            staged locally on its way to the repo it was made for: the staging folder is no origin).
        find_existing: look for each version in the target first (reads every manifest of the
            name there). Off only for a capture being uploaded for the first time: it was just
            made, so the target cannot have it (a retry with ``push`` looks again).

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
    existing = ({content_id(target.read_metadata(name, v)): v for v in target.version_numbers(name)}
                if find_existing else {})
    source_aliases = source.aliases(name) if aliases else {}
    for version in versions:
        meta = source.read_metadata(name, version)
        key = content_id(meta)
        if key in existing:
            report.present.append(f"{name}:v{existing[key]}")
            target_version = existing[key]
        else:
            if record_origin:
                meta["origin"] = {"repo": source.location, "ref": f"{name}:v{version}"}
            with target.writing():  # gc waits: the blobs are unreferenced until the commit
                _copy_blobs(source, target, name, version, meta, report)
                committed = target.commit_version(name, meta)
            report.versions.append(committed)
            target_version = committed.version
            existing[key] = target_version
            report.copied.append(f"{name}:v{target_version}")
        _copy_reports(source, target, name, version, target_version)
        for alias, aliased in source_aliases.items():
            if aliased == version and target.aliases(name).get(alias) != target_version:
                target.set_alias(f"{name}:v{target_version}", alias)
                report.aliases.append(f"{name}:{alias}")
    return report


def _copy_blobs(source: Repo, target: Repo, name: str, version: int, meta: dict[str, Any],
                report: TransferReport) -> None:
    blobs = referenced_blobs(meta)
    packs = {pack["payload"] for pack in meta.get("packs", ())}
    with ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="modulelens-copy") as pool:
        missing = [d for d, present in zip(blobs, pool.map(target.has_blob, blobs), strict=True) if not present]
        source.download({d: blobs[d] for d in missing}, label=f"{name}:v{version}")

        def copy(digest: str) -> int:
            # checked in the source as a load checks it (a pack's members too), then every byte
            # hashed as it is copied (never linked)
            return target.put_blob_file(digest, source.check_blob(digest, blobs[digest], pack=digest in packs))

        sizes = list(pool.map(copy, missing))
    report.blobs_copied += len(missing)
    report.bytes_copied += sum(sizes)


def _copy_reports(source: Repo, target: Repo, name: str, version: int, target_version: int) -> None:
    reports = source.report_files(name, version)
    if not reports:
        return  # (no listing of the target's reports: one request less per copied version)
    have = set(target.report_files(name, target_version))
    for filename, data in reports.items():
        if filename not in have:
            target.put_report(name, target_version, filename, data)
