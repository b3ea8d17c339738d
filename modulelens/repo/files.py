"""Writing and reading a local repo's files: never through a symlink, and durability on commit.

A repo may come from someone else (a tarball, a shared folder), so any entry in it may be a link
planted to make modulelens read, overwrite or delete a file outside it (docs/security.md). New
files are created with ``O_EXCL`` (which refuses a link); every read of a repo file goes through
:func:`open_regular` (``O_NOFOLLOW``, and ``fstat``: a FIFO would block a reader forever, a device
would be read endlessly), and folders are checked with :func:`require_dir` before use.

A save is durable when ``save()`` returns: every payload file is flushed to the disk before it is
renamed into ``blobs/`` (so a blob name never points at bytes a power loss could lose, which a
later save would then dedup against), the version's ``capture.json`` and staging folder are
flushed before the rename that publishes them, and each rename is made durable by flushing its
folder. Caches (per-name summaries, verification markers) are not flushed: a stale or torn one is
detected and rebuilt. ``MODULELENS_FSYNC=0`` turns flushing off (scratch repos on tmpfs, or jobs
that accept losing the last captures to a power cut); the cost is measured in
benchmarks/bench_save_load.py.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
import threading
from pathlib import Path

from modulelens.errors import CorruptCaptureError
from modulelens.format.hashing import hash_bytes

# Larger writes are preallocated: on ext4/xfs `posix_fallocate` makes a large write about twice as
# fast as letting the filesystem allocate as it goes (measured: benchmarks/bench_save_load.py).
_PREALLOCATE_FROM = 1 << 20


def durable() -> bool:
    """Whether commits flush to the disk (``MODULELENS_FSYNC``, on unless set to ``0``)."""
    return os.environ.get("MODULELENS_FSYNC", "1") != "0"


def write_new_file(path: Path, data: memoryview | bytes, *, mode: int = 0o444, flush: bool = False) -> None:
    """Write a file that must not exist yet (``O_EXCL`` also refuses a symlink planted at ``path``),
    read-only by default. Not flushed unless ``flush`` (and :func:`durable`): then its bytes reach
    the disk through the descriptor that wrote them, before it is closed (opening it again to flush
    it, as :func:`flush_file` does for a file written elsewhere, was two more system calls a save)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
        if len(view) > _PREALLOCATE_FROM and hasattr(os, "posix_fallocate"):
            with contextlib.suppress(OSError):  # not every filesystem supports it
                os.posix_fallocate(fd, 0, len(view))
        written = 0
        while written < len(view):  # one write() moves at most ~2 GiB
            written += os.write(fd, view[written:])
        if flush and durable():
            os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically (readers see the old file or the new one, never a part), through
    a new file beside it; not flushed (for reports another process reads, such as a run's summary)."""
    staged = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(staged)  # left by this very thread before (a crash between write and rename)
    try:
        write_new_file(staged, data, mode=0o644)
        os.replace(staged, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
        raise


def flush_file(path: Path) -> None:
    """Flush a file's bytes to the disk (when :func:`durable`)."""
    if not durable():
        return
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def flush_folder(path: Path) -> None:
    """Flush a folder's entries (a rename into it, a new file) to the disk (when :func:`durable`)."""
    if not durable():
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def flush_and_rename(staged: Path, target: Path, *, flush_target_folder: bool = True) -> None:
    """Publish ``staged`` as ``target``: its bytes reach the disk before its new name does.
    ``flush_target_folder=False`` leaves the folder's flush to the caller (who renames several
    files into one folder and flushes it once)."""
    flush_file(staged)
    os.replace(staged, target)
    if flush_target_folder:
        flush_folder(target.parent)


# ------------------------------------------------------------------------------------ reading

_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only file descriptor of ``path``, which must be a regular file and not a link.

    Args:
        path: a file inside a repo.

    Returns:
        An open descriptor (the caller closes it).

    Raises:
        CorruptCaptureError: ``path`` is a symbolic link or not a regular file (names the path).
        FileNotFoundError: ``path`` does not exist.
    """
    fd, _ = _open_checked(path)
    if _READ & getattr(os, "O_NONBLOCK", 0):  # only there so that opening a FIFO cannot block
        os.set_blocking(fd, True)
    return fd


def _open_checked(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    try:
        fd = os.open(path, _READ)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise CorruptCaptureError(f"{path} is a symbolic link; modulelens never follows links in a repo") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise CorruptCaptureError(f"{path} is not a regular file")
    return fd, info


def read_regular(path: str | os.PathLike[str], *, limit: int | None = None, hint: str = "") -> bytes:
    """The bytes of a regular file inside a repo (see :func:`open_regular`), in four system calls
    (open, fstat, read, close): ``open().read()`` makes nine (an ioctl, two seeks, a second fstat
    and a read to find the end), which cost a listing of 2,000 versions more than the two ``stat``
    calls that check each summary (strace, benchmarks/bench_repo.py). ``O_NONBLOCK`` does not apply
    to a regular file's reads, so the descriptor is read as it was opened.

    Args:
        path: a file inside a repo.
        limit: the most bytes the caller takes: a larger file (or one that grows past it while it
            is read) is refused before more than ``limit`` bytes are read (:func:`too_large`).
        hint: added to that refusal (how to raise the limit).

    Raises:
        CorruptCaptureError: a link, not a regular file, or over ``limit``.

    Example::

        data = json.loads(read_regular(version_dir / "capture.json"))
    """
    fd, info = _open_checked(path)
    try:
        if limit is not None and info.st_size > limit:
            raise too_large(path, info.st_size, limit, hint)
        data = os.read(fd, info.st_size + 1)  # a regular file reads short only at its end
        if len(data) > info.st_size:  # it grew meanwhile: read on to the end
            chunks = [data]
            size = len(data)
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
                size += len(chunk)
                if limit is not None and size > limit:
                    raise too_large(path, size, limit, hint)
            data = b"".join(chunks)
        return data
    finally:
        os.close(fd)


def too_large(where: object, size: int, limit: int, hint: str = "") -> CorruptCaptureError:
    """The one-line refusal of a file of ``size`` bytes, over the ``limit`` its reader allows."""
    return CorruptCaptureError(f"{where} is {size:,} bytes, more than the {limit:,} modulelens reads of such a file{hint}")


def require_dir(path: str | os.PathLike[str]) -> os.stat_result:
    """``lstat`` of a folder inside a repo, refusing a link or anything else that is not a folder.

    Raises:
        CorruptCaptureError: ``path`` is a symbolic link or not a folder.
        FileNotFoundError: ``path`` does not exist.
    """
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise CorruptCaptureError(f"{path} is a symbolic link; modulelens never follows links in a repo")
    if not stat.S_ISDIR(info.st_mode):
        raise CorruptCaptureError(f"{path} is not a folder")
    return info


# Files smaller than this are hashed from one read(): mapping one costs four more system calls (a
# descriptor duplicated, mmap, munmap, a second fstat), a tenth of a small save's system calls.
_MAP_FROM = 1 << 20


def hash_file(path: str | os.PathLike[str]) -> str:
    """The content hash of a regular file inside a repo (never through a link; memory-mapped unless small)."""
    fd, info = _open_checked(path)
    try:
        if info.st_size < _MAP_FROM:
            data = os.read(fd, info.st_size + 1)
            while len(data) > info.st_size and (more := os.read(fd, 1 << 20)):  # it grew meanwhile: hash it all
                data += more
            return hash_bytes(data)
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
            return hash_bytes(memoryview(mapped))
    finally:
        os.close(fd)
