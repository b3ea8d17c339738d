"""The object backend: the few operations a storage backend implements for a remote repo.

A :class:`~modulelens.repo.remote.RemoteStore` writes every service of a repo (versions published
with a conditional create, aliases and index heads moved with compare-and-swap, leases for gc,
a local cache and mirror, blob upload and resumable download) once, over an
:class:`ObjectBackend`. A backend is a flat key space with eight primitives, like fsspec's
``AbstractFileSystem`` or httpx's ``BaseTransport``:

==================  =====================================================================
``get``             an object's bytes, or a byte range of them; ``None`` when absent
``stat``            its size, modification time and version tag (:class:`ObjectInfo`)
``list``            every object under a prefix, with its :class:`ObjectInfo`
``put_stream``      write an object from pieces (memory bounded; visible only when complete)
``create``          write only if no object has the key (atomic: one of racing writers wins)
``replace``         write only if the object still has the tag read (compare-and-swap)
``delete``          remove objects
``make_base``       create the container of the repo (a bucket, a folder, a database file)
==================  =====================================================================

Everything else (``read`` with a size limit, ranges, several reads at once, ``read_tagged``,
``exists``, the one-level ``ls``, ``folders_holding``, uploads of files and large buffers) is
written once here over those eight and may be overridden where a backend does it in fewer requests
(:mod:`modulelens.repo._objects_s3`). Registering a backend is one line::

    register_store("sqlite", object_store(SqliteObjects))

(:func:`~modulelens.repo.registry.object_store` builds a ``RemoteStore`` over the backend). The
implementations: fsspec's generic one (:class:`~modulelens.repo._objects.FsspecObjects`, any
protocol fsspec knows), S3's conditional PUTs (:mod:`modulelens.repo._objects_s3`), ``memory://``
(:mod:`modulelens.repo._objects_memory`) and a single SQLite file
(:mod:`modulelens.repo._objects_sqlite`). docs/repo-layout.md, "Adding a store", walks through one.

Keys: ``get``, ``stat``, ``put_stream``, ``create``, ``replace`` and ``delete`` take full keys
(made by :meth:`ObjectBackend.key` from the repo's relative ones); ``list``, ``ls`` and
``folders_holding`` take a prefix relative to the repo and answer with relative keys.
"""

from __future__ import annotations

import builtins
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from modulelens.errors import CorruptCaptureError
from modulelens.repo.files import too_large

#: Uploads above this size are streamed in pieces of this size (bounded memory: one piece at a time).
PART_BYTES = 64 << 20

#: ``key -> (largest size read, hint for the error)``: the limit of each key read together.
Limits = Callable[[str], tuple[int, str]]


class ObjectInfo(NamedTuple):
    """An object as the backend describes it.

    Attributes:
        size: its length in bytes.
        mtime: when it was last written, in seconds since the epoch, by the backend's clock (gc
            and leases compare the times of objects with each other, never with a local clock).
        tag: its version tag (an ETag), what :meth:`ObjectBackend.replace` compares against;
            ``None`` where the backend has none.
    """

    size: int
    mtime: float
    tag: str | None


def within(where: str, data: bytes, limit: int | None, hint: str = "") -> bytes:
    """``data``, unless it is larger than ``limit`` (a backend that told its size only by sending it).

    Raises:
        CorruptCaptureError: it is.
    """
    if limit is not None and len(data) > limit:
        raise too_large(where, len(data), limit, hint)
    return data


class ObjectBackend(ABC):
    """Keys under one URL: the operations a remote repo rests on (see the module docstring).

    Args:
        url: the repo's URL, as given to ``Repo()``.
        storage_options: what the caller passed as ``Repo(..., storage_options=...)``.

    Attributes:
        url: the URL.
        protocol: its scheme.
        base: the prefix of the repo's keys in the backend (``""``: the whole key space).
        atomic: :meth:`create` and :meth:`replace` are atomic across processes (a backend that is
            not says so, and a repo refuses what needs them instead of risking a lost update).
        sizes_first: :meth:`stat` is cheap, so a read with a size limit asks for the size first
            and refuses an object over the limit unread (over a network that is one request more;
            there the bytes are read and then measured, as :func:`within` does).

    Example::

        class DictObjects(ObjectBackend):   # the eight primitives over your storage
            def get(self, key, start=0, end=None): ...
            ...
        register_store("dict", object_store(DictObjects))
    """

    atomic = False
    sizes_first = False

    def __init__(self, url: str, storage_options: dict[str, object] | None = None) -> None:
        self.url = url
        self.protocol = url.split("://", 1)[0]
        self.base = ""

    # ------------------------------------------------------------------------------ the primitives

    @abstractmethod
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes | None:
        """The object's bytes from ``start`` to ``end`` (exclusive; ``None``: its end); ``None``
        when there is no object."""

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo | None:
        """The object's size, time and tag; ``None`` when there is none."""

    @abstractmethod
    def list(self, prefix: str) -> dict[str, ObjectInfo]:
        """Every object under the relative ``prefix`` (recursively): relative key -> its info."""

    @abstractmethod
    def put_stream(self, key: str, pieces: Iterable[memoryview | bytes]) -> None:
        """Write the object from ``pieces`` in order, replacing any; holding at most about one
        piece in memory, and visible to readers only once complete (never a prefix of it)."""

    @abstractmethod
    def create(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if no object has it; ``False`` when one does (another writer won).
        Atomic where :attr:`atomic` is true."""

    @abstractmethod
    def replace(self, key: str, data: bytes, tag: str | None) -> str | None:
        """Write ``key`` only if it still has ``tag`` (``None``: only if it does not exist);
        returns the new tag, ``None`` when it changed meanwhile.

        Raises:
            RemoteRepoError: the backend has no conditional overwrite (a swap could only fail).
        """

    @abstractmethod
    def delete(self, keys: builtins.list[str]) -> None:
        """Remove these objects; missing ones are skipped."""

    @abstractmethod
    def make_base(self) -> None:
        """Create the repo's container (a bucket, a folder, a database) when there is none yet."""

    # ------------------------------------------------------------------------------ derived: keys

    def key(self, *parts: str) -> str:
        """The full key of the repo's relative key ``parts`` (joined with ``/``)."""
        return "/".join((self.base, *parts)) if self.base else "/".join(parts)

    def relative(self, key: str) -> str:
        """The repo's relative key of the full ``key``."""
        key = key.lstrip("/") if not self.base.startswith("/") else key
        return key[len(self.base) + 1:] if self.base else key

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Held around a conditional write (a backend atomic only within one process locks here)."""
        yield

    # ------------------------------------------------------------------------------ derived: reads

    def read(self, key: str, limit: int | None = None, hint: str = "") -> bytes | None:
        """The object's bytes, or ``None`` when there is none.

        Raises:
            CorruptCaptureError: the object is larger than ``limit``; ``hint`` is added to the message.
        """
        if limit is not None and self.sizes_first:
            info = self.stat(key)
            if info is None:
                return None
            if info.size > limit:
                raise too_large(key, info.size, limit, hint)
        data = self.get(key)
        return None if data is None else within(key, data, limit, hint)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` of the object (fewer at its end; empty when it is gone)."""
        return self.get(key, start, end) or b""

    def read_many(self, keys: builtins.list[str], limit: Limits | None = None) -> dict[str, bytes]:
        """Several small objects; missing ones, and those larger than ``limit(key)`` bytes, are left out."""
        found = {}
        for key in keys:
            with contextlib.suppress(CorruptCaptureError):  # over its limit: left out
                data = self.read(key, *(limit(key) if limit else (None, "")))
                if data is not None:
                    found[key] = data
        return found

    def read_tagged(self, key: str, limit: int | None = None, hint: str = "") -> tuple[bytes | None, str | None]:
        """An object's bytes and the tag :meth:`replace` compares against. The tag is read first:
        bytes newer than their tag only make the next :meth:`replace` fail (and be retried), never
        overwrite a change unseen."""
        info = self.stat(key)
        if info is None:
            return None, None
        return self.read(key, limit, hint), info.tag

    def exists(self, key: str) -> bool:
        return self.stat(key) is not None

    def ls(self, prefix: str) -> dict[str, str]:
        """What is directly under the relative ``prefix``: name -> ``"file"`` or ``"directory"``."""
        found: dict[str, str] = {}
        for key in self.list(prefix):
            name, _, rest = key[len(prefix.rstrip("/")) + 1:].partition("/")
            found[name] = "directory" if rest else found.get(name, "file")
        return found

    def folders_holding(self, prefix: str, file: str, folder: str) -> builtins.list[str]:
        """The folders directly under ``prefix`` that hold the object ``file`` or the folder
        ``folder`` (the names of a repo: an index head, or versions), from one listing; other
        folders cost no request of their own."""
        found: set[str] = set()
        for key in self.list(prefix):
            parent, _, rest = key[len(prefix.rstrip("/")) + 1:].partition("/")
            if rest == file or rest.startswith(f"{folder}/"):
                found.add(parent)
        return sorted(found)

    def missing_bucket(self) -> str | None:
        """The bucket's name when the server says it does not exist (a backend with buckets), else ``None``."""
        return None

    # ------------------------------------------------------------------------------ derived: writes

    def put(self, key: str, data: bytes) -> None:
        """Write the object whole, replacing any."""
        self.put_stream(key, (data,))

    def upload_bytes(self, data: memoryview, key: str) -> None:
        """Upload a payload from memory, at most one part (64 MiB) copied at a time."""
        if len(data) <= PART_BYTES:
            self.put(key, bytes(data))
        else:
            self.put_stream(key, (data[start:start + PART_BYTES] for start in range(0, len(data), PART_BYTES)))

    def upload_file(self, source: Path, key: str) -> None:
        """Upload a local file as one object, one part at a time (visible only when complete)."""
        with open(source, "rb") as handle:
            self.put_stream(key, iter(lambda: handle.read(PART_BYTES), b""))
