"""A payload streamed into a store piece by piece: the one writer of streamed blobs (issue 39).

The large weights a capture records are written while the job runs, from the live tensors
(tracing/weights.py), long before the save that names them. They go through the store that will
keep them: :meth:`~modulelens.repo.store.Store.blob_writer` hands out a :class:`FileBlobWriter`
over a new staging file of its own (a directory's ``tmp/``; an object store's local cache), which
writes each piece, hashes it as it goes (the content hash that names the blob and the verification
marker's chunk hashes; on a second thread, while the piece is written: the write waits on the disk,
the hash on nothing; unless the caller says its job needs the other cores, ``write(beside=False)``),
and on :meth:`~FileBlobWriter.seal` flushes the file to the disk. The save
then publishes the sealed file as the blob with one rename (``Store.adopt_file``; an object store
uploads it first), without reading it again; :meth:`~FileBlobWriter.abort` removes it instead.
So the durable-write, hashing and marker protocol of blobs lives in ``repo/`` once, whoever streams.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from modulelens.format.hashing import ContentHasher
from modulelens.repo.files import durable
from modulelens.repo.markers import ChunkHasher
from modulelens.repo.store import BlobWriter, WrittenPayload

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

#: Pieces from this size on are hashed on a second thread while they are written (smaller ones: the
#: hand-over would cost more than the overlap saves).
_HASH_BESIDE_FROM = 1 << 20


class FileBlobWriter(BlobWriter):
    """Streams ``nbytes`` bytes into the new staging file ``path`` (created here with ``O_EXCL``,
    which also refuses a link planted there; read-only; preallocated).

    Args:
        path: the staging file (a name the store chose in its staging area).
        nbytes: how many bytes will be written (more is refused; fewer fails :meth:`seal`).

    Raises:
        OSError: the file cannot be created (a missing folder, no permission, a file or link there).
    """

    def __init__(self, path: Path, nbytes: int) -> None:
        self.path = path
        self.nbytes = nbytes
        self.written = 0
        self._hasher = ContentHasher(threads=False)  # one thread: the cores are the job's (it runs meanwhile)
        self._chunks = ChunkHasher(nbytes)
        self._hashing: ThreadPoolExecutor | None = None  # hashes a piece while it is being written
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
        if hasattr(os, "posix_fallocate"):
            with contextlib.suppress(OSError):  # not every filesystem supports it (a full disk fails the write)
                os.posix_fallocate(self._fd, 0, nbytes)

    @property
    def chunk(self) -> int:
        return self._chunks.chunk

    def write(self, data: memoryview, *, beside: bool = True) -> None:
        if self._fd < 0:
            raise ValueError(f"{self.path} is sealed or aborted; nothing more can be written")
        view = data.cast("B") if data.format != "B" or data.ndim != 1 else data
        if self.written + len(view) > self.nbytes:
            raise ValueError(f"{self.path}: {self.written + len(view)} bytes written, {self.nbytes} announced")
        hashed = self._hash_beside(view) if beside else None
        try:
            done = 0
            while done < len(view):  # one write() moves at most ~2 GiB
                done += os.write(self._fd, view[done:])
        finally:
            if hashed is None:
                self._hash(view)
            else:
                hashed.result()  # (the caller may reuse the piece's memory once this returns)
        self.written += len(view)

    def _hash(self, view: memoryview) -> None:
        self._hasher.update(view)
        self._chunks.update(view)

    def _hash_beside(self, view: memoryview) -> Future[None] | None:
        """Hash ``view`` on a second thread while this one writes it: a write into the page cache
        waits on the disk (the kernel throttles writers of dirty pages) and hashing waits on
        nothing, so the two overlap (both release the GIL) instead of adding up. ``None`` when no
        thread can be had (interpreter shutdown): hashed after the write, in this thread."""
        if len(view) < _HASH_BESIDE_FROM:
            return None
        from concurrent.futures import ThreadPoolExecutor  # here: listing a repo needs no threads

        try:
            if self._hashing is None:
                self._hashing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="modulelens-blob-hash")
            return self._hashing.submit(self._hash, view)
        except RuntimeError:
            return None

    def _stop_hashing(self) -> None:
        if self._hashing is not None:
            self._hashing.shutdown(wait=True)
            self._hashing = None

    def seal(self) -> WrittenPayload:
        if self._fd < 0:
            raise ValueError(f"{self.path} is sealed or aborted")
        try:
            if self.written != self.nbytes:
                raise ValueError(f"{self.path}: {self.written} bytes written, {self.nbytes} announced")
            self._stop_hashing()
            if durable():
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
        except BaseException:
            self.abort()
            raise
        return WrittenPayload(self.path, self._hasher.digest(), self.nbytes, self._chunks.digests())

    def abort(self) -> None:
        self._stop_hashing()
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
