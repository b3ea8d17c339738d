"""The per-repo "trust stored source" setting, bound to the directory it was set on.

A user may mark *their own* local repo as trusted, so that loading its captures runs the source
stored with them (docs/security.md) without ``trust_source=True`` each time. The setting is a file
``<root>/trust.json`` that records who set it and on which directory (real path, device, inode).
It counts only when all of those still match and the file belongs to the current user and is not
writable by others: a repo copied, unpacked or synced from elsewhere (new inode, other owner) is
never trusted by a file it brought along.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from modulelens.errors import CorruptCaptureError
from modulelens.repo.files import read_regular, write_new_file

TRUST_FILE = "trust.json"


def _identity(root: Path) -> dict[str, Any]:
    info = os.stat(root)
    return {"path": os.path.realpath(root), "device": info.st_dev, "inode": info.st_ino, "uid": os.getuid()}


def trusts_source(root: Path) -> bool:
    """Whether the repo at ``root`` carries a valid trust setting made by this user on this directory."""
    path = root / TRUST_FILE
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            return False
        if info.st_size > 4096:
            return False
        data = json.loads(read_regular(path))  # O_NOFOLLOW: no swap for a link after the lstat
        return bool(isinstance(data, dict) and data.get("trust_source") is True
                    and {k: data.get(k) for k in ("path", "device", "inode", "uid")} == _identity(root))
    except (OSError, ValueError, CorruptCaptureError):
        return False


def set_trust_source(root: Path, value: bool) -> None:
    """Record (``value=True``) or drop the trust setting of the repo at ``root``."""
    path = root / TRUST_FILE
    if not value:
        path.unlink(missing_ok=True)
        return
    tmp = root / f".{TRUST_FILE}.{os.getpid()}"
    tmp.unlink(missing_ok=True)  # left by a crash (or planted): removed as it is, never written through
    write_new_file(tmp, json.dumps({"trust_source": True, **_identity(root)}).encode(), mode=0o644)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
