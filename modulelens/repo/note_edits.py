"""Editing a version's notes (description, tags) with compare-and-swap of its name's notes file,
over the :class:`~modulelens.repo.store.Store` interface (docs/repo-layout.md, "Notes")."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from modulelens.errors import CaptureNotFoundError, CorruptCaptureError, RepoBusyError
from modulelens.repo.layout import notes_key
from modulelens.repo.notes import VersionNotes, notes_json, parse_notes

if TYPE_CHECKING:
    from modulelens.repo.repository import Repo
    from modulelens.repo.store import Store
    from modulelens.repo.versions import VersionInfo

_NOTES_ATTEMPTS = 20  # compare-and-swap tries of a notes edit before it gives up (RepoBusyError)


def edit_notes(repo: Repo, ref: str, change: Callable[[VersionNotes, tuple[str, ...]], VersionNotes]) -> VersionNotes:
    """Change one version's notes with compare-and-swap of the name's notes file: read, change,
    write only if nobody wrote in between (else again). Notes of versions removed since are
    dropped on the way (a new version has a higher number than any listed, so it is kept)."""
    repo._require_layout()
    name, version = repo.resolve(ref)
    listing = repo._listing(name)
    entries = listing.versions or {}
    if version not in entries:
        raise CaptureNotFoundError(f"{name}:v{version} does not exist in {repo.location}")
    captured = tuple(entries[version].get("tags") or ())
    newest = max(entries)
    key = notes_key(name)
    for _ in range(_NOTES_ATTEMPTS):
        raw, tag = repo.store.read_tagged(key)
        notes = {number: entry for number, entry in parse_notes(raw, str(repo.store.where(key))).items()
                 if number in entries or number > newest}
        notes[version] = change(notes.get(version, VersionNotes()), captured)
        if repo.store.swap(key, notes_json(notes), tag) is not None:
            return notes[version]
    raise RepoBusyError(f"the notes of {name} were changed by other writers {_NOTES_ATTEMPTS} times meanwhile; "
                        "nothing was written")


def with_edited_tags(store: Store, infos: list[VersionInfo]) -> list[VersionInfo]:
    """``infos`` with the tags people edited after capture (one notes file per name, read
    together). A damaged notes file leaves its name's tags as captured (fsck names the file)."""
    keys = {notes_key(name): name for name in dict.fromkeys(info.name for info in infos)}
    found = store.read_many(list(keys)) if keys else {}
    if not found:
        return infos
    edited_tags: dict[tuple[str, int], tuple[str, ...]] = {}
    for key, raw in found.items():
        with contextlib.suppress(CorruptCaptureError):
            for number, entry in parse_notes(raw, key).items():
                if entry.tags is not None:
                    edited_tags[(keys[key], number)] = entry.tags
    for info in infos:
        tags = edited_tags.get((info.name, info.version))
        if tags is not None:  # (each info's entry is its own: a fresh dict per listing)
            info._entry = {**info._entry, "tags": tags}
    return infos
