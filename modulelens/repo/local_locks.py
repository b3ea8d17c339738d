"""The locks of a repo in a directory: ``flock`` on ``lock`` (shared by writers, exclusive for gc
and ``fsck --repair``) behind a turnstile, ``lock-gate``, so a stream of saves never starves gc.

Every wait has a deadline (:mod:`modulelens.repo.locks`); the lock files are opened without
following a link, and one planted as a link or a folder is refused, never replaced.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from modulelens.errors import CorruptCaptureError
from modulelens.repo.locks import busy, lock_wait_s, wait_for
from modulelens.repo.store import Hold

# How long gc leaves lock-gate open between its turns: longer than a waiting save's longest pause
# between two tries (locks.py), so the saves queued behind it pass.
_GATE_PAUSE_S = 0.25


class _Locked(Hold):
    """A flock never lapses while its process runs."""

    def intact(self) -> bool:
        return True


_LOCKED = _Locked()


class DirectoryLock:
    """The ``lock`` and ``lock-gate`` files of the repo directory ``root`` (absolute).

    Args:
        root: the repo's directory.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.location = str(root)
        self._held = threading.local()  # how deep this thread is in writing()

    @contextlib.contextmanager
    def writing(self) -> Iterator[Hold]:
        """``lock`` shared; re-entrant per thread (a commit inside a push's copy takes no second
        lock, which would queue behind a gc that waits for the first)."""
        depth = getattr(self._held, "depth", 0)
        if depth:
            self._held.depth = depth + 1
            try:
                yield _LOCKED
            finally:
                self._held.depth = depth
            return
        with self._shared_lock():
            self._held.depth = 1
            try:
                yield _LOCKED
            finally:
                self._held.depth = 0

    @contextlib.contextmanager
    def exclusive(self, wait_s: float = 600.0) -> Iterator[float]:
        """``lock`` exclusively, behind the turnstile (see :meth:`_shared_lock`), within ``wait_s``.

        gc holds ``lock-gate`` while it waits for the saves in progress to leave ``lock``, but for
        at most half of a save's own wait (:func:`~modulelens.repo.locks.lock_wait_s`) at a time:
        a save stopped in a debugger would otherwise keep gc, and every save queued behind gc,
        waiting; it then lets the queued saves pass and queues again."""
        deadline = time.monotonic() + wait_s
        with self._lock_file("lock-gate") as gate, self._lock_file("lock") as lock:
            while True:
                if not wait_for(gate, exclusive=True, deadline=deadline):
                    raise busy(f"{self.root}/lock-gate", gate, wait_s, "gc (or fsck --repair) of " + self.location)
                turn = min(deadline, time.monotonic() + lock_wait_s() / 2)
                if wait_for(lock, exclusive=True, deadline=turn):
                    break
                if time.monotonic() >= deadline:
                    raise busy(f"{self.root}/lock", lock, wait_s, "gc (or fsck --repair) of " + self.location)
                fcntl.flock(gate, fcntl.LOCK_UN)  # let the saves queued behind this gc pass
                time.sleep(_GATE_PAUSE_S)
            yield time.time()

    @contextlib.contextmanager
    def _shared_lock(self) -> Iterator[None]:
        """Saves hold ``lock`` shared, gc and ``fsck --repair`` exclusively (:meth:`exclusive`).
        Linux grants a shared ``flock`` while an exclusive one waits, so saves run back to back
        kept gc waiting forever (issue 12). A turnstile, ``lock-gate``, makes it fair: a saver
        passes it (held exclusively for an instant) before taking ``lock``; gc holds it while it
        waits for ``lock``, so new saves queue behind gc, saves in progress finish, and gc runs.
        A saver waits for each at most :func:`~modulelens.repo.locks.lock_wait_s` (issue 35)."""
        waited = lock_wait_s()
        deadline = time.monotonic() + waited
        doing = f"writing into {self.location}"
        with self._lock_file("lock-gate") as gate:
            if not wait_for(gate, exclusive=True, deadline=deadline):
                raise busy(f"{self.root}/lock-gate", gate, waited, doing)
        with self._lock_file("lock") as lock:
            if not wait_for(lock, exclusive=False, deadline=deadline):
                raise busy(f"{self.root}/lock", lock, waited, doing)
            yield

    @contextlib.contextmanager
    def _lock_file(self, filename: str) -> Iterator[int]:
        """An open descriptor of the lock file ``filename`` (closing it releases its lock)."""
        path = f"{self.root}/{filename}"  # (pathlib's join was a third of a small repo's lock, cold)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as error:
            if error.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise
            fd = -1
        if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
            if fd >= 0:
                os.close(fd)
            # A lock planted as a link (or a folder, a FIFO) locks nothing; replacing it here could
            # let two writers lock two different files. Refuse until the repair moves it aside.
            raise CorruptCaptureError(f"{path} is not a regular file (a link or other entry is never followed); "
                                      "`modulelens fsck --repair` moves it aside")
        try:
            yield fd
        finally:
            os.close(fd)  # releases the lock
