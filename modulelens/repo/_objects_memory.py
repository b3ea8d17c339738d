"""fsspec's ``memory://`` under the object-store operations: it lives in one process, so a process
lock makes create and compare-and-swap atomic there, and a content hash serves as the ETag.
Registered for ``memory://`` (:mod:`modulelens.repo.registry`); the store tests' second store."""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import threading
from collections.abc import Iterator

from modulelens.repo._objects import ObjectStore, remote_call

_LOCK = threading.Lock()  # one per process: every memory:// filesystem of the process is one


class MemoryObjects(ObjectStore):
    """Keys under one ``memory://`` prefix."""

    atomic = True  # within the one process that holds it

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with _LOCK:
            yield

    def folders_holding(self, prefix: str, file: str, folder: str) -> builtins.list[str]:
        """One pass over its keys."""
        found: set[str] = set()
        try:
            keys = self.fs.find(self.key(prefix).rstrip("/") + "/")
        except FileNotFoundError:
            return []
        for key in keys:
            parent, _, rest = self.relative(key)[len(prefix) + 1:].partition("/")
            if rest == file or rest.startswith(f"{folder}/"):
                found.add(parent)
        return sorted(found)

    @remote_call
    def create(self, key: str, data: bytes) -> bool:
        with self.exclusive():
            if self.fs.exists(key):
                return False
            self.fs.pipe_file(key, data)
        return True

    @remote_call
    def replace(self, key: str, data: bytes, tag: str | None) -> str | None:
        with self.exclusive():
            current = self.read(key)
            if (current is None) != (tag is None) or (current is not None and _tag(current) != tag):
                return None
            self.fs.pipe_file(key, data)
            return _tag(data)

    @remote_call
    def read_tagged(self, key: str, limit: int | None = None, hint: str = "") -> tuple[bytes | None, str | None]:
        with self.exclusive():
            data = self.read(key, limit, hint)
            return data, None if data is None else _tag(data)

    @remote_call
    def upload_bytes(self, data: memoryview, key: str) -> None:
        self.fs.pipe_file(key, bytes(data))  # (no multipart writer: the bytes are in memory already)


def _tag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
