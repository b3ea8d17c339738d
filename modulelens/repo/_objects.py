"""Object storage under one fsspec URL: the few server operations a remote store rests on.

Object stores have no rename and no lock, so the protocol (docs/repo-layout.md) rests on three
primitives that must be atomic on the server: *create* (write an object only if no object has that
key: S3 ``If-None-Match: *``), *replace* (write only if the object still has the ETag we read: S3
``If-Match``) and whole-object writes (an object is visible complete or not at all, multipart
uploads included). ``memory://`` lives in one process, so a process lock makes it atomic there.
Other fsspec backends get fsspec's exclusive create, which is atomic only where the backend
implements it; :attr:`ObjectStore.atomic` says which.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import datetime
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from modulelens.errors import CorruptCaptureError, MissingDependencyError, RemoteRepoError
from modulelens.repo.files import too_large

# S3 puts above this size go through the multipart writer (bounded memory: one part at a time).
_PART_BYTES = 64 << 20
_MEMORY_LOCK = threading.Lock()


def _is_precondition_failure(error: BaseException) -> bool:
    """s3fs reports a failed ``If-None-Match``/``If-Match`` as ``OSError(EINVAL)``; the botocore
    error it wraps carries the HTTP status (412, or 409 when two conditional writes collide)."""
    cause: BaseException | None = error
    while cause is not None:
        response = getattr(cause, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = response.get("Error", {}).get("Code")
            if status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
                return True
        cause = cause.__cause__ or cause.__context__
    return "pre-condition" in str(error) or "precondition" in str(error).lower()


def is_network_error(error: BaseException) -> bool:
    """True for failures to reach the server (as opposed to answers from it)."""
    names = {type(e).__name__ for e in _chain(error)}
    return bool(names & {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                         "ClientConnectorError", "ServerDisconnectedError", "ConnectionRefusedError",
                         "ConnectionError", "ConnectionClosedError", "TimeoutError"})


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: BaseException | None = error
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def _within(where: str, data: bytes, limit: int | None, hint: str = "") -> bytes:
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
    """Keys under one fsspec URL prefix.

    Args:
        url: ``s3://bucket/prefix``, ``memory://name``, ``gs://...``; S3 endpoints and credentials
            come from the usual places (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, instance roles).
        storage_options: passed to the fsspec filesystem.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        try:
            import fsspec
        except ImportError:
            raise MissingDependencyError("remote repos need fsspec: pip install 'modulelens[remote]'") from None
        options = dict(storage_options or {})
        protocol = url.split("://", 1)[0]
        if protocol in ("s3", "s3a"):
            # Listings must never come from a cache: version numbers and locks are decided on them.
            # (The filesystem instance itself is shared: building an S3 client costs ~1 s of CPU.)
            options.setdefault("use_listings_cache", False)
            # fsspec reuses a filesystem made with the same arguments; naming the endpoint keeps a
            # process that changes AWS_ENDPOINT_URL from talking to the old server (seen in tests).
            if os.environ.get("AWS_ENDPOINT_URL") and "endpoint_url" not in options.get("client_kwargs", {}):
                options.setdefault("endpoint_url", os.environ["AWS_ENDPOINT_URL"])
        try:
            self.fs, base = fsspec.core.url_to_fs(url, **options)
        except ImportError as error:
            raise MissingDependencyError(f"{url}: {error} (for S3: pip install 'modulelens[remote]')") from None
        self.base = base.rstrip("/")
        self.protocol = protocol
        self.s3 = protocol in ("s3", "s3a")
        self.memory = protocol == "memory"
        #: Whether create/replace are atomic on the server (see the module docstring).
        self.atomic = self.s3 or self.memory

    def key(self, *parts: str) -> str:
        return "/".join((self.base, *parts)) if self.base else "/".join(parts)

    def relative(self, key: str) -> str:
        key = key.lstrip("/") if not self.base.startswith("/") else key
        return key[len(self.base) + 1:] if self.base else key

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        if self.memory:
            with _MEMORY_LOCK:
                yield
        else:
            yield

    # ------------------------------------------------------------------------------ reads

    def read(self, key: str, limit: int | None = None, hint: str = "") -> bytes | None:
        """The object's bytes, or ``None`` when there is none (on S3 one GET: s3fs's ``cat_file``
        sent a HEAD first, which doubled the requests of a listing: one head read per name).

        Raises:
            CorruptCaptureError: the object is larger than ``limit`` (on S3 its body is not read);
                ``hint`` is added to the message.
        """
        if self.s3:
            return self._s3_get_tagged(key, limit, hint)[0]
        try:
            return _within(key, bytes(self.fs.cat_file(key)), limit, hint)
        except FileNotFoundError:
            return None

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return bytes(self.fs.cat_file(key, start=start, end=end))

    def read_many(self, keys: builtins.list[str], limit: Callable[[str], tuple[int, str]] | None = None) -> dict[str, bytes]:
        """Several small objects at once (fsspec fetches them concurrently); missing ones, and those
        larger than ``limit(key)`` bytes, are left out."""
        if not keys:
            return {}
        if self.s3:  # one GET each, concurrently (s3fs's ``cat`` sends a HEAD before each GET)
            from fsspec.asyn import sync

            async def get(key: str) -> bytes | None:
                with contextlib.suppress(CorruptCaptureError):  # over its limit: left out, unread
                    return (await self._s3_get(key, limit(key)[0] if limit else None))[0]
                return None

            async def get_all() -> list[bytes | None]:
                return await asyncio.gather(*(get(key) for key in keys))

            return {key: data for key, data in zip(keys, sync(self.fs.loop, get_all), strict=True) if data is not None}
        found = self.fs.cat(keys, on_error="omit")
        return {k: bytes(v) for k, v in found.items()
                if not isinstance(v, BaseException) and (limit is None or len(v) <= limit(k)[0])}

    def info(self, key: str) -> dict[str, Any] | None:
        """An object's metadata (size, ETag, modification time), ``None`` when there is none. On
        S3 one HEAD: s3fs's ``info`` follows a 404 with a LIST (is it a folder?), which a key of
        ours never is."""
        if self.s3:
            bucket, path, _ = self.fs.split_path(key)
            try:
                return dict(self.fs.call_s3("head_object", Bucket=bucket, Key=path))
            except FileNotFoundError:
                return None
        try:
            return dict(self.fs.info(key))
        except FileNotFoundError:
            return None

    def tag(self, info: dict[str, Any]) -> str | None:
        return info.get("ETag") or info.get("etag")

    def mtime(self, info: dict[str, Any]) -> float:
        return _mtime(info)

    def list(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Every object under ``prefix`` (recursively): key relative to the repo -> its info."""
        try:
            found = self.fs.find(self.key(prefix), detail=True)
        except FileNotFoundError:
            return {}
        return {self.relative(k): dict(v) for k, v in found.items() if v.get("type", "file") != "directory"}

    def ls(self, prefix: str) -> dict[str, str]:
        """What is directly under ``prefix`` (one LIST with a delimiter): name -> ``"file"`` or ``"directory"``."""
        try:
            found = self.fs.ls(self.key(prefix), detail=True)
        except FileNotFoundError:
            return {}
        return {str(item["name"]).rstrip("/").rsplit("/", 1)[-1]: item.get("type", "file") for item in found}

    def folders_holding(self, prefix: str, file: str, folder: str) -> builtins.list[str]:
        """The folders directly under ``prefix`` that hold the object ``file`` or the folder
        ``folder`` (the names of a repo: an index head, or versions), from one listing.

        On S3 one ``ListObjectsV2`` (paged) whose delimiter is ``/<folder>/``: every object under a
        ``<folder>/`` is rolled up into one prefix per parent, so the listing returns a few entries
        per real name and one per other object, and nothing else is asked about other folders (a
        LIST per folder before: 100,000 junk folders cost 100,000 requests). ``memory://`` looks at
        its keys in one pass; other backends cannot be told the delimiter: every folder counts.
        """
        base = self.key(prefix).rstrip("/") + "/"
        found: set[str] = set()
        if self.s3:
            bucket, path, _ = self.fs.split_path(base)
            path = path.rstrip("/") + "/"
            rolled = f"/{folder}/"
            token: dict[str, str] = {}
            while True:
                page = self.fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=path, Delimiter=rolled, **token)
                for entry in page.get("Contents", ()):
                    parent, _, rest = str(entry["Key"])[len(path):].partition("/")
                    if rest == file:
                        found.add(parent)
                for entry in page.get("CommonPrefixes", ()):
                    parent, _, rest = str(entry["Prefix"])[len(path):].partition("/")
                    if rest == f"{folder}/":
                        found.add(parent)
                if not page.get("IsTruncated") or not page.get("NextContinuationToken"):
                    break
                token = {"ContinuationToken": page["NextContinuationToken"]}
            return sorted(found)
        if self.memory:
            try:
                keys = self.fs.find(base)
            except FileNotFoundError:
                return []
            for key in keys:
                parent, _, rest = self.relative(key)[len(prefix) + 1:].partition("/")
                if rest == file or rest.startswith(f"{folder}/"):
                    found.add(parent)
            return sorted(found)
        return sorted(name for name, kind in self.ls(prefix).items() if kind == "directory")

    def exists(self, key: str) -> bool:
        return self.info(key) is not None

    # ------------------------------------------------------------------------------ writes

    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(key, data)

    def create(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if no object has that key; False when one does (someone else won)."""
        if self.s3:
            return self._s3_put(key, data, IfNoneMatch="*") is not None
        with self._exclusive():
            try:
                if self.memory:
                    if self.fs.exists(key):
                        return False
                    self.fs.pipe_file(key, data)
                else:
                    self.fs.pipe_file(key, data, mode="create")
            except FileExistsError:
                return False
            except OSError as error:
                if _is_precondition_failure(error):
                    return False
                raise
        return True

    def replace(self, key: str, data: bytes, tag: str | None) -> str | None:
        """Write ``key`` only if it still has ETag ``tag`` (``None``: only if it does not exist);
        returns the new tag, ``None`` when it changed meanwhile.

        Raises:
            RemoteRepoError: the backend has no conditional overwrite.
        """
        if self.s3:
            return self._s3_put(key, data, **({"IfNoneMatch": "*"} if tag is None else {"IfMatch": tag}))
        with self._exclusive():
            if self.memory:
                current = self.read(key)
                if (current is None) != (tag is None) or (current is not None and self._memory_tag(current) != tag):
                    return None
                self.fs.pipe_file(key, data)
                return self._memory_tag(data)
            if tag is None:
                if not self.create(key, data):
                    return None
                info = self.info(key)
                return self.tag(info) if info else None
            raise RemoteRepoError(
                f"{self.protocol}:// has no compare-and-swap write here, so an alias cannot be moved "
                "safely while others write it; use an S3 repo or move aliases in a local repo and push"
            )

    def _s3_put(self, key: str, data: bytes, **condition: str) -> str | None:
        """One conditional PUT; its new ETag, or ``None`` when the condition failed."""
        bucket, path, _ = self.fs.split_path(key)
        try:
            response = self.fs.call_s3("put_object", Bucket=bucket, Key=path, Body=data, **condition)
        except FileExistsError:
            return None
        except OSError as error:
            if _is_precondition_failure(error):
                return None
            raise
        self.fs.invalidate_cache(key)
        return str(response.get("ETag") or "") or None

    def read_tagged(self, key: str, limit: int | None = None, hint: str = "") -> tuple[bytes | None, str | None]:
        """An object's bytes and the tag :meth:`replace` compares against (on S3 one GET, which
        returns both); refused as :meth:`read` is over ``limit``."""
        if self.memory:
            with self._exclusive():
                data = self.read(key, limit, hint)
                return data, None if data is None else self._memory_tag(data)
        if self.s3:
            return self._s3_get_tagged(key, limit, hint)
        info = self.info(key)
        if info is None:
            return None, None
        return self.read(key, limit, hint), self.tag(info)

    def _s3_get_tagged(self, key: str, limit: int | None = None, hint: str = "") -> tuple[bytes | None, str | None]:
        from fsspec.asyn import sync

        return sync(self.fs.loop, self._s3_get, key, limit, hint)

    async def _s3_get(self, key: str, limit: int | None = None, hint: str = "") -> tuple[bytes | None, str | None]:
        """One GET: the object's bytes and ETag, ``(None, None)`` when there is none; an object
        larger than ``limit`` is refused from the length the response announces, its body unread."""
        bucket, path, _ = self.fs.split_path(key)
        try:
            response = await self.fs._call_s3("get_object", Bucket=bucket, Key=path)
        except FileNotFoundError:
            return None, None
        body = response["Body"]
        try:
            size = response.get("ContentLength")
            if limit is not None and isinstance(size, int) and size > limit:
                raise too_large(f"s3://{bucket}/{path}", size, limit, hint)
            data = await body.read()  # (read(n) may return fewer bytes than there are: never a prefix)
        finally:
            body.close()
        return _within(f"s3://{bucket}/{path}", bytes(data), limit, hint), response.get("ETag")

    @staticmethod
    def _memory_tag(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def upload_file(self, source: Path, key: str) -> None:
        """Upload a local file as one object (multipart for large files; visible only when complete)."""
        self.fs.put_file(str(source), key)

    def upload_bytes(self, data: memoryview, key: str) -> None:
        """Upload a payload from memory, at most one part (64 MiB) copied at a time."""
        if len(data) <= _PART_BYTES or self.memory:
            self.fs.pipe_file(key, bytes(data))
            return
        with self.fs.open(key, "wb", block_size=_PART_BYTES) as handle:
            for start in range(0, len(data), _PART_BYTES):
                handle.write(data[start:start + _PART_BYTES])

    def delete(self, keys: builtins.list[str]) -> None:
        if keys:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(keys)
