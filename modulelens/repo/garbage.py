"""Removing versions and collecting the payloads no version uses: :func:`retire` (``Repo.remove``)
and :func:`collect` (``Repo.gc``), written once over the :class:`~modulelens.repo.store.Store`
interface (docs/repo-layout.md, "gc")."""

from __future__ import annotations

import contextlib
import operator
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from modulelens.errors import CaptureNotFoundError
from modulelens.repo.collector import collector_paused
from modulelens.repo.layout import CAPTURE_FILE, name_key, unquote_name, version_key
from modulelens.repo.packs import mentioned_blobs

if TYPE_CHECKING:
    from modulelens.repo.repository import Repo


@dataclass
class GcReport:
    """What :meth:`Repo.gc` removed (or, with ``dry_run``, would remove) and kept."""

    removed_blobs: int = 0
    freed_bytes: int = 0
    kept_blobs: int = 0
    removed_tmp: int = 0
    dry_run: bool = False
    removed: list[str] = field(default_factory=list)
    #: blobs kept because a version's ``capture.json`` uses them though its index entry does not
    #: list them (the index is wrong: ``modulelens fsck`` names it, ``--repair`` rebuilds it)
    kept_unindexed: int = 0

    def to_dict(self) -> dict[str, int]:  # counts, and dry_run (a bool is an int)
        return {"removed_blobs": self.removed_blobs, "freed_bytes": self.freed_bytes,
                "kept_blobs": self.kept_blobs, "removed_tmp": self.removed_tmp, "dry_run": self.dry_run,
                "kept_unindexed": self.kept_unindexed}


def retire(repo: Repo, name: str, versions: list[int]) -> list[int]:
    """Remove ``versions`` (the index marks them first, so readers stop showing them at once and
    a remover that stops midway leaves them hidden, finished by the next gc) and the aliases
    pointing at them, before their folders: an rm killed between the two left an alias naming a
    version that no longer existed (found by the stress suite's kill -9 row); now the gc that
    finishes it removes them too. Returns the versions this call removed (others were gone already)."""
    prefix = name_key(name)
    repo._summaries.begin_removal(name, prefix, versions)
    done: list[int] = []
    gone: list[int] = []
    try:
        for alias, version in repo._head(name).aliases.items():
            if version in versions:
                with contextlib.suppress(CaptureNotFoundError):  # a concurrent rm removed it first
                    repo.remove_alias(name, alias)
        for version in versions:
            if repo.store.retire(version_key(name, version)):
                done.append(version)
            gone.append(version)
    finally:  # a version that could not be removed (an error) is shown again
        repo._summaries.end_removal(name, prefix, gone, cancelled=[v for v in versions if v not in gone])
    return done


def collect(repo: Repo, *, dry_run: bool = False, tmp_age_s: float = 3600.0, grace_s: float | None = None,
            wait_s: float = 600.0) -> GcReport:
    """Delete payloads no version references, and stale staging files (the arguments and errors
    are :meth:`Repo.gc <modulelens.repo.repository.Repo.gc>`'s)."""
    grace = repo.store.gc_grace_s if grace_s is None else grace_s
    if not dry_run:
        repo._require_layout()  # (an unknown layout might reference blobs in ways this one cannot see)
    report = GcReport(dry_run=dry_run)
    with repo.store.exclusive(wait_s) as started, collector_paused():
        # (a dry run stores no rebuilt index: it writes nothing, even to a repo it may not write to)
        referenced, unfinished = _referenced(repo, persist=not dry_run)
        if not dry_run:
            for name, versions in unfinished:  # left by an rm that stopped midway (nothing saves now)
                retire(repo, name, versions)
        blobs = repo.store.blobs()
        unreferenced = {h: b for h, b in blobs.items()
                        if h not in referenced and not (grace > 0 and b.mtime > started - grace)}
        if unreferenced:
            # The index said what the versions use; before anything is deleted the versions
            # themselves say it (issue 35: one changed hex digit in a log, bit rot that keeps the
            # JSON valid, or a received repo's index, made gc delete a pack two versions used).
            # Only when there is something to delete: a gc that frees nothing reads no capture.
            mentioned = _mentioned_by_versions(repo, skip=dict(unfinished) if dry_run else {})
            report.kept_unindexed = sum(1 for h in unreferenced if h in mentioned)
            unreferenced = {h: b for h, b in unreferenced.items() if h not in mentioned}
        report.kept_blobs = len(blobs) - len(unreferenced)
        for hexdigest, blob in unreferenced.items():
            report.removed_blobs += 1
            report.freed_bytes += blob.size
            report.removed.append(hexdigest)
        if not dry_run:
            repo.store.remove_blobs([blob.key for blob in unreferenced.values()])
        report.removed_tmp = repo.store.clean_staging(time.time() - tmp_age_s, dry_run=dry_run)
    return report


def _mentioned_by_versions(repo: Repo, *, skip: dict[str, list[int]]) -> set[str]:
    """The blob hashes (hex) that some version's ``capture.json`` mentions, every version found
    by listing the name folders (never by the index, which is what may lie); ``skip``: versions
    an rm marked, per name (a dry run leaves them, a real gc removed them first). A version
    whose file cannot be read (a link, over the size limit) keeps what its index entry lists.

    Raises:
        CorruptCaptureError: a name's folders cannot be listed (it might use any blob).
    """
    found: set[str] = set()
    for quoted in repo.store.names():
        name = unquote_name(quoted)
        if name is None:
            continue
        prefix = f"names/{quoted}"
        gone = set(skip.get(name, ()))
        keys = [f"{prefix}/versions/{number}/{CAPTURE_FILE}"
                for number in repo.store.scan(prefix, aliases=False).versions if number not in gone]
        found.update(mentioned_blobs(repo.store.read_many(keys, immutable=True).values()))
    return {digest.partition(":")[2] for digest in found}


def _referenced(repo: Repo, *, persist: bool) -> tuple[set[str], list[tuple[str, list[int]]]]:
    """The blob hashes (hex) every version references, and the versions an rm left unfinished,
    per name. The indexes read die when this returns, inside gc's pause of the collector: kept
    until after it, the collector's next run looked at every entry (60-110 ms at 100,000)."""
    digests: set[str] = set()
    unfinished: list[tuple[str, list[int]]] = []
    for name, _prefix, index in repo._name_summaries(persist=persist, strict=True):
        # one C-level update per name: versions share most of their blobs, so the set stays
        # small and is stripped of the hash name once per distinct blob, not per version
        digests.update(*map(operator.itemgetter("blobs"), (index.versions or {}).values()))
        if index.removing:
            unfinished.append((name, index.removing))
    return {digest.partition(":")[2] for digest in digests}, unfinished
