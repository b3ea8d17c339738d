"""Provenance of a capture: "this user saved it into this repo", signed with a per-user local key.

A capture a user made on their own machine may restore its own classes without ``modulelens
trust`` (their module from the current folder, the stored source of a ``__main__`` or notebook
class): see docs/security.md, "Your own captures". What makes a capture *your own* is its
``provenance`` field, written by the repo when it saves a new capture
(:func:`modulelens.repo.trust.capture_sealer`):

    "provenance": {"scheme": "modulelens-hmac-sha256-v1", "key": KEY_ID, "repo": PATH, "mac": HEX}

``mac`` is HMAC-SHA256, under the user's key, of :func:`message`: the scheme, the identity of the
repo it was saved into (real path, device, inode, user id: what :mod:`modulelens.repo.trust`
binds) and the capture's metadata as :func:`field_lines` writes it — every top-level field of
``capture.json`` except ``provenance``, in document order, each as compact JSON — which includes
the capture's name and version, every payload hash and the hash of every stored source file.
``key`` (a fingerprint of the key, not the key) and ``repo`` only make refusals explainable; they
are not trusted for anything.

The key is 32 random bytes, hex, in ``$XDG_CONFIG_HOME/modulelens/key`` (default
``~/.config/modulelens/key``), created on the first save (or the first verification marker
a repo records: :mod:`modulelens.repo.markers`), mode 0600 in a 0700 folder, never inside
a repo. A key file that is not a regular file of this user, that others may read or write, or whose
folder others may write, is not used. Without a usable key nothing is signed (one warning per
process) and nothing verifies: captures are treated as everyone else's, as before provenance.

No torch here: the repo signs and the loader verifies without it. hashlib, hmac and secrets are
imported where a key is made, used or checked: every ``ls`` imports this module (with the repo's
layout) and signs nothing, and loading them (OpenSSL) took 5 ms of it.
"""

from __future__ import annotations

import json
import os
import stat
import warnings
from collections.abc import Mapping
from pathlib import Path

from modulelens.errors import CaptureWarning, SigningKeyError

PROVENANCE_FIELD = "provenance"
SCHEME = "modulelens-hmac-sha256-v1"
_KEY_BYTES = 32
_warned: set[str] = set()  # warned once per process, per problem


def key_file() -> Path:
    """Where the user's signing key lives: ``$XDG_CONFIG_HOME/modulelens/key``, by default
    ``~/.config/modulelens/key``."""
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    folder = Path(base) if os.path.isabs(base) else Path.home() / ".config"  # the XDG spec ignores relative ones
    return folder / "modulelens" / "key"


def user_key(*, create: bool = False) -> bytes:
    """The user's signing key; with ``create``, made on first use.

    Raises:
        SigningKeyError: no key (and ``create`` is off), or it cannot be read or is not private.
    """
    try:
        path = key_file()
    except RuntimeError as error:  # Path.home() without a home directory
        raise SigningKeyError(f"no home directory for the signing key ({error})") from None
    try:
        return _read_key(path)
    except FileNotFoundError:
        if not create:
            raise SigningKeyError(f"no signing key at {path}") from None
    except OSError as error:
        raise SigningKeyError(f"cannot read the signing key {path}: {error.strerror or error}") from None
    try:
        return _create_key(path)
    except OSError as error:
        raise SigningKeyError(f"cannot create the signing key {path}: {error.strerror or error}") from None


def _read_key(path: Path) -> bytes:
    _check_private(path.parent, os.stat(path.parent), folder=True)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # a link planted at the key's place is refused
    try:
        _check_private(path, os.fstat(fd), folder=False)
        text = os.read(fd, 4 * _KEY_BYTES)
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != _KEY_BYTES:
        raise SigningKeyError(f"{path} is not a modulelens signing key ({_KEY_BYTES} random bytes, hex)")
    return key


def _create_key(path: Path) -> bytes:
    import secrets

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Written whole under a private name, then linked into place: a concurrent reader never sees a
    # half-written key, and of two processes creating it at once one wins and both use its key.
    staged = path.with_name(f".key.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (secrets.token_bytes(_KEY_BYTES).hex() + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(staged, path)
    except FileExistsError:
        pass  # another process made it first: its key is the key
    finally:
        staged.unlink()
    return _read_key(path)


def _check_private(path: Path, info: os.stat_result, *, folder: bool) -> None:
    """A key anyone else can read would let them sign as you; one they can write, or whose folder
    they can write, would let them choose your key."""
    kind_ok = stat.S_ISDIR(info.st_mode) if folder else stat.S_ISREG(info.st_mode)
    others = 0o022 if folder else 0o077
    if not kind_ok or info.st_uid != os.getuid() or info.st_mode & others:
        what = "folder" if folder else "file"
        raise SigningKeyError(f"the signing key {what} {path} must be yours and private "
                              f"(chmod {'700' if folder else '600'} {path})")


def key_id(key: bytes) -> str:
    """A fingerprint that names a key in messages without revealing it."""
    import hashlib

    return hashlib.sha256(b"modulelens key id\n" + key).hexdigest()[:16]


# json.dumps with separators builds a new encoder on every call: a fifth of writing a small
# capture.json (its ~20 fields), for output identical to this one encoder's
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def field_line(key: str, value: object) -> str:
    """One top-level field of ``capture.json`` as the repo writes it (and as it is signed)."""
    return f"{json.dumps(key)}: {_COMPACT.encode(value)}"


def field_lines(metadata: Mapping[str, object]) -> list[str]:
    """The signed text of a capture's metadata: every top-level field but ``provenance``, in order."""
    return [field_line(k, v) for k, v in metadata.items() if k != PROVENANCE_FIELD]


def stored_field_lines(text: bytes) -> list[str] | None:
    """The signed text of a ``capture.json`` read from its bytes, without encoding the metadata again:
    its field lines but ``provenance``'s, when the file is laid out as the repo writes it (``{``, one
    compact field a line, ``}``; ``modulelens.repo.layout.capture_json``). ``None`` otherwise, or when
    a line that starts with the ``provenance`` key holds more than that field (a line left out of
    the signed text must hide nothing the reader would take). Encoding every field again was 0.65 s
    of the first view of a 50,000-call capture (benchmarks/bench_ui.py --huge); this is a split."""
    try:
        decoded = text.decode()
    except UnicodeDecodeError:
        return None
    if not (decoded.startswith("{\n") and decoded.endswith("\n}\n")):
        return None
    # compact JSON holds no raw newline, so ",\n" only ever separates fields (a file where it does
    # not gives lines that were never signed: no match, and the caller checks the parsed fields)
    lines = decoded[2:-3].split(",\n")
    head = json.dumps(PROVENANCE_FIELD) + ":"
    signed = [line for line in lines if not line.startswith(head)]
    for line in lines:
        if line.startswith(head):
            try:
                alone = json.loads("{" + line + "}")
            except ValueError:
                return None
            if not isinstance(alone, dict) or set(alone) != {PROVENANCE_FIELD}:
                return None
    return signed if len(lines) - len(signed) <= 1 else None


def stored_field(text: bytes, key: str) -> object:
    """Top-level field ``key`` of a ``capture.json`` laid out as the repo writes it (see
    :func:`stored_field_lines`), parsed from its own line alone; ``None`` when the file is not laid
    out so, has no such line, or that line is not one field. Compact JSON holds no raw newline, so a
    line that starts with the key is the top-level field (the last one, as a parse would take it):
    the UI's job column read a 50,000-call capture's environment so instead of parsing its 45 MiB."""
    if not (text.startswith(b"{\n") and text.endswith(b"\n}\n")):
        return None
    head = b"\n" + json.dumps(key).encode() + b":"
    start = text.rfind(head)
    if start < 0:
        return None
    end = text.find(b",\n", start + 1)
    line = text[start + 1:end if end >= 0 else len(text) - 3]
    try:
        alone = json.loads(b"{" + line + b"}")
    except (ValueError, RecursionError):
        return None
    return alone.get(key) if isinstance(alone, dict) and set(alone) == {key} else None


def message(lines: list[str], binding: Mapping[str, object]) -> bytes:
    """What the MAC covers: the scheme, the repo identity and the metadata's field lines."""
    head = f"{SCHEME}\n{json.dumps(dict(binding), sort_keys=True, separators=(',', ':'))}\n"
    return (head + "\n".join(lines)).encode()


def seal(lines: list[str], binding: Mapping[str, object], key: bytes) -> dict[str, object]:
    """The ``provenance`` field for metadata whose :func:`field_lines` are ``lines``, saved into the
    repo ``binding`` identifies."""
    import hashlib
    import hmac

    mac = hmac.new(key, message(lines, binding), hashlib.sha256).hexdigest()
    return {"scheme": SCHEME, "key": key_id(key), "repo": binding.get("path"), "mac": mac}


# What :func:`check` answers with ``encode=False`` when only encoding the metadata again can tell
# (its stored lines do not verify as they are): the UI's first view of a 50,000-call capture spent
# 0.4 s idle, 1.9 s at load 3, on that encoding, so its page asks for the verdict afterwards.
NOT_CHECKED = "not checked yet (its file is not the lines that were signed: checking encodes it again)"


def check(metadata: Mapping[str, object], binding: Mapping[str, object], key: bytes, *,
          text: bytes | None = None, encode: bool = True) -> str | None:
    """``None`` when ``metadata`` carries a valid provenance for the repo ``binding`` identifies
    under ``key``; otherwise why not (a phrase for error messages).

    ``text``: the bytes ``metadata`` was parsed from, when the caller has them. Their own field
    lines (:func:`stored_field_lines`) are checked first: signed lines parse to the signed fields,
    so a match verifies the metadata without encoding it again (the repo signs the very lines it
    writes). Otherwise, as without ``text``, the parsed fields are encoded and checked (reformatting
    a file is not editing it); with ``encode=False`` they are not, and the answer is
    :data:`NOT_CHECKED`."""
    field = metadata.get(PROVENANCE_FIELD)
    if field is None:
        return "it has no provenance (saved by another user, machine or an older modulelens, or copied)"
    mac = field.get("mac") if isinstance(field, dict) else None
    if not isinstance(field, dict) or field.get("scheme") != SCHEME or not isinstance(mac, str) or not mac.isascii():
        return "its provenance is not one this modulelens signs"  # (compare_digest takes ASCII strings only)
    if field.get("key") != key_id(key):
        return "it was signed with another key (another user or machine)"
    import hashlib
    import hmac

    stored = stored_field_lines(text) if text is not None else None
    if stored is not None and hmac.compare_digest(hmac.new(key, message(stored, binding), hashlib.sha256).hexdigest(), mac):
        return None
    where = field.get("repo")
    if not encode:
        # Signed for another repo: the MAC binds that repo, so no encoding matches here (unless the
        # field naming the repo was edited after signing: then "not yours" too, the safe answer).
        if isinstance(where, str) and where != binding.get("path"):
            return _another_repo(where)
        return NOT_CHECKED
    expected = hmac.new(key, message(field_lines(metadata), binding), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, mac):
        if isinstance(where, str) and where != binding.get("path"):
            return _another_repo(where)
        return "its signature does not match (the capture was edited, copied or moved since it was saved)"
    return None


def _another_repo(where: str) -> str:
    return f"it was signed for another repo ({where[:200]!r}): copied, pulled, pushed or moved"


def warn_once(problem: str) -> None:
    """One :class:`CaptureWarning` per process for a key problem met while saving."""
    if problem in _warned:
        return
    _warned.add(problem)
    warnings.warn(f"modulelens: {problem}; captures saved now are not marked as yours, so restoring their "
                  "classes from the current folder or from stored source will need `modulelens trust` "
                  "(docs/security.md)", CaptureWarning, stacklevel=2)
