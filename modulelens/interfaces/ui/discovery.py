"""How ``modulelens show`` and the notebook find a running ``modulelens ui`` to link to.

A server announces itself in a small JSON file, ``ui-<pid>.json``, in the user's runtime folder
(``$XDG_RUNTIME_DIR/modulelens``, else ``~/.cache/modulelens/ui``; folder 0700, file 0600): its URL,
its pid, the repo it serves and, when it needs one, its token. It removes the file on exit; a file
whose process is gone or whose port no longer answers (a killed server, a reused pid) is stale,
ignored and removed by the next reader. Only the standard library is imported here: ``show``
starts without torch or the web stack.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import stat
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

_PREFIX = "ui-"


def discovery_dir() -> Path:
    """Where running servers announce themselves (created on first announcement)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "modulelens"
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "modulelens" / "ui"


def same_repo(a: str, b: str) -> bool:
    """Whether two repo locations (paths or URLs, as ``Repo.location`` gives them) are one repo."""
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def announce(url: str, repo_location: str, token: str | None) -> Path:
    """Write this process's announcement; returns its path (give it to :func:`withdraw` on exit).

    The file holds the token, so nothing planted in the folder may redirect the write: the folder
    is opened without following a link and must be a folder of this user's that no one else can
    enter (one of ours with a looser mode is tightened to 0700 first); the file is written under a
    fresh random name with ``O_EXCL | O_NOFOLLOW`` and renamed into place inside that opened folder,
    so a link planted at either name (``ui-<pid>.json``, the old fixed ``.ui-<pid>.json.tmp``) is
    replaced, never followed.

    Raises:
        OSError: the folder is a link, not a folder, another user's, or cannot be written (the
            server then runs without announcing itself: ``show`` will not link to it).
    """
    folder = discovery_dir()
    name = f"{_PREFIX}{os.getpid()}.json"
    data = json.dumps({"url": url, "pid": os.getpid(), "repo": repo_location, "token": token}).encode()
    fd = _open_own_folder(folder)
    try:
        staging = f".{name}.{secrets.token_hex(8)}.tmp"
        out = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
        try:
            os.write(out, data)
        finally:
            os.close(out)
        os.replace(staging, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)
    return folder / name


def _open_own_folder(folder: Path) -> int:
    """A descriptor of ``folder`` (created 0700 when missing), refused unless it is a real folder of
    this user's; a looser mode is tightened to 0700 (others could otherwise replace what is written)."""
    folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:  # ELOOP: a link; ENOTDIR: a file
        raise OSError(error.errno, f"the UI's discovery folder {folder} is not a plain folder "
                                   f"({error.strerror}): not announced there") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise PermissionError(errno.EPERM, f"the UI's discovery folder {folder} belongs to uid {info.st_uid}, "
                                               f"not to this user ({os.getuid()}): not announced there")
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def withdraw(path: Path) -> None:
    """Remove an announcement (a server stopping)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def running_servers() -> list[dict[str, Any]]:
    """The announcements of servers that are running now (stale ones are removed)."""
    folder = discovery_dir()
    try:
        entries = sorted(folder.glob(f"{_PREFIX}*.json"))
    except OSError:
        return []
    found = []
    for path in entries:
        try:
            data = json.loads(_read_own(path))
            url, pid = str(data["url"]), int(data["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # only this user's own plain files are believed
        if _alive(pid) and _answers(url):
            found.append(data)
        else:
            withdraw(path)
    return found


def capture_url(repo_location: str, ref: str) -> str | None:
    """The capture page of ``ref`` in a running UI that serves ``repo_location``, or ``None``.

    Never with the server's token: a link lands in logs, notebooks and a terminal's scrollback. A
    browser that opened the address ``modulelens ui`` printed (once, with ``?token=``) has the
    token in its cookie; any other is asked to open that address (docs/ui.md, "Where the token appears").

    Example::

        capture_url("/data/captures", "demo/top_mlp:v1")   # 'http://127.0.0.1:8765/capture/demo/top_mlp:v1'
    """
    for server in running_servers():
        if same_repo(str(server.get("repo", "")), repo_location):
            return f"{server['url'].rstrip('/')}/capture/{quote(ref, safe='/:')}"
    return None


def _read_own(path: Path, limit: int = 1 << 16) -> bytes:
    """An announcement's bytes, only from a plain file of this user's (never through a link)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise PermissionError(errno.EPERM, "not this user's plain file", str(path))
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _answers(url: str) -> bool:
    """Whether something listens at the URL's host and port (a pid may have been reused)."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=0.3):
            return True
    except OSError:
        return False
