"""Opening files inside a repo without following symbolic links.

A repo may come from someone else (a tarball, a shared folder), so any entry in it may be a link
planted to make modulelens read, overwrite or delete a file outside it (docs/security.md). Every
open of a repo file on the save and read paths goes through here: ``O_NOFOLLOW`` refuses a link in
the last component, and ``fstat``/``lstat`` refuse anything that is not a regular file (a FIFO
would block a reader forever, a device would be read endlessly). Folders are checked with
:func:`require_dir` before use.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from modulelens.errors import CorruptCaptureError

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
    if _READ & getattr(os, "O_NONBLOCK", 0):  # only there so that opening a FIFO cannot block
        os.set_blocking(fd, True)
    return fd


def read_regular(path: str | os.PathLike[str]) -> bytes:
    """The bytes of a regular file inside a repo (see :func:`open_regular`).

    Example::

        data = json.loads(read_regular(version_dir / "capture.json"))
    """
    fd = open_regular(path)
    try:
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(fd)


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


def create_new(path: Path, mode: int = 0o644) -> int:
    """A write descriptor of a new file (``O_EXCL``: never an existing file, never through a link)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                   | getattr(os, "O_CLOEXEC", 0), mode)
