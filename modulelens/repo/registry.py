"""Which store keeps a repo: a registry of URL schemes, as fsspec's ``register_implementation``.

``Repo(location)`` asks :func:`open_store`, which looks the location's scheme up here: a path (no
scheme) and ``file://`` are a directory (:class:`~modulelens.repo.local.LocalStore`); ``memory://``,
``s3://``, ``s3a://`` and ``sqlite://`` an object backend (:mod:`modulelens.repo.backend`) under a
remote store with a local cache (:class:`~modulelens.repo.remote.RemoteStore`); any other scheme
fsspec knows (``gs://``, ``az://``, one registered with fsspec itself...) is handed to the same
remote store, over fsspec's generic backend. A new backend is one class of eight primitives and one
line, ``register_store("mine", object_store(MyObjects))`` (docs/repo-layout.md, "Adding a store").
An unknown scheme is refused in one line that lists the registered ones.

The built-in factories import their store when called, so listing a local repo imports no fsspec.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from modulelens.errors import UsageError
from modulelens.repo.location import default_repo_location
from modulelens.repo.store import Store

if TYPE_CHECKING:
    from modulelens.repo.backend import ObjectBackend

#: Builds the store of one location: ``(location, storage_options) -> Store``. ``location`` is the
#: text given to ``Repo()`` (a URL with its scheme, or a directory path for the local scheme ``""``).
StoreFactory = Callable[[str, "dict[str, object] | None"], Store]

#: The scheme of a location without ``://``: a local directory.
LOCAL_SCHEME = ""

_FACTORIES: dict[str, StoreFactory] = {}
_LOCK = threading.Lock()


def register_store(scheme: str, factory: StoreFactory, *, clobber: bool = False) -> None:
    """Make ``Repo("<scheme>://...")`` open its store with ``factory``.

    Args:
        scheme: the URL scheme, lowercase, without ``://`` (``""``: a location without a scheme,
            a directory path).
        factory: ``(location, storage_options) -> Store``; ``storage_options`` is what the caller
            passed to ``Repo(..., storage_options=...)`` (``None`` when nothing).
        clobber: replace a factory already registered for ``scheme`` (otherwise that is refused,
            so two plugins cannot silently take the same scheme).

    Raises:
        UsageError: ``scheme`` is not a plain lowercase scheme name, or is taken and ``clobber`` is false.

    Example::

        from modulelens.repo.registry import register_store
        register_store("mystore", lambda url, options: MyStore(url, **(options or {})))
        modulelens.Repo("mystore://bucket/captures")
    """
    if scheme and not (scheme.isascii() and scheme[0].isalpha() and scheme.islower()
                       and all(c.isalnum() or c in "+-." for c in scheme)):
        raise UsageError(f"a store scheme is a lowercase name such as 's3' (without '://'), not {scheme!r}")
    with _LOCK:
        if scheme in _FACTORIES and not clobber and _FACTORIES[scheme] is not factory:
            raise UsageError(f"the store scheme {scheme or '(local path)'!r} is registered already "
                             "(register_store(..., clobber=True) replaces it)")
        _FACTORIES[scheme] = factory


def object_store(backend: type[ObjectBackend] | str) -> StoreFactory:
    """The factory of a remote repo over an object backend: what :func:`register_store` takes.

    Args:
        backend: an :class:`~modulelens.repo.backend.ObjectBackend` subclass, or where to import it
            from when a repo is first opened (``"package.module:ClassName"``), so that registering
            it imports nothing.

    Returns:
        ``(location, storage_options) -> RemoteStore`` over ``backend(location, storage_options)``.

    Example::

        register_store("sqlite", object_store(SqliteObjects))
        modulelens.Repo("sqlite:///tmp/team.db")
    """
    def factory(location: str, storage_options: dict[str, object] | None) -> Store:
        from modulelens.repo.remote import RemoteStore  # here: listing a local repo needs no fsspec

        return RemoteStore(_resolve(backend)(location, storage_options))

    return factory


def _resolve(backend: type[ObjectBackend] | str) -> type[ObjectBackend]:
    if not isinstance(backend, str):
        return backend
    module, _, name = backend.partition(":")
    found: type[ObjectBackend] = getattr(importlib.import_module(module), name)
    return found


def registered_schemes() -> list[str]:
    """The schemes registered with :func:`register_store`, sorted (``""`` is a local path)."""
    with _LOCK:
        return sorted(_FACTORIES)


def scheme_of(location: str) -> str:
    """The scheme of ``location`` (lowercase, before ``://``), ``""`` for a path."""
    return location.split("://", 1)[0].lower() if "://" in location else LOCAL_SCHEME


def open_store(location: str | os.PathLike[str] | None = None, *,
               storage_options: Mapping[str, object] | None = None) -> Store:
    """The store a repo location names, built by the factory registered for its scheme.
    ``None``: ``$MODULELENS_REPO`` or the default local repo.

    Raises:
        UsageError: no store is registered for the location's scheme (the message lists those
            that are), or ``storage_options`` for a local directory.
        MissingDependencyError: a URL whose fsspec backend is not installed.
    """
    text = default_repo_location() if location is None else os.fspath(location)
    scheme = scheme_of(text)
    with _LOCK:
        factory = _FACTORIES.get(scheme)
    if factory is None:
        factory = _FSSPEC if _fsspec_knows(scheme) else None
    if factory is None:
        known = ", ".join(f"{s}://" for s in registered_schemes() if s)
        raise UsageError(f"no store for {scheme}:// (in {text[:200]}): registered are {known}, a directory path, "
                         "and any protocol fsspec knows (fsspec.available_protocols())")
    return factory(text, None if storage_options is None else dict(storage_options))  # (a copy: the factory may keep or change it)


def _fsspec_knows(scheme: str) -> bool:
    """Whether fsspec has an implementation for every protocol of ``scheme`` (``a::b`` chains)."""
    try:
        import fsspec
    except ImportError:
        return False  # fsspec is what every other scheme needs; without it the scheme is unknown
    known = set(fsspec.available_protocols()) | set(fsspec.registry)  # built in, and registered at run time
    return all(part in known for part in scheme.split("::"))


def _local(location: str, storage_options: dict[str, object] | None) -> Store:
    from modulelens.repo.local import LocalStore

    if storage_options:
        raise UsageError(f"storage_options apply to repos at URLs, not to the directory {location}")
    return LocalStore(Path(location.removeprefix("file://")).expanduser().absolute())


register_store(LOCAL_SCHEME, _local)
register_store("file", _local)
register_store("memory", object_store("modulelens.repo._objects_memory:MemoryObjects"))
register_store("s3", s3 := object_store("modulelens.repo._objects_s3:S3Objects"))
register_store("s3a", s3)
register_store("sqlite", object_store("modulelens.repo._objects_sqlite:SqliteObjects"))
_FSSPEC = object_store("modulelens.repo._objects:FsspecObjects")  # any other protocol fsspec knows
