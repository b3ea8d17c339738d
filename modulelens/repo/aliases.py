"""Moving and removing aliases (``name:golden``) with compare-and-swap, the index told first so
that a writer stopping midway leaves no listing wrong; over the :class:`~modulelens.repo.store.Store`
interface for ``Repo.set_alias`` and ``Repo.remove_alias``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from modulelens.errors import CaptureNotFoundError, InvalidNameError, RepoBusyError
from modulelens.repo.layout import alias_key, capture_key, name_key
from modulelens.repo.names import LATEST, validate_alias

if TYPE_CHECKING:
    from modulelens.repo.repository import Repo
    from modulelens.repo.versions import VersionInfo


def set_alias(repo: Repo, ref: str, alias: str) -> VersionInfo:
    """Point ``alias`` at the version ``ref`` resolves to, with compare-and-swap (:meth:`Repo.set_alias
    <modulelens.repo.repository.Repo.set_alias>`)."""
    validate_alias(alias)
    repo._require_layout()
    if alias == LATEST:
        raise InvalidNameError("'latest' is maintained automatically and cannot be set")
    name, version = repo.resolve(ref)
    key = alias_key(name, alias)
    prefix = name_key(name)
    # The index says the alias is moving first (readers read its file until it says where it
    # went), so a writer that stops between the two writes leaves no listing wrong.
    repo._summaries.begin_alias(name, prefix, alias)
    try:
        _, tag = repo.store.read_tagged(key)
        if not repo.store.swap(key, str(version).encode(), tag):
            raise RepoBusyError(f"alias {name}:{alias} was moved by another writer meanwhile; nothing changed")
        # An rm of this version that ran meanwhile removed the aliases pointing at it before this
        # one did (it marks its versions first, then looks at the aliases): take it back, or the
        # alias would point at nothing (found by the stress suite's race row). One head read and
        # one look, not the name's whole listing: an rm keeps the version in ``removing`` until
        # its folder is gone.
        if version in repo._head(name).removing or not repo.store.exists(capture_key(name, version)):
            data, _ = repo.store.read_tagged(key)
            if data is not None and data.strip() == str(version).encode():
                repo.store.remove(key)
            raise CaptureNotFoundError(f"{name}:v{version} was removed by another process meanwhile; "
                                       f"alias {alias!r} not set")
    finally:
        repo._summaries.end_alias(name, prefix, alias)
    return repo.info(name, version)


def remove_alias(repo: Repo, name: str, alias: str) -> None:
    """Remove the alias ``name:alias`` (the index says it is moving while its file goes)."""
    repo._require_layout()
    prefix = name_key(name)
    repo._summaries.begin_alias(name, prefix, alias)
    try:
        if not repo.store.remove(alias_key(name, alias)):  # never there, or removed meanwhile by a concurrent rm
            raise CaptureNotFoundError(f"{name} has no alias {alias!r}")
    finally:
        repo._summaries.end_alias(name, prefix, alias)
