"""Object storage under one fsspec URL: the few server operations a remote store rests on.

Object stores have no rename and no lock, so the protocol (docs/repo-layout.md) rests on three
primitives that must be atomic on the server: *create* (write an object only if no object has that
key: S3 ``If-None-Match: *``), *replace* (write only if the object still has the ETag we read: S3
``If-Match``) and whole-object writes (an object is visible complete or not at all, multipart
uploads included).

:class:`ObjectStore` is what any fsspec backend gets: fsspec's exclusive create, which is atomic
only where the backend implements it (:attr:`ObjectStore.atomic` says which), and no conditional
overwrite. What a protocol does better lives in its own subclass, chosen by the store registry
(:mod:`modulelens.repo.registry`): S3's conditional PUTs, single GETs and delimited listings in
:mod:`modulelens.repo._objects_s3`, ``memory://``'s process lock in :mod:`modulelens.repo._objects_memory`.
"""

from __future__ import annotations

import builtins
import contextlib
import datetime
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

from modulelens.errors import MissingDependencyError, ModulelensError, RemoteRepoError
from modulelens.repo.files import too_large
from modulelens.repo.remote_errors import is_precondition_failure, remote_error

# Uploads above this size go through the multipart writer (bounded memory: one part at a time).
_PART_BYTES = 64 << 20
_Method = TypeVar("_Method", bound=Callable[..., Any])


def remote_call(method: _Method) -> _Method:
    """Turn a remote failure inside ``method`` into one :class:`RemoteRepoError` line
    (:func:`~modulelens.repo.remote_errors.remote_error`, the one table of them); errors of
    modulelens's own and bugs pass through unchanged."""

    @functools.wraps(method)
    def call(self: ObjectStore, *args: Any, **kwargs: Any) -> Any:
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


def within(where: str, data: bytes, limit: int | None, hint: str = "") -> bytes:
    """``data``, unless it is larger than ``limit`` (a backend that told its size only by sending it)."""
    if limit is not None and len(data) > limit:
        raise too_large(where, len(data), limit, hint)
    return data


def _mtime(info: dict[str, Any]) -> float:
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


class ObjectStore:
    """Keys under one fsspec URL prefix, over any fsspec backend (``gs://...``); S3 and
    ``memory://`` have their own subclasses.

    Args:
        url: the fsspec URL of the repo.
        storage_options: passed to the fsspec filesystem.
    """

    #: Whether create/replace are atomic on the server (see the module docstring).
    atomic = False

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        try:
            import fsspec
        except ImportError:
            raise MissingDependencyError("remote repos need fsspec: pip install 'modulelens[remote]'") from None
        try:
            self.fs, base = fsspec.core.url_to_fs(url, **self.options(dict(storage_options or {})))
        except ImportError as error:
            raise MissingDependencyError(f"{url}: {error} (for S3: pip install 'modulelens[remote]')") from None
        self.url = url
        self.base = base.rstrip("/")
        self.protocol = url.split("://", 1)[0]

    def options(self, options: dict[str, Any]) -> dict[str, Any]:
        """The fsspec options this protocol opens its filesystem with (the caller's, plus defaults)."""
        return options

    def key(self, *parts: str) -> str:
        return "/".join((self.base, *parts)) if self.base else "/".join(parts)

    def relative(self, key: str) -> str:
        key = key.lstrip("/") if not self.base.startswith("/") else key
        return key[len(self.base) + 1:] if self.base else key

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Held around a conditional write (a backend atomic only within one process locks here)."""
        yield

    # ------------------------------------------------------------------------------ reads

    @remote_call
    def read(self, key: str, limit: int | None = None, hint: str = "") -> bytes | None:
        """The object's bytes, or ``None`` when there is none.

        Raises:
            CorruptCaptureError: the object is larger than ``limit``; ``hint`` is added to the message.
        """
        try:
            return within(key, bytes(self.fs.cat_file(key)), limit, hint)
        except FileNotFoundError:
            return None

    @remote_call
    def read_range(self, key: str, start: int, end: int) -> bytes:
        return bytes(self.fs.cat_file(key, start=start, end=end))

    @remote_call
    def read_many(self, keys: builtins.list[str], limit: Callable[[str], tuple[int, str]] | None = None) -> dict[str, bytes]:
        """Several small objects at once (fsspec fetches them concurrently); missing ones, and those
        larger than ``limit(key)`` bytes, are left out."""
        if not keys:
            return {}
        found = self.fs.cat(keys, on_error="omit")
        return {k: bytes(v) for k, v in found.items()
                if not isinstance(v, BaseException) and (limit is None or len(v) <= limit(k)[0])}

    @remote_call
    def info(self, key: str) -> dict[str, Any] | None:
        """An object's metadata (size, ETag, modification time), ``None`` when there is none."""
        try:
            return dict(self.fs.info(key))
        except FileNotFoundError:
            return None

    def tag(self, info: dict[str, Any]) -> str | None:
        return info.get("ETag") or info.get("etag")

    def mtime(self, info: dict[str, Any]) -> float:
        return _mtime(info)

    @remote_call
    def list(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Every object under ``prefix`` (recursively): key relative to the repo -> its info."""
        try:
            found = self.fs.find(self.key(prefix), detail=True)
        except FileNotFoundError:
            return {}
        return {self.relative(k): dict(v) for k, v in found.items() if v.get("type", "file") != "directory"}

    @remote_call
    def ls(self, prefix: str) -> dict[str, str]:
        """What is directly under ``prefix`` (one LIST with a delimiter): name -> ``"file"`` or ``"directory"``."""
        try:
            found = self.fs.ls(self.key(prefix), detail=True)
        except FileNotFoundError:
            return {}
        return {str(item["name"]).rstrip("/").rsplit("/", 1)[-1]: item.get("type", "file") for item in found}

    def folders_holding(self, prefix: str, file: str, folder: str) -> builtins.list[str]:
        """The folders directly under ``prefix`` that hold the object ``file`` or the folder
        ``folder`` (the names of a repo: an index head, or versions), from one listing. A backend
        that cannot be told a delimiter counts every folder (S3 and ``memory://`` look closer)."""
        return sorted(name for name, kind in self.ls(prefix).items() if kind == "directory")

    def exists(self, key: str) -> bool:
        return self.info(key) is not None

    def missing_bucket(self) -> str | None:
        """The bucket's name when the server says it does not exist (a backend with buckets), else ``None``."""
        return None

    # ------------------------------------------------------------------------------ writes

    @remote_call
    def make_base(self) -> None:
        """Create the folder of the repo (on S3: its bucket, when there is none yet)."""
        self.fs.makedirs(self.base, exist_ok=True)

    @remote_call
    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(key, data)

    @remote_call
    def create(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if no object has that key; False when one does (someone else won)."""
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
        """Write ``key`` only if it still has ETag ``tag`` (``None``: only if it does not exist);
        returns the new tag, ``None`` when it changed meanwhile.

        Raises:
            RemoteRepoError: the backend has no conditional overwrite.
        """
        with self.exclusive():
            if tag is None:
                if not self.create(key, data):
                    return None
                info = self.info(key)
                created = self.tag(info) if info else None
                if created is not None:
                    return created
            # Without a version tag the next swap could only fail: a writer would retry it until it
            # gave up, blaming other writers (seen on a filesystem registered with fsspec).
            raise RemoteRepoError(
                f"{self.protocol}:// has no compare-and-swap write here, so a name's index or alias cannot be "
                "updated safely while others write it; use an S3 repo or save in a local repo and push"
            )

    @remote_call
    def read_tagged(self, key: str, limit: int | None = None, hint: str = "") -> tuple[bytes | None, str | None]:
        """An object's bytes and the tag :meth:`replace` compares against; refused as :meth:`read`
        is over ``limit``."""
        info = self.info(key)
        if info is None:
            return None, None
        return self.read(key, limit, hint), self.tag(info)

    @remote_call
    def upload_file(self, source: Path, key: str) -> None:
        """Upload a local file as one object (multipart for large files; visible only when complete)."""
        self.fs.put_file(str(source), key)

    @remote_call
    def upload_bytes(self, data: memoryview, key: str) -> None:
        """Upload a payload from memory, at most one part (64 MiB) copied at a time."""
        if len(data) <= _PART_BYTES:
            self.fs.pipe_file(key, bytes(data))
            return
        with self.fs.open(key, "wb", block_size=_PART_BYTES) as handle:
            for start in range(0, len(data), _PART_BYTES):
                handle.write(data[start:start + _PART_BYTES])

    @remote_call
    def delete(self, keys: builtins.list[str]) -> None:
        if keys:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(keys)
