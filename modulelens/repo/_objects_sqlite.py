"""A whole repo in one SQLite file (``sqlite:///path/to/team.db``): the third object backend, and
the worked example of docs/repo-layout.md's "Adding a store" (the eight primitives of
:class:`~modulelens.repo.backend.ObjectBackend`, and one registration line in
:mod:`modulelens.repo.registry`).

One file to hand a team or copy to a laptop, shared by the processes of one machine: SQLite's
write lock makes create-if-absent and compare-and-swap real transactions (``BEGIN IMMEDIATE``:
one writer at a time, across processes), and its write-ahead log lets readers read while one
writes. Not for a network filesystem (SQLite's locks are not reliable there): share a folder repo
or an object store across machines.

Two tables: ``objects`` (a row per object: size, modification time, a version tag that every write
renews) and ``parts`` (its bytes, in parts of at most 16 MiB at their offsets, so a range is read
without the rest and no blob reaches SQLite's 1 GB limit). A large object is written part by part
under a staging key, each part its own short transaction, then renamed to its key in one
transaction with its row: readers see the old object or the whole new one, and the write lock is
never held for the length of an upload. Staging left by a writer that was killed is removed by a
later write after a day.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from modulelens.errors import RemoteRepoError, RepoBusyError, UsageError
from modulelens.repo.backend import ObjectBackend, ObjectInfo
from modulelens.repo.files import durable
from modulelens.repo.locks import lock_wait_s

_PART = 16 << 20
_STAGING = "\x00staging/"  # below every real key (no key of the layout starts with NUL)
_STALE_STAGING_S = 86400.0
_SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (key TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime REAL NOT NULL, tag TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS parts (key TEXT NOT NULL, start INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (key, start));
"""


class SqliteObjects(ObjectBackend):
    """Keys in one SQLite database file.

    Args:
        url: ``sqlite://`` and the file's absolute path (``sqlite:///srv/captures.db``,
            ``sqlite://~/team.db``).
        storage_options: none are taken.

    Raises:
        UsageError: the path is not absolute, or ``storage_options`` were given.
    """

    atomic = True  # BEGIN IMMEDIATE: one writer at a time, across processes
    sizes_first = True  # a row read: an object over a read's limit is refused unread

    def __init__(self, url: str, storage_options: dict[str, object] | None = None) -> None:
        super().__init__(url, storage_options)
        path = Path(url.split("://", 1)[-1]).expanduser()  # (under any scheme it is registered for)
        if not path.is_absolute():
            raise UsageError(f"{url}: a SQLite repo is named by its absolute path, as {self.protocol}:///path/to/repo.db")
        if storage_options:
            raise UsageError(f"storage_options apply to repos on servers, not to the SQLite file {path}")
        self.path = path
        self._connections = threading.local()  # a connection is used by the thread that opened it

    @contextlib.contextmanager
    def _transaction(self, *, write: bool = False, create: bool = False) -> Iterator[sqlite3.Connection | None]:
        """One transaction on this thread's connection (``None`` when there is no database yet and
        ``create`` is false: reading a missing repo never makes it); SQLite's errors as one line."""
        try:
            held = getattr(self._connections, "held", None)
            if held is None or held[0] != os.getpid():  # (a forked child opens its own)
                if not create and not self.path.exists():
                    yield None
                    return
                self.path.parent.mkdir(parents=True, exist_ok=True)
                connection = sqlite3.connect(f"{self.path.as_uri()}?mode={'rwc' if create else 'rw'}", uri=True,
                                             timeout=lock_wait_s(), isolation_level=None, check_same_thread=False)
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute(f"PRAGMA synchronous={'FULL' if durable() else 'OFF'}")
                held = self._connections.held = (os.getpid(), connection)
            connection = held[1]
            connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield connection
            except BaseException:
                connection.rollback()
                raise
            connection.commit()
        except sqlite3.OperationalError as error:
            if "locked" in str(error) or "busy" in str(error):
                raise RepoBusyError(f"{self.path} was locked by another writer for over {lock_wait_s():.0f} s "
                                    f"(MODULELENS_LOCK_WAIT_S): {error}") from None
            raise RemoteRepoError(f"SQLite repo {self.path}: {error}") from None
        except sqlite3.Error as error:
            raise RemoteRepoError(f"SQLite repo {self.path}: {error}") from None

    def make_base(self) -> None:
        with self._transaction(write=True, create=True) as db:
            assert db is not None
            for statement in filter(str.strip, _SCHEMA.split(";")):
                db.execute(statement)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes | None:
        with self._transaction() as db:
            row = db.execute("SELECT size FROM objects WHERE key = ?", (key,)).fetchone() if db else None
            if db is None or row is None:
                return None
            end = row[0] if end is None else min(end, row[0])
            if start >= end:
                return b""
            parts = db.execute("SELECT start, data FROM parts WHERE key = ?1 AND start < ?3 AND start >= "
                               "(SELECT max(start) FROM parts WHERE key = ?1 AND start <= ?2) ORDER BY start",
                               (key, start, end)).fetchall()
        data = parts[0][1] if len(parts) == 1 else b"".join(part for _, part in parts)
        first = parts[0][0]
        return data if (start - first, end - first) == (0, len(data)) else data[start - first:end - first]

    def stat(self, key: str) -> ObjectInfo | None:
        with self._transaction() as db:
            row = db.execute("SELECT size, mtime, tag FROM objects WHERE key = ?", (key,)).fetchone() if db else None
        return None if row is None else ObjectInfo(*row)

    def list(self, prefix: str) -> dict[str, ObjectInfo]:
        low = prefix.rstrip("/") + "/" if prefix else ""
        with self._transaction() as db:
            rows = db.execute("SELECT key, size, mtime, tag FROM objects WHERE key >= ? AND key < ?",
                              (low, low[:-1] + "0" if low else "\U0010ffff")).fetchall() if db else []
        return {key: ObjectInfo(size, mtime, tag) for key, size, mtime, tag in rows}

    def put_stream(self, key: str, pieces: Iterable[memoryview | bytes]) -> None:
        self._write(key, pieces)

    def create(self, key: str, data: bytes) -> bool:
        return self._write(key, (data,), conditional=True) is not None

    def replace(self, key: str, data: bytes, tag: str | None) -> str | None:
        return self._write(key, (data,), conditional=True, tag=tag)

    def delete(self, keys: builtins.list[str]) -> None:
        if keys:
            with self._transaction(write=True) as db:
                assert db is not None
                db.executemany("DELETE FROM objects WHERE key = ?", [(k,) for k in keys])
                db.executemany("DELETE FROM parts WHERE key = ?", [(k,) for k in keys])

    def _write(self, key: str, pieces: Iterable[memoryview | bytes], *, conditional: bool = False,
               tag: str | None = None) -> str | None:
        """Write ``key`` (``conditional``: only if its tag is still ``tag``, ``None`` meaning no
        object); its new tag, ``None`` when the condition failed. The last part is written in the
        final transaction itself (the only one for a small object); the parts before it are staged."""
        staging = f"{_STAGING}{time.time_ns():020d}/{uuid.uuid4().hex}"
        views = (memoryview(piece).cast("B") for piece in pieces)
        parts = (bytes(view[at:at + _PART]) for view in views for at in range(0, len(view), _PART))
        last, offset = next(parts, None), 0
        for part in parts:  # a large upload: each part but the last its own short transaction
            assert last is not None
            with self._transaction(write=True) as db:
                assert db is not None
                db.execute("INSERT INTO parts VALUES (?, ?, ?)", (staging, offset, last))
            offset, last = offset + len(last), part
        new_tag = uuid.uuid4().hex
        with self._transaction(write=True) as db:
            assert db is not None
            current = db.execute("SELECT tag FROM objects WHERE key = ?", (key,)).fetchone()
            stale = f"{_STAGING}{time.time_ns() - int(_STALE_STAGING_S * 1e9):020d}"
            db.execute("DELETE FROM parts WHERE key >= ? AND key < ?", (_STAGING, stale))
            if conditional and (None if current is None else current[0]) != tag:
                db.execute("DELETE FROM parts WHERE key = ?", (staging,))
                return None
            db.execute("DELETE FROM parts WHERE key = ?", (key,))
            db.execute("UPDATE parts SET key = ? WHERE key = ?", (key, staging))
            if last:
                db.execute("INSERT INTO parts VALUES (?, ?, ?)", (key, offset, last))
            size = offset + len(last or b"")
            db.execute("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?)", (key, size, time.time(), new_tag))
        return new_tag
