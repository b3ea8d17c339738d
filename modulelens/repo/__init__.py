"""Repos: where captures live: a local directory, or object storage (``s3://``, any fsspec URL).

One :class:`Repo` holds what a repo means (names, versions, aliases, summaries, reports, save,
gc, fsck, push/pull); one :class:`~modulelens.repo.store.Store` interface holds how its files are
kept, implemented by a directory (:class:`~modulelens.repo.local.LocalStore`) and by every service
of a repo written once over an object backend, with a local cache
(:class:`~modulelens.repo.remote.RemoteStore` over a :class:`~modulelens.repo.backend.ObjectBackend`:
eight primitives; fsspec's, S3's, ``memory://``'s and a SQLite file's). ``Repo(location)`` opens the
store registered for the location's scheme (:func:`register_store`, :mod:`modulelens.repo.registry`).
Layout, and how to add a store: docs/repo-layout.md.

Its modules in layers, each importing only from the layers below it (``tests/repo/test_structure.py``
reads this table and checks it against every import, those inside functions included; imports for
annotations only are not counted: ``fsck`` and ``transfer`` name ``Repo`` in annotations, and
``Repo.fsck``/``Repo.push`` import them when called)::

    wandb_registry
    repository
    fsck transfer registry garbage publish payload_writes note_edits reports aliases
    remote
    local leases _objects_s3 _objects_memory _objects_sqlite
    blob_writer local_audit local_blobs local_locks
    index markers trust _objects notes versions
    layout packs location backend
    store names files collector locks remote_errors

``store`` is the interface: the front end (``repository``, ``index``, ``fsck``) and both stores
(``local``, ``remote``) depend on it, never on each other's internals. ``backend`` is the object
backends' interface, which ``remote`` and ``leases`` rest on; ``registry`` alone names the stores
and the backends (``_objects``, ``_objects_s3``, ``_objects_memory``, ``_objects_sqlite``) to build them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from modulelens.repo.backend import ObjectBackend, ObjectInfo
from modulelens.repo.location import default_repo_path
from modulelens.repo.names import Ref, parse_ref
from modulelens.repo.notes import VersionNotes
from modulelens.repo.registry import object_store, register_store
from modulelens.repo.repository import GcReport, Repo, VersionInfo
from modulelens.repo.trust import TrustPolicy

if TYPE_CHECKING:
    from modulelens.repo.transfer import TransferReport

__all__ = ["GcReport", "ObjectBackend", "ObjectInfo", "Ref", "Repo", "TransferReport", "TrustPolicy", "VersionInfo",
           "VersionNotes", "default_repo_path", "object_store", "parse_ref", "register_store"]


def __getattr__(name: str) -> Any:
    if name == "TransferReport":  # on first use: push/pull's module (and its thread pool) is not needed to list
        from modulelens.repo.transfer import TransferReport

        return TransferReport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
