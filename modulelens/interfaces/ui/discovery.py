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
import json
import os
import socket
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
    """Write this process's announcement; returns its path (give it to :func:`withdraw` on exit)."""
    folder = discovery_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{_PREFIX}{os.getpid()}.json"
    staging = folder / f".{path.name}.tmp"
    data = json.dumps({"url": url, "pid": os.getpid(), "repo": repo_location, "token": token}).encode()
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(staging, path)
    return path


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
            if path.is_symlink() or path.stat().st_uid != os.getuid():
                continue  # only this user's own plain files are believed
            data = json.loads(path.read_text())
            url, pid = str(data["url"]), int(data["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(pid) and _answers(url):
            found.append(data)
        else:
            withdraw(path)
    return found


def capture_url(repo_location: str, ref: str) -> str | None:
    """The capture page of ``ref`` in a running UI that serves ``repo_location``, or ``None``.

    Example::

        capture_url("/data/captures", "demo/top_mlp:v1")   # 'http://127.0.0.1:8765/capture/demo/top_mlp:v1'
    """
    for server in running_servers():
        if same_repo(str(server.get("repo", "")), repo_location):
            token = server.get("token")
            return f"{server['url'].rstrip('/')}/capture/{quote(ref, safe='/:')}" + (f"?token={token}" if token else "")
    return None


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
