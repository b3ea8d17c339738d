"""S3 (and S3-compatible servers) under the object-store operations: real conditional writes
(``If-None-Match: *`` to create, ``If-Match`` on the ETag to replace), one GET per read, one HEAD
per stat and one delimited listing for a repo's names (docs/repo-layout.md). Registered for
``s3://`` and ``s3a://`` (:mod:`modulelens.repo.registry`)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
from collections.abc import Mapping

from modulelens.errors import CorruptCaptureError
from modulelens.repo._objects import FsspecObjects, object_info, remote_call
from modulelens.repo.backend import Limits, ObjectInfo, within
from modulelens.repo.files import too_large
from modulelens.repo.remote_errors import is_precondition_failure


class S3Objects(FsspecObjects):
    """Keys under one ``s3://bucket/prefix``; endpoints and credentials come from the usual places
    (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, instance roles) or ``storage_options``."""

    atomic = True  # conditional PUTs: the server decides who wins

    def options(self, options: dict[str, object]) -> dict[str, object]:
        # Listings must never come from a cache: version numbers and locks are decided on them.
        # (The filesystem instance itself is shared: building an S3 client costs ~1 s of CPU.)
        options.setdefault("use_listings_cache", False)
        # fsspec reuses a filesystem made with the same arguments; naming the endpoint keeps a
        # process that changes AWS_ENDPOINT_URL from talking to the old server (seen in tests).
        client = options.get("client_kwargs")
        if os.environ.get("AWS_ENDPOINT_URL") and not (isinstance(client, Mapping) and "endpoint_url" in client):
            options.setdefault("endpoint_url", os.environ["AWS_ENDPOINT_URL"])
        return options

    # ------------------------------------------------------------------------------ reads

    @remote_call
    def read(self, key: str, limit: int | None = None, hint: str = "") -> bytes | None:
        """One GET (s3fs's ``cat_file`` sent a HEAD first, which doubled the requests of a listing:
        one head read per name); an object over ``limit`` is refused with its body unread."""
        return self._get_tagged(key, limit, hint)[0]

    @remote_call
    def read_many(self, keys: builtins.list[str], limit: Limits | None = None) -> dict[str, bytes]:
        """One GET each, concurrently (s3fs's ``cat`` sends a HEAD before each GET)."""
        if not keys:
            return {}
        from fsspec.asyn import sync

        async def get(key: str) -> bytes | None:
            with contextlib.suppress(CorruptCaptureError):  # over its limit: left out, unread
                return (await self._get(key, limit(key)[0] if limit else None))[0]
            return None

        async def get_all() -> list[bytes | None]:
            return await asyncio.gather(*(get(key) for key in keys))

        return {key: data for key, data in zip(keys, sync(self.fs.loop, get_all), strict=True) if data is not None}

    @remote_call
    def stat(self, key: str) -> ObjectInfo | None:
        """One HEAD: s3fs's ``info`` follows a 404 with a LIST (is it a folder?), which a key of
        ours never is."""
        bucket, path, _ = self.fs.split_path(key)
        try:
            return object_info(self.fs.call_s3("head_object", Bucket=bucket, Key=path))
        except FileNotFoundError:
            return None

    def folders_holding(self, prefix: str, file: str, folder: str) -> builtins.list[str]:
        """One ``ListObjectsV2`` (paged) whose delimiter is ``/<folder>/``: every object under a
        ``<folder>/`` is rolled up into one prefix per parent, so the listing returns a few entries
        per real name and one per other object, and nothing else is asked about other folders (a
        LIST per folder before: 100,000 junk folders cost 100,000 requests)."""
        bucket, path, _ = self.fs.split_path(self.key(prefix).rstrip("/") + "/")
        path = path.rstrip("/") + "/"
        rolled = f"/{folder}/"
        found: set[str] = set()
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

    @remote_call
    def missing_bucket(self) -> str | None:
        """One HEAD on the bucket."""
        bucket = self.fs.split_path(self.base)[0]
        try:
            self.fs.call_s3("head_bucket", Bucket=bucket)
        except FileNotFoundError:  # HEAD has no body, so no error code: s3fs maps its 404 to this
            return bucket
        return None

    @remote_call
    def read_tagged(self, key: str, limit: int | None = None, hint: str = "") -> tuple[bytes | None, str | None]:
        """One GET, which returns both."""
        return self._get_tagged(key, limit, hint)

    # ------------------------------------------------------------------------------ writes

    @remote_call
    def create(self, key: str, data: bytes) -> bool:
        return self._put(key, data, IfNoneMatch="*") is not None

    @remote_call
    def replace(self, key: str, data: bytes, tag: str | None) -> str | None:
        return self._put(key, data, **({"IfNoneMatch": "*"} if tag is None else {"IfMatch": tag}))

    def _put(self, key: str, data: bytes, **condition: str) -> str | None:
        """One conditional PUT; its new ETag, or ``None`` when the condition failed."""
        bucket, path, _ = self.fs.split_path(key)
        try:
            response = self.fs.call_s3("put_object", Bucket=bucket, Key=path, Body=data, **condition)
        except FileExistsError:
            return None
        except OSError as error:
            if is_precondition_failure(error):
                return None
            raise
        self.fs.invalidate_cache(key)
        return str(response.get("ETag") or "") or None

    def _get_tagged(self, key: str, limit: int | None = None, hint: str = "") -> tuple[bytes | None, str | None]:
        from fsspec.asyn import sync

        return sync(self.fs.loop, self._get, key, limit, hint)

    async def _get(self, key: str, limit: int | None = None, hint: str = "") -> tuple[bytes | None, str | None]:
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
        return within(f"s3://{bucket}/{path}", bytes(data), limit, hint), response.get("ETag")
