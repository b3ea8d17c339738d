"""fsspec's generic object backend: any protocol fsspec knows (``gs://``, ``az://``, one registered
with fsspec itself) under the :class:`~modulelens.repo.backend.ObjectBackend` primitives.

Object stores have no rename and no lock, so the protocol (docs/repo-layout.md) rests on three
primitives that must be atomic on the server: *create* (write an object only if no object has that
key: S3 ``If-None-Match: *``), *replace* (write only if the object still has the ETag we read: S3
``If-Match``) and whole-object writes (an object is visible complete or not at all, multipart
uploads included).

:class:`FsspecObjects` is what any fsspec backend gets: fsspec's exclusive create, which is atomic
only where the backend implements it (:attr:`~modulelens.repo.backend.ObjectBackend.atomic` says
which), and no conditional overwrite. What a protocol does better lives in its own subclass, chosen
by the store registry (:mod:`modulelens.repo.registry`): S3's conditional PUTs, single GETs and
delimited listings in :mod:`modulelens.repo._objects_s3`, ``memory://``'s process lock in
:mod:`modulelens.repo._objects_memory`.
"""

from __future__ import annotations

import builtins
import contextlib
import datetime
import functools
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from modulelens.errors import MissingDependencyError, ModulelensError, RemoteRepoError
from modulelens.repo.backend import PART_BYTES, Limits, ObjectBackend, ObjectInfo
from modulelens.repo.remote_errors import is_precondition_failure, remote_error

_Method = TypeVar("_Method", bound=Callable[..., Any])


def remote_call(method: _Method) -> _Method:
    """Turn a remote failure inside ``method`` into one :class:`RemoteRepoError` line
    (:func:`~modulelens.repo.remote_errors.remote_error`, the one table of them); errors of
    modulelens's own and bugs pass through unchanged."""

    @functools.wraps(method)
    def call(self: FsspecObjects, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except ModulelensError:
            raise
        except Exception as error:
            converted = remote_error(error, self.url)
            if converted is None:
                raise
            raise converted from error

    return cast(_Method, call)


def _mtime(info: Mapping[str, Any]) -> float:
    """The server's modification time of an object, in seconds since the epoch."""
    for key in ("LastModified", "last_modified", "mtime", "created", "updated"):
        value = info.get(key)
        if isinstance(value, datetime.datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return 0.0


def object_info(info: Mapping[str, Any]) -> ObjectInfo:
    """What fsspec (or an S3 response) says of an object, as an :class:`ObjectInfo`."""
    size = info.get("size", info.get("Size", info.get("ContentLength", 0)))
    return ObjectInfo(int(size or 0), _mtime(info), info.get("ETag") or info.get("etag"))


class FsspecObjects(ObjectBackend):
    """Keys under one fsspec URL prefix, over any fsspec backend (``gs://...``); S3 and
    ``memory://`` have their own subclasses.

    Args:
        url: the fsspec URL of the repo.
        storage_options: passed to the fsspec filesystem.

    Raises:
        MissingDependencyError: fsspec, or the protocol's fsspec backend, is not installed.
    """

    def __init__(self, url: str, storage_options: dict[str, object] | None = None) -> None:
        super().__init__(url, storage_options)
        try:
            import fsspec
        except ImportError:
            raise MissingDependencyError("remote repos need fsspec: pip install 'modulelens[remote]'") from None
        try:
            self.fs, base = fsspec.core.url_to_fs(url, **self.options(dict(storage_options or {})))
        except ImportError as error:
            raise MissingDependencyError(f"{url}: {error} (for S3: pip install 'modulelens[remote]')") from None
        self.base = base.rstrip("/")

    def options(self, options: dict[str, object]) -> dict[str, object]:
        """The fsspec options this protocol opens its filesystem with (the caller's, plus defaults)."""
        return options

    # ------------------------------------------------------------------------------ the primitives

    @remote_call
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes | None:
        try:
            return bytes(self.fs.cat_file(key, start=start or None, end=end))
        except FileNotFoundError:
            return None

    @remote_call
    def stat(self, key: str) -> ObjectInfo | None:
        try:
            return object_info(self.fs.info(key))
        except FileNotFoundError:
            return None

    @remote_call
    def list(self, prefix: str) -> dict[str, ObjectInfo]:
        try:
            found = self.fs.find(self.key(prefix), detail=True)
        except FileNotFoundError:
            return {}
        return {self.relative(k): object_info(v) for k, v in found.items() if v.get("type", "file") != "directory"}

    @remote_call
    def put_stream(self, key: str, pieces: Iterable[memoryview | bytes]) -> None:
        with self.fs.open(key, "wb", block_size=PART_BYTES) as handle:
            for piece in pieces:
                handle.write(piece)

    @remote_call
    def create(self, key: str, data: bytes) -> bool:
        with self.exclusive():
            try:
                self.fs.pipe_file(key, data, mode="create")
            except FileExistsError:
                return False
            except OSError as error:
                if is_precondition_failure(error):
                    return False
                raise
        return True

    @remote_call
    def replace(self, key: str, data: bytes, tag: str | None) -> str | None:
        with self.exclusive():
            if tag is None:
                if not self.create(key, data):
                    return None
                info = self.stat(key)
                if info is not None and info.tag is not None:
                    return info.tag
            # Without a version tag the next swap could only fail: a writer would retry it until it
            # gave up, blaming other writers (seen on a filesystem registered with fsspec).
            raise RemoteRepoError(
                f"{self.protocol}:// has no compare-and-swap write here, so a name's index or alias cannot be "
                "updated safely while others write it; use an S3 repo or save in a local repo and push"
            )

    @remote_call
    def delete(self, keys: builtins.list[str]) -> None:
        if not keys:
            return
        try:
            self.fs.rm(keys)
        except FileNotFoundError:  # fsspec expands the whole list first: one missing key deleted none
            for key in keys:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(key)

    @remote_call
    def make_base(self) -> None:
        """Create the folder of the repo (on S3: its bucket, when there is none yet)."""
        self.fs.makedirs(self.base, exist_ok=True)

    # ------------------------------------------------------------------------------ fewer requests

    @remote_call
    def read(self, key: str, limit: int | None = None, hint: str = "") -> bytes | None:
        return super().read(key, limit, hint)

    @remote_call
    def read_many(self, keys: builtins.list[str], limit: Limits | None = None) -> dict[str, bytes]:
        """Several small objects at once (fsspec fetches them concurrently); missing ones, and those
        larger than ``limit(key)`` bytes, are left out."""
        if not keys:
            return {}
        found = self.fs.cat(keys, on_error="omit")
        return {k: bytes(v) for k, v in found.items()
                if not isinstance(v, BaseException) and (limit is None or len(v) <= limit(k)[0])}

    @remote_call
    def read_tagged(self, key: str, limit: int | None = None, hint: str = "") -> tuple[bytes | None, str | None]:
        return super().read_tagged(key, limit, hint)

    @remote_call
    def ls(self, prefix: str) -> dict[str, str]:
        """One LIST with a delimiter (not a recursive listing)."""
        try:
            found = self.fs.ls(self.key(prefix), detail=True)
        except FileNotFoundError:
            return {}
        return {str(item["name"]).rstrip("/").rsplit("/", 1)[-1]: item.get("type", "file") for item in found}

    @remote_call
    def folders_holding(self, prefix: str, file: str, folder: str) -> builtins.list[str]:
        """From one delimited listing: a backend that cannot be told which delimiter counts every
        folder (S3 and ``memory://`` look closer)."""
        return sorted(name for name, kind in self.ls(prefix).items() if kind == "directory")

    @remote_call
    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(key, data)

    @remote_call
    def upload_file(self, source: Path, key: str) -> None:
        """fsspec's own upload (multipart for large files, its parts sent concurrently where the
        backend can; visible only when complete)."""
        self.fs.put_file(str(source), key)

