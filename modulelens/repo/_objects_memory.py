"""fsspec's ``memory://`` under the object-backend primitives: it lives in one process, so a process
lock makes create and compare-and-swap atomic there, and a content hash serves as the ETag.
Registered for ``memory://`` (:mod:`modulelens.repo.registry`); one of the store tests' stores."""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator

from modulelens.repo._objects import FsspecObjects, remote_call
from modulelens.repo.backend import ObjectBackend

_LOCK = threading.Lock()  # one per process: every memory:// filesystem of the process is one


class MemoryObjects(FsspecObjects):
    """Keys under one ``memory://`` prefix. Its filesystem keeps no ETag, so the tag of an object is
    the hash of its bytes (given by :meth:`read_tagged`, not by ``stat``)."""

    atomic = True  # within the one process that holds it

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with _LOCK:
            yield

    # one pass over its keys (fsspec's delimited listing would count every folder)
    folders_holding = ObjectBackend.folders_holding

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
            current = self.get(key)
            if (current is None) != (tag is None) or (current is not None and _tag(current) != tag):
                return None
            self.fs.pipe_file(key, data)
            return _tag(data)

    @remote_call
    def read_tagged(self, key: str, limit: int | None = None, hint: str = "") -> tuple[bytes | None, str | None]:
        with self.exclusive():
            data = self.read(key, limit, hint)
            return data, None if data is None else _tag(data)


def _tag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
