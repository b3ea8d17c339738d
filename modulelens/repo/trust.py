"""Trust in a local repo: the "trust stored source" setting, the provenance of your own captures,
and the :class:`TrustPolicy` one load decides them into.

Both are bound to the repo's directory (real path, device, inode) and the current user, so neither
travels with a copy (docs/security.md).

**The setting.**

A user may mark *their own* local repo as trusted, so that loading its captures runs the source
stored with them (docs/security.md) without ``trust_source=True`` each time. The setting is a file
``<root>/trust.json`` that records who set it and on which directory (real path, device, inode).
It counts only when all of those still match and the file belongs to the current user and is not
writable by others: a repo copied, unpacked or synced from elsewhere (new inode, other owner) is
never trusted by a file it brought along.

**Provenance.** A capture this user saved into this repo carries a ``provenance`` field signed with
the user's key (:mod:`modulelens.format.provenance`) over its metadata and this directory's
identity: :func:`capture_sealer` makes it when the repo saves a new capture, and
:func:`own_capture` checks it, for the loader, where the import rules would otherwise refuse the
capture's own classes. A copied, pulled, pushed or downloaded capture (another directory), one
saved by another user (another key), one edited or moved to another name or version, verifies as
not yours.

**The policy.** Storage knows nothing of trust: ``load()`` resolves one :class:`TrustPolicy` per
load (:meth:`modulelens.repo.repository.Repo.trust_policy`: the ``trust_source=`` argument, else the
``Repo(..., trust_source=True)`` of that object, else this setting) and hands it to class
resolution (:class:`modulelens.restore.classes.ClassResolver`), where its one decision is made.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from modulelens.errors import CorruptCaptureError, SigningKeyError
from modulelens.format.provenance import NOT_CHECKED, check, seal, user_key, warn_once
from modulelens.repo.files import read_regular, write_new_file

TRUST_FILE = "trust.json"


def repo_identity(root: Path) -> dict[str, object]:
    """What binds trust to a local repo: its directory's real path, device and inode, and the user.
    A copy (new inode), a move (new path) or another user's view of it differs."""
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
        data = json.loads(read_regular(path, limit=4096))  # O_NOFOLLOW: no swap for a link after the lstat
        return bool(isinstance(data, dict) and data.get("trust_source") is True
                    and {k: data.get(k) for k in ("path", "device", "inode", "uid")} == repo_identity(root))
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
    write_new_file(tmp, json.dumps({"trust_source": True, **repo_identity(root)}).encode(), mode=0o644)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


@dataclass(frozen=True)
class TrustPolicy:
    """What loading a capture may run, decided once per load (docs/security.md).

    Attributes:
        stored_source: the source stored with the capture may run (``trust_source``).
        own_repo: the local repo directory where this user's signed captures count as their own
            (their classes need no trust there); ``None``: no capture counts as the user's own
            (an object store, whose captures always need trust).

    Example::

        policy = modulelens.Repo("/data/captures").trust_policy()   # the repo's own setting
        policy.stored_source, policy.own_repo
    """

    stored_source: bool = False
    own_repo: Path | None = None

    def provenance(self, name: str, version: int, metadata: Mapping[str, object]) -> Provenance:
        """Whether ``metadata``, read from ``name:v<version>``, is a capture this user saved into
        :attr:`own_repo` (:func:`own_capture`), and if not why not."""
        if self.own_repo is None:
            return Provenance(False, "it is not in a local repo")
        return own_capture(self.own_repo, name, version, metadata)

    def sealer(self) -> Callable[[list[str]], dict[str, object]] | None:
        """What signs a capture saved into :attr:`own_repo` as this user's own (:func:`capture_sealer`);
        ``None`` where captures are not signed (no own repo, or no key to be had)."""
        return None if self.own_repo is None else capture_sealer(self.own_repo)


class KeptSealer:
    """What signs a capture saved into the repo at ``root`` (:meth:`TrustPolicy.sealer`), made once
    per key location (the environment that names the key file) and kept: finding the key and the
    repo's identity again was 13 system calls of every small save (issue 37). A key replaced or a
    repo moved meanwhile signs as before, and such a capture then counts as not the user's own (the
    safe side). ``None`` is not kept: a key created later signs the next save."""

    def __init__(self, root: Path | None) -> None:
        self._root = root
        self._kept: tuple[tuple[str | None, str | None], Callable[[list[str]], dict[str, object]]] | None = None

    def __call__(self) -> Callable[[list[str]], dict[str, object]] | None:
        where = (os.environ.get("XDG_CONFIG_HOME"), os.environ.get("HOME"))  # what names the key file (key_file)
        if self._kept is None or self._kept[0] != where:
            sealer = TrustPolicy(own_repo=self._root).sealer()
            if sealer is None:
                return None
            self._kept = (where, sealer)
        return self._kept[1]


@dataclass(frozen=True)
class Provenance:
    """Whether a capture is the current user's own, saved into this repo (and if not, why not)."""

    own: bool
    why: str = ""
    settled: bool = True  # False: not checked yet (``own_capture(encode=False)``), ``own`` is False meanwhile


def capture_sealer(root: Path) -> Callable[[list[str]], dict[str, object]] | None:
    """What :meth:`Repo.save_version` signs a new capture with: field lines -> the ``provenance``
    field, for the repo at ``root``. ``None`` (after one warning per process) when the user's key
    cannot be had: the capture is then saved unsigned, as captures were before provenance."""
    try:
        key = user_key(create=True)
        binding = repo_identity(root)
    except SigningKeyError as error:
        warn_once(str(error))
        return None
    return lambda lines: seal(lines, binding, key)


def own_capture(root: Path, name: str, version: int, metadata: Mapping[str, object], *,
                text: bytes | None = None, encode: bool = True) -> Provenance:
    """Whether ``metadata``, read from ``name:v<version>`` of the repo at ``root``, is a capture
    the current user saved there (its provenance verifies under the user's key for this directory,
    and it sits where it was saved). ``text``: the bytes ``metadata`` was parsed from, when the
    caller has them (checked as they are, without encoding the metadata again: format.provenance.check).
    ``encode=False``: when only encoding the metadata again could tell, answer at once with
    ``settled=False`` (a page that shows the verdict later)."""
    try:
        key = user_key()
        binding = repo_identity(root)
    except (SigningKeyError, OSError) as error:
        return Provenance(False, f"no usable signing key here ({error})")
    why = check(metadata, binding, key, text=text, encode=encode)
    if why == NOT_CHECKED:
        return Provenance(False, why, settled=False)
    if why is not None:
        return Provenance(False, why)
    if metadata.get("name") != name or metadata.get("version") != version:
        return Provenance(False, f"it was saved as {metadata.get('name')!s:.200}:v{metadata.get('version')}, "
                                 "not where it is now")
    return Provenance(True)
