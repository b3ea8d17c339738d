"""Leases on an object store: how writers and gc of a remote repo keep out of each other's way.

Object stores have no lock. A writer holds a lease object ``locks/save-<uuid>`` and gc holds
``locks/gc``; each writes its own object *before* looking for the other's, so of a writer and a gc
that start together at least one sees the other (S3 is strongly consistent: read-after-write and
list-after-write). Both are rewritten every TTL/4 s by a thread while their holder runs, and ages
are read from the server's clock (the LastModified of an object just written), so a lease not
renewed for a TTL belongs to a crashed process: gc waits at most that long for a dead writer
(docs/repo-layout.md, "gc on a shared store").
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator

from modulelens.errors import RemoteRepoError, RepoBusyError
from modulelens.repo.backend import ObjectBackend
from modulelens.repo.store import Hold

# A lease (or gc lock) is rewritten every TTL/4 s while its holder runs, so one not rewritten for
# a TTL belongs to a process that died: gc waits at most this long for a crashed saver.
_LEASE_TTL_S = 120.0


def lease_ttl() -> float:
    """Seconds after its last renewal that a lease counts as left by a crashed process
    (``MODULELENS_LEASE_TTL_S``, default 120; every party of one repo must use the same value)."""
    try:
        return max(1.0, float(os.environ.get("MODULELENS_LEASE_TTL_S", _LEASE_TTL_S)))
    except ValueError:
        return _LEASE_TTL_S


class Lease(Hold):
    """Rewrites a lock object every TTL/4 s from a thread, so that its age (by the server's clock)
    tells a live holder from a crashed one within one TTL.

    A holder that cannot renew (its process stalled, the server slow) finds out with
    :meth:`intact` and must re-check what a gc could have changed meanwhile before it commits.
    """

    def __init__(self, objects: ObjectBackend, key: str, body: bytes, url: str) -> None:
        self.objects, self.key, self.body, self.url = objects, key, body, url
        self.ttl = lease_ttl()
        self.renewed = time.monotonic()
        self.outer = False  # reused by a nested write (see intact)
        self._stop = threading.Event()
        # A daemon: it only renews, and stop() joins it; at exit an unrenewed lease just expires.
        self._thread = threading.Thread(target=self._run, name="modulelens-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                self.objects.put(self.key, self.body)
            except Exception:  # a missed renewal shows as `lapsed`; the holder re-checks
                continue
            self.renewed = time.monotonic()

    @property
    def lapsed(self) -> bool:
        """Whether the lock went unrenewed for half its TTL (a gc may have taken it for dead)."""
        return time.monotonic() - self.renewed > self.ttl / 2

    def intact(self) -> bool:
        """A lapsed lease is given up and taken anew, unless it is an outer one (a push holding it
        for its whole copy) that this thread cannot give up here: then the write stops, with
        nothing committed."""
        if not self.lapsed:
            return True
        if self.outer:
            raise RemoteRepoError(f"{self.url}: the write lease went unrenewed (stalled process or server); a gc may "
                                  "have run meanwhile, so nothing was committed; run the push again")
        return False

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Leases:
    """The leases of one remote repo (``objects``: its object store, ``url``: for messages)."""

    def __init__(self, objects: ObjectBackend, url: str) -> None:
        self.objects, self.url = objects, url
        self._held = threading.local()  # the lease this thread holds, if any

    def _body(self) -> bytes:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode()

    def _lock_time(self, key: str) -> float:
        """The server's clock, read as the modification time of an object we just wrote (so lock
        ages never depend on this machine's clock)."""
        info = self.objects.stat(key)
        return info.mtime if info else time.time()

    @contextlib.contextmanager
    def writer(self, wait_s: float = 600.0) -> Iterator[Lease]:
        """A writer's lease: write ``locks/save-<id>``, then make sure no gc runs (else step back and
        wait). Re-entrant per thread: a commit inside a push's copy uses the lease already held (a
        second one would wait for a gc that itself waits for the first: a deadlock)."""
        held = getattr(self._held, "current", None)
        if held is not None:
            held.outer = True
            yield held
            return
        key = self.objects.key("locks", f"save-{uuid.uuid4().hex}")
        body = self._body()
        deadline = time.monotonic() + wait_s
        while True:
            self.objects.put(key, body)
            gc_info = self.objects.stat(self.objects.key("locks", "gc"))
            if gc_info is None or gc_info.mtime < self._lock_time(key) - lease_ttl():
                break  # (the lease's own time is read only when there is a gc lock to compare)
            self.objects.delete([key])
            if time.monotonic() > deadline:
                raise RepoBusyError(f"{self.url}: gc has been running for over {wait_s:.0f} s; try again later")
            time.sleep(0.2)
        lease = Lease(self.objects, key, body, self.url)
        self._held.current = lease
        try:
            yield lease
        finally:
            self._held.current = None
            lease.stop()  # before the delete: a late renewal must not bring the lease back
            self.objects.delete([key])

    @contextlib.contextmanager
    def gc(self, wait_s: float) -> Iterator[float]:
        """Hold ``locks/gc`` (renewed like a lease) and wait until no live lease is left; yields the
        server's time when gc started. A lease not renewed for a TTL is a crashed saver's."""
        key = self.objects.key("locks", "gc")
        body = self._body()
        ttl = lease_ttl()
        if not self.objects.create(key, body):
            info = self.objects.stat(key)
            probe = self.objects.key("locks", f"probe-{uuid.uuid4().hex}")
            self.objects.put(probe, b"")
            now = self._lock_time(probe)
            self.objects.delete([probe])
            if info is not None and info.mtime >= now - ttl:
                raise RepoBusyError(f"{self.url}: another gc is running (locks/gc); try again later")
            self.objects.put(key, body)  # a crashed gc's lock
        heartbeat = Lease(self.objects, key, body, self.url)
        try:
            start = self._lock_time(key)
            offset = start - time.time()  # the server's clock, as seen from here
            deadline = time.monotonic() + wait_s
            while True:
                now = time.time() + offset
                leases = {k: i for k, i in self.objects.list("locks").items() if k.startswith("locks/save-")}
                if all(i.mtime < now - ttl for i in leases.values()):
                    break
                if time.monotonic() > deadline:
                    raise RepoBusyError(f"{self.url}: saves still running after {wait_s:.0f} s; gc did nothing")
                time.sleep(0.2)
            yield start
        finally:
            heartbeat.stop()
            self.objects.delete([key])
