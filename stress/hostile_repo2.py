"""Hostile repos, part 2 (issue 21, defects 2, 3, 4, 5 and 7a): forged verification markers,
pack headers that lie, links at every path of the layout, one damaged file, a pull onto a full disk.

Each case copies a template repo (``small``: every payload in a pack; ``big``: a 5 MiB weight of
its own, which loads trust through its verification marker, and its bias in a pack; ``copy/small``
and ``copy/big``: the same contents under other names; ``other/bystander``: never touched), damages
it the way a received repo or an attacker with write access could, and runs every consumer on it
in a forked child (killed after :data:`TIMEOUT_S`: a hang):

load (module and every tensor, compared with the stored values), ``ls``, ``show``, ``diff``,
``push`` (into a fresh repo), ``pull`` (into the user's own repo), a save of ``big``'s true
weights (it must not dedup against a bad blob), ``gc``, ``fsck``, ``fsck --repair``, and after the
repair ``fsck``, ``ls``, the loads and a save again. Commands run through the CLI (typer's
``CliRunner``), the load and the save through the Python API.

Per consumer run, counted as **wrong** (the row's notes say which):

* ``outside``: a file outside the repo (what its links point at) was written, created or deleted;
* ``wrong data``: a tensor that loads (from the repo, or from what push/pull copied) but is not the
  stored value, or a blob copied as a hard link of the source's;
* ``traceback``: an exception that is not a modulelens error, or an ``OSError`` shown by the CLI
  that is not a refusing filesystem;
* ``unclear``: a refusal in more than one line, or one that does not name the damaged entry;
* ``broken``: something that must keep working did not: ``ls``, the loads of captures the case
  does not touch, every consumer after ``fsck --repair``, and the repair itself (fsck clean after);
* ``hang``: the case did not finish in time.

**executed** is 0 by construction: no case carries code (the trust rows test that).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import struct
import subprocess
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import torch

import modulelens
from modulelens.errors import ModulelensError
from modulelens.format.hashing import hash_bytes
from modulelens.format.tensors import dtype_from_name, tensor_bytes
from stress.hostile_trust import as_user
from stress.table import Row

_CTX = multiprocessing.get_context("fork")
TIMEOUT_S = 300
REFS = ("small", "big", "copy/small", "copy/big", "other/bystander")
BIG = (1280, 1024)  # Linear(in, out): a 5 MiB weight, sampled (8 of 80 chunks) when its marker is trusted


# ------------------------------------------------------------------------------------ the template


@dataclass
class Template:
    """Made once, before forking: the repo every case copies, what each capture stores, and
    ``big``'s metadata and payloads for saving it again."""

    root: Path
    user: Path  # the user's own repo (pull target), to copy
    truth: dict[str, dict[str, bytes]]  # name -> tensor id -> payload bytes
    big_meta: dict[str, Any]
    big_payloads: dict[str, bytes]


def _recorded(scratch: modulelens.Repo, module: torch.nn.Module, width: int) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A real capture of ``module``'s first child: its metadata (ready to save again) and payloads."""
    with modulelens.capture(module, targets=["0"], repo=scratch, name="scratch", strict=True) as cap:
        module(torch.randn(2, width))
    meta = scratch.read_metadata(*scratch.resolve(cap.saved[0].ref))
    reader = scratch.payloads(meta)
    payloads = {tid: bytes(tensor_bytes(reader.open_tensor(e, dtype_from_name(e["dtype"]))))
                for tid, e in meta["tensors"].items() if e.get("payload")}
    for key in ("packs", "provenance", "name", "version"):
        meta.pop(key, None)
    for entry in meta["tensors"].values():
        entry.pop("pack", None)
    return meta, payloads


def _save(repo: modulelens.Repo, name: str, meta: dict[str, Any], payloads: dict[str, bytes]) -> None:
    repo.save_version(name, json.loads(json.dumps(meta)), {tid: memoryview(data) for tid, data in payloads.items()})


def make_template(tmp: Path) -> Template:
    handle = modulelens.track_init()
    try:
        torch.manual_seed(0)
        small = torch.nn.Sequential(torch.nn.Linear(4, 4))
        big = torch.nn.Sequential(torch.nn.Linear(*BIG))
        bystander = torch.nn.Sequential(torch.nn.Linear(4, 4))
        mine = torch.nn.Sequential(torch.nn.Linear(4, 4))
    finally:
        handle.stop()
    scratch = modulelens.Repo(tmp / "hostile2-scratch")
    repo = modulelens.Repo(tmp / "hostile2-template")
    user = modulelens.Repo(tmp / "hostile2-user-template")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        recorded = {"small": _recorded(scratch, small, 4), "big": _recorded(scratch, big, BIG[0]),
                    "other/bystander": _recorded(scratch, bystander, 4)}
        recorded["copy/small"], recorded["copy/big"] = recorded["small"], recorded["big"]
        for name in REFS:
            _save(repo, name, *recorded[name])
        _save(user, "mine", *_recorded(scratch, mine, 4))
    truth = {name: recorded[name][1] for name in REFS}
    return Template(repo.root, user.root, truth, *recorded["big"])


# ------------------------------------------------------------------------------------ planting


@dataclass
class Setup:
    """One case's folders: the hostile repo, what its links point at, the user's repo."""

    case: Path
    template: Template

    @property
    def root(self) -> Path:
        return self.case / "repo"

    @property
    def outside(self) -> Path:
        return self.case / "outside"

    @property
    def user(self) -> Path:
        return self.case / "user"

    @property
    def pushed(self) -> Path:
        return self.case / "pushed"

    def meta_path(self, name: str, version: int = 1) -> Path:
        return self.root / "names" / quote(name, safe="") / "versions" / str(version) / "capture.json"

    def meta(self, name: str) -> dict[str, Any]:
        return json.loads(self.meta_path(name).read_text())

    def edit_meta(self, name: str, edit: Callable[[dict[str, Any]], None]) -> None:
        path = self.meta_path(name)
        meta = json.loads(path.read_text())
        edit(meta)
        os.chmod(path, 0o644)
        path.write_text(json.dumps(meta))

    def blob(self, digest: str) -> Path:
        hexdigest = digest.partition(":")[2]
        return self.root / "blobs" / hexdigest[:2] / hexdigest

    def weight_blob(self) -> Path:
        """``big``'s weight: the one loose blob of the repo (trusted through its marker)."""
        meta = self.meta("big")
        return self.blob(next(e["payload"] for e in meta["tensors"].values() if "pack" not in e and e.get("payload")))

    def pack_blob(self, name: str) -> Path:
        return self.blob(self.meta(name)["packs"][0]["payload"])

    def link(self, relative: str, *, dangling: bool = False) -> None:
        """Move the entry at ``relative`` outside (a folder, a file, or nothing) and put a link there."""
        path = self.root / relative
        target = self.outside / relative.replace("/", "__")
        target.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(path) and not dangling:
            shutil.move(str(path), str(target))
        elif os.path.lexists(path):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        path.symlink_to(target, target_is_directory=not dangling and target.is_dir())


def _writable(path: Path) -> None:
    os.chmod(path, 0o644)


def _flip(path: Path, offset: int, *, keep_mtime: bool = True) -> None:
    """Change one byte in place, and put the mtime back as it was (what bit rot, or an editor that
    restores times, leaves)."""
    info = os.stat(path)
    _writable(path)
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x5A]))
    os.chmod(path, 0o444)
    if keep_mtime:
        os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def _old_marker(blob: Path) -> None:
    """A marker in the unbound format of modulelens before issue 21, describing the blob as it is now."""
    import xxhash

    data = blob.read_bytes()
    chunk = max(64 << 10, -(-len(data) // 1024))
    chunks = b"".join(xxhash.xxh3_64_digest(data[i:i + chunk]) for i in range(0, len(data), chunk)).hex()
    info = os.stat(blob)
    marker = Path(f"{blob}.ok")
    if marker.exists():
        marker.unlink()
    marker.write_text(json.dumps({"size": info.st_size, "mtime_ns": info.st_mtime_ns, "checked": time.time(),
                                  "chunk_hash": "xxh3_64", "chunk": chunk, "chunks": chunks}))


def _sender_marked(s: Setup) -> None:
    """The sender alters ``big``'s weight in their own repo and lets their modulelens record a
    marker for it (their key, their directory); then the repo is copied to the user, times kept."""
    from modulelens.format.provenance import user_key
    from modulelens.repo.markers import MarkerKey, write_marker
    from modulelens.repo.trust import repo_identity

    sender = s.case / "sender"
    blob = sender / s.weight_blob().relative_to(s.root)
    os.rename(s.root, sender)
    with as_user(s.case / "sender-config"):
        _flip(blob, 3 << 20, keep_mtime=False)
        # what the sender's modulelens records after a full check, with the sender's key for their repo
        write_marker(blob, MarkerKey.derive(user_key(create=True), repo_identity(sender)))
    shutil.copytree(sender, s.root, symlinks=True)  # copy2: modes and times kept, as cp -a or tar


def _rewrite_pack(s: Setup, name: str, edit: Callable[[dict[str, Any], bytes], bytes]) -> None:
    """Replace ``name``'s pack by ``edit(header, data)`` (new bytes), stored under its own hash, and
    point the capture at it: a pack that hashes correctly but whose header lies."""
    old = s.pack_blob(name).read_bytes()
    (length,) = struct.unpack_from("<Q", old)
    header = json.loads(old[8:8 + length])
    new = edit(header, old)
    digest = hash_bytes(new)
    path = s.blob(digest)
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(new)
    os.chmod(path, 0o444)

    def repoint(meta: dict[str, Any]) -> None:
        meta["packs"][0] = {"payload": digest, "nbytes": len(new)}

    s.edit_meta(name, repoint)


def _same_length_header(header: dict[str, Any], old: bytes) -> bytes:
    (length,) = struct.unpack_from("<Q", old)
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= length, "header grew"
    return old[:8] + text.ljust(length) + old[8 + length:]


def _member_swap(header: dict[str, Any], old: bytes) -> bytes:
    """The bias's member entry points at the first bytes of the weight's."""
    members = header["members"]
    weight, bias = sorted(members, key=lambda h: -members[h][1])[:2]
    members[bias] = [members[weight][0], members[bias][1]]
    return _same_length_header(header, old)


def _member_bytes_changed(header: dict[str, Any], old: bytes) -> bytes:
    members = header["members"]
    bias = min(members, key=lambda h: members[h][1])
    offset = members[bias][0]
    return old[:offset] + bytes([old[offset] ^ 0x5A]) + old[offset + 1:]


def _nested_header(header: dict[str, Any], old: bytes) -> bytes:
    text = b"[" * 200_000
    return struct.pack("<Q", len(text)) + text + old[8 + struct.unpack_from("<Q", old)[0]:]


def _members_list(header: dict[str, Any], old: bytes) -> bytes:
    header["members"] = [[h, *v] for h, v in header["members"].items()]
    return _same_length_header(header, old)


def _chained_constructions(meta: dict[str, Any]) -> None:
    """20,000 constructions, each taking the next as an argument."""
    table = meta["constructions"]
    first = meta["module"]["construction"]
    inner = table[first]
    for i in range(20_000):
        table[f"chain{i}"] = {"class": "torch.nn.modules.container:Sequential",
                              "args": [{"$type": "module", "ref": f"chain{i + 1}" if i < 19_999 else first}],
                              "kwargs": {}}
    meta["module"]["construction"] = "chain0"
    del inner  # (the original stays at the end of the chain)


def _regular_file_at(s: Setup, relative: str) -> None:
    path = s.root / relative
    if path.is_dir():
        shutil.move(str(path), str(s.outside / relative.replace("/", "__")))
    elif path.exists():
        path.unlink()
    path.write_text("not a folder")


_INDEX_LOG = "names/small/summary-1.log"  # the template's index log of "small" (layout 3: repo/index.py)


def _reports_folder(s: Setup) -> None:
    (s.meta_path("small").parent / "reports").mkdir(exist_ok=True)


def _nested(path: Path) -> None:
    if path.exists():
        _writable(path)
        path.unlink()
    path.write_text("[" * 200_000)


# ------------------------------------------------------------------------------------ the cases


@dataclass
class Case:
    """``plant`` damages ``setup.root``; a refusal must contain ``names`` (the damaged entry);
    ``damaged``: names whose load may be refused (every other must load its stored values), or
    ``None`` when the case breaks the whole repo (nothing has to load before the repair)."""

    defect: str
    label: str
    plant: Callable[[Setup], None]
    names: Callable[[Setup], str]
    # (a function of the setup where it depends on the repo's contents: which packs share a folder)
    damaged: tuple[str, ...] | Callable[[Setup], tuple[str, ...]] | None = ()
    fsck_finds: bool = True


def _sharing_the_folder(s: Setup, blob: Path) -> tuple[str, ...]:
    """The captures with a blob in ``blob``'s folder: a pack is named by its content's hash, which
    differs from run to run, so another capture's pack lands in the same folder now and then (a
    failure of about one run in a hundred, seen once in CI's tests)."""
    sharing = []
    for name in REFS:
        meta = s.meta(name)
        digests = [p["payload"] for p in meta.get("packs", [])]
        digests += [e["payload"] for e in meta["tensors"].values() if "pack" not in e and e.get("payload")]
        if any(s.blob(digest).parent.name == blob.parent.name for digest in digests):
            sharing.append(name)
    return tuple(sharing)


def _weight_token(s: Setup) -> str:
    return s.weight_blob().name[:16]


def _pack_token(name: str) -> Callable[[Setup], str]:
    def token(s: Setup) -> str:
        return s.pack_blob(name).name[:16]
    return token


def _path(relative: str) -> Callable[[Setup], str]:
    return lambda s: relative


def _meta_token(name: str) -> Callable[[Setup], str]:
    return lambda s: f"names/{quote(name, safe='')}/versions/1"


def _forge_old_marker(s: Setup) -> None:
    blob = s.weight_blob()
    _flip(blob, 3 << 20)
    _old_marker(blob)


def _marker_link(s: Setup) -> None:
    marker = Path(f"{s.weight_blob()}.ok")
    s.outside.mkdir(exist_ok=True)
    (s.outside / "marker").write_text("keep me")
    if os.path.lexists(marker):
        marker.unlink()
    marker.symlink_to(s.outside / "marker")


def _lock_loop(s: Setup) -> None:
    lock = s.root / "lock"
    if os.path.lexists(lock):
        lock.unlink()
    lock.symlink_to("lock")  # ELOOP


def _alias_folder(s: Setup) -> None:
    modulelens.Repo(s.root).set_alias("other/bystander:v1", "golden")
    alias = s.root / "names" / "small" / "aliases" / "golden"
    alias.parent.mkdir(exist_ok=True)
    alias.mkdir()


def _version_file(s: Setup) -> None:
    (s.root / "names" / "small" / "versions" / "5").write_text("not a version")


CASES: list[Case] = [
    # defect 2: verification markers and copies
    Case("markers", "blob altered, unbound marker rewritten to match", _forge_old_marker, _weight_token, ("big", "copy/big")),
    Case("markers", "blob altered in the sender's repo, marked by the sender's modulelens, repo copied",
         _sender_marked, _weight_token, ("big", "copy/big")),
    Case("markers", "blob altered in place, mtime kept, marker untouched",
         lambda s: _flip(s.weight_blob(), 3 << 20), _weight_token, ("big", "copy/big")),
    Case("markers", "marker is a link to a file outside", _marker_link, _weight_token, fsck_finds=True),
    Case("markers", "marker of 200,000 nested brackets", lambda s: _nested(Path(f"{s.weight_blob()}.ok")),
         _weight_token, fsck_finds=False),
    # defect 3: pack members
    Case("packs", "pack header points the bias at the weight's bytes",
         lambda s: _rewrite_pack(s, "small", _member_swap), _pack_token("small"), ("small",)),
    Case("packs", "pack member's bytes changed, pack renamed to its new hash",
         lambda s: _rewrite_pack(s, "small", _member_bytes_changed), _pack_token("small"), ("small",)),
    Case("packs", "pack header of 200,000 nested brackets",
         lambda s: _rewrite_pack(s, "small", _nested_header), _pack_token("small"), ("small",)),
    Case("packs", "pack header with members as a list",
         lambda s: _rewrite_pack(s, "small", _members_list), _pack_token("small"), ("small",)),
    # defect 4: links at every path of the layout
    *[Case("links", f"{relative} is a link to a copy outside", lambda s, r=relative: s.link(r), _path(relative),
           None if whole else damaged)
      for relative, whole, damaged in (
          ("names", True, ()), ("blobs", True, ()), ("tmp", False, ()), ("lock", False, ()),
          ("lock-gate", False, ()), ("modulelens-repo.json", True, ()),
          ("names/small", False, ("small",)), ("names/small/versions", False, ("small",)),
          ("names/small/versions/1", False, ("small",)), ("names/small/versions/1/capture.json", False, ("small",)),
          ("names/small/summary.json", False, ()), (_INDEX_LOG, False, ()),
      )],
    # (layout 3 makes a version's reports/ folder with its first report: one is made here first)
    Case("links", "names/small/versions/1/reports is a link to a copy outside",
         lambda s: (_reports_folder(s), s.link("names/small/versions/1/reports")),
         _path("names/small/versions/1/reports")),
    Case("links", "quarantine is a link to a folder outside",
         lambda s: (s.outside.mkdir(exist_ok=True), (s.outside / "q").mkdir(), (s.root / "quarantine").symlink_to(s.outside / "q")),
         _path("quarantine")),
    Case("links", "trust.json is a link to a trusting file outside",
         lambda s: (s.outside.mkdir(exist_ok=True), (s.outside / "trust").write_text('{"trust_source": true}'),
                    (s.root / "trust.json").symlink_to(s.outside / "trust")), _path("trust.json")),
    Case("links", "lock is a dangling link", lambda s: s.link("lock", dangling=True), _path("lock")),
    Case("links", "lock is a link to itself (ELOOP)", _lock_loop, _path("lock")),
    Case("links", "names/small/aliases is a link to a copy outside",
         lambda s: (modulelens.Repo(s.root).set_alias("small:v1", "golden"), s.link("names/small/aliases")),
         _path("names/small/aliases")),
    # defect 5: one damaged entry
    Case("entries", "capture.json with format_version 99 (a newer modulelens's: read by the repo, refused by loads)",
         lambda s: s.edit_meta("small", lambda m: m.update(format_version=99)), _meta_token("small"), ("small",),
         fsck_finds=False),
    Case("entries", "capture.json with format_version 99 and fields of other types",
         lambda s: s.edit_meta("small", lambda m: m.update(format_version=99, module="x", tensors=[1], calls=7,
                                                           tags="t", created=5)),
         _meta_token("small"), ("small",)),
    Case("entries", "capture.json of 200,000 nested brackets", lambda s: _nested(s.meta_path("small")),
         _meta_token("small"), ("small",)),
    Case("entries", "20,000 chained constructions", lambda s: s.edit_meta("small", _chained_constructions),
         _meta_token("small"), ("small",)),
    Case("entries", "a blob folder is a regular file",
         lambda s: _regular_file_at(s, f"blobs/{s.weight_blob().parent.name}"),
         lambda s: f"blobs/{s.weight_blob().parent.name}", lambda s: _sharing_the_folder(s, s.weight_blob())),
    Case("entries", "a blob is a folder",
         lambda s: (_writable(s.weight_blob()), s.weight_blob().unlink(), s.weight_blob().mkdir()),
         _weight_token, ("big", "copy/big")),
    Case("entries", "tmp is a regular file", lambda s: _regular_file_at(s, "tmp"), _path("tmp")),
    Case("entries", "blobs is a regular file", lambda s: _regular_file_at(s, "blobs"), _path("blobs"), None),
    Case("entries", "names is a regular file", lambda s: _regular_file_at(s, "names"), _path("names"), None),
    Case("entries", "a version is a regular file (the latest number)", _version_file, _path("names/small/versions/5"),
         ("small",)),
    Case("entries", "an alias is a folder", _alias_folder, _path("names/small/aliases/golden")),
    Case("entries", "modulelens-repo.json with a string layout version",
         lambda s: (s.root / "modulelens-repo.json").write_text('{"layout_version": "2"}'),
         _path("modulelens-repo.json")),
    Case("entries", "modulelens-repo.json of 200,000 nested brackets",
         lambda s: _nested(s.root / "modulelens-repo.json"), _path("modulelens-repo.json")),
    Case("entries", "modulelens-repo.json is a folder",
         lambda s: ((s.root / "modulelens-repo.json").unlink(), (s.root / "modulelens-repo.json").mkdir()),
         _path("modulelens-repo.json")),
    Case("entries", "trust.json of 200,000 nested brackets", lambda s: _nested(s.root / "trust.json"),
         _path("trust.json"), fsck_finds=False),
    Case("entries", "a report of 200,000 nested brackets",
         lambda s: (_reports_folder(s), _nested(s.meta_path("small").parent / "reports" / "profile-x.json")),
         _path("names/small/versions/1/reports"), fsck_finds=False),
    # the per-name index of layout 3 (repo/index.py): damaged, it is rebuilt from the folders
    Case("entries", "a name's index head of 200,000 nested brackets",
         lambda s: _nested(s.root / "names/small/summary.json"), _path("names/small/summary.json"), fsck_finds=False),
    Case("entries", "a name's index log of 200,000 nested brackets",
         lambda s: _nested(s.root / _INDEX_LOG), _path(_INDEX_LOG), fsck_finds=False),
    Case("entries", "a name's index log is a FIFO",
         lambda s: ((s.root / _INDEX_LOG).unlink(), os.mkfifo(s.root / _INDEX_LOG)), _path(_INDEX_LOG)),
]


# ------------------------------------------------------------------------------------ consumers


@dataclass
class Outcome:
    attempts: int = 0
    issues: list[tuple[str, str]] = field(default_factory=list)  # (kind, "consumer: what")


class _Runner:
    """Runs one case's consumers and records what went wrong."""

    def __init__(self, case: Case, setup: Setup) -> None:
        from typer.testing import CliRunner

        self.case = case
        self.s = setup
        self.out = Outcome()
        self.cli = CliRunner()
        self.converted: list[BaseException] = []
        self.tokens: list[str] = []  # a refusal names one of these: the damaged entry, or the version it is in

    def issue(self, kind: str, consumer: str, what: str) -> None:
        self.out.issues.append((kind, f"{self.case.label}: {consumer}: {what}"[:400]))

    # -------------------------------------------------------------------------------- one call

    def refusal(self, consumer: str, message: str, *, must_work: bool) -> None:
        if must_work:
            self.issue("broken", consumer, message)
        elif len(message.strip().splitlines()) != 1:
            self.issue("unclear", consumer, f"not one line: {message!r}")
        elif not any(token in message for token in self.tokens):
            self.issue("unclear", consumer, f"does not name {self.tokens[0]!r}: {message.strip()}")

    def command(self, consumer: str, args: list[str], *, must_work: bool = False,
                ok_codes: tuple[int, ...] = (0,)) -> int | None:
        """A CLI command; returns its exit code (``None`` after a crash)."""
        from modulelens.interfaces.cli import app

        self.out.attempts += 1
        self.converted.clear()
        result = self.cli.invoke(app, args)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            error = result.exception
            self.issue("traceback", consumer, f"{type(error).__name__}: {error}"[:300] + " @ "
                       + "".join(traceback.format_tb(error.__traceback__)[-1:]).strip()[-200:])
            return None
        for error in self.converted:
            if not (isinstance(error, OSError) and error.errno in _REFUSING):
                self.issue("traceback", consumer, f"{type(error).__name__} reached the CLI: {error}")
        if result.exit_code not in ok_codes:
            self.refusal(consumer, result.stderr or result.stdout, must_work=must_work)
        return result.exit_code

    def api(self, consumer: str, action: Callable[[], Any], *, must_work: bool = False) -> Any:
        self.out.attempts += 1
        try:
            return action()
        except ModulelensError as error:
            self.refusal(consumer, f"{type(error).__name__}: {error}", must_work=must_work)
        except Exception as error:
            self.issue("traceback", consumer, f"{type(error).__name__}: {str(error)[:200]} @ "
                       + "".join(traceback.format_tb(error.__traceback__)[-1:]).strip()[-200:])
        return None

    # -------------------------------------------------------------------------------- checks

    def check_values(self, consumer: str, root: Path, ref: str, name: str, *, must_work: bool,
                     verify: bool = False) -> None:
        """Load ``ref`` from ``root`` and compare the module and every tensor with what was stored."""
        truth = self.s.template.truth[name]

        def load() -> None:
            cap = modulelens.load(ref, repo=modulelens.Repo(root, create=False), verify=verify)
            module = cap.module
            for tid, expected in truth.items():
                if bytes(tensor_bytes(cap.tensor(tid))) != expected:
                    self.issue("wrong data", consumer, f"{ref}: tensor {tid} differs from what was stored")
            stored = {bytes(tensor_bytes(t.detach())) for t in module.state_dict().values()}
            if not stored <= set(truth.values()):
                self.issue("wrong data", consumer, f"{ref}: the module's weights differ from what was stored")

        self.api(consumer, load, must_work=must_work)

    def check_copies(self, consumer: str, target: Path, intact: list[str]) -> None:
        """Every version copied into a push/pull target loads its stored values (or, copied from a
        damaged capture, is refused), and no blob is a hard link."""
        if not target.exists():
            return
        repo = modulelens.Repo(target, create=False)
        for info in repo.list():
            name = info.name
            if name in self.s.template.truth:
                self.check_values(consumer, target, info.ref, name, must_work=name in intact)
        for blob in (target / "blobs").rglob("*"):
            if blob.is_file() and not blob.name.endswith(".ok") and os.stat(blob).st_nlink != 1:
                self.issue("wrong data", consumer, f"{blob.name[:16]} is a hard link (shared with another repo)")

    def save_true_big(self, consumer: str, root: Path, *, must_work: bool) -> None:
        """Save ``big``'s true weights again (same hashes: dedup) and load them back."""
        def save() -> str:
            meta = json.loads(json.dumps(self.s.template.big_meta))
            payloads = {tid: memoryview(data) for tid, data in self.s.template.big_payloads.items()}
            return modulelens.Repo(root).save_version("resaved/big", meta, payloads).ref

        ref = self.api(consumer, save, must_work=must_work)
        if ref is not None:
            truth = self.s.template.truth["big"]
            self.s.template.truth.setdefault("resaved/big", truth)
            self.check_values(consumer + " then load", root, ref, "resaved/big", must_work=True)

    # -------------------------------------------------------------------------------- all

    def run(self) -> Outcome:
        case, s, root = self.case, self.s, str(self.s.root)
        damaged = case.damaged(s) if callable(case.damaged) else case.damaged
        self.tokens = [case.names(s), *(f"{name}:v" for name in damaged or ())]
        intact = [] if damaged is None else [n for n in REFS if n not in damaged]
        whole = damaged is None
        for name in REFS:
            self.check_values("load", s.root, name, name, must_work=name in intact)
        self.command("ls", ["ls", "--repo", root], must_work=not whole)
        for name in REFS:
            self.command("show", ["show", name, "--repo", root], must_work=name in intact)
        self.command("diff", ["diff", "small", "copy/small", "--repo", root], must_work=not whole and "small" in intact)
        self.command("diff", ["diff", "big", "copy/big", "--repo", root, "--no-outputs"],
                     must_work=not whole and "big" in intact)
        for name in REFS:
            self.command("push", ["push", name, "--repo", root, "--to", str(s.pushed)], must_work=name in intact)
            self.command("pull", ["pull", root, name, "--repo", str(s.user)], must_work=name in intact)
        self.check_copies("push", s.pushed, intact)
        self.check_copies("pull", s.user, intact)
        code = self.command("fsck", ["fsck", "--repo", root], ok_codes=(0, 3))
        if case.fsck_finds and code == 0:
            self.issue("unclear", "fsck", "found nothing")
        self.save_true_big("save into the user's repo after the pull", s.user, must_work=True)
        self.save_true_big("save", s.root, must_work=False)  # (a blob that does not verify is written again)
        self.command("gc", ["gc", "--repo", root, "--tmp-older-than", "0"])
        self.command("fsck --repair", ["fsck", "--repair", "--repo", root], must_work=True)
        # after the repair, everything works
        self.command("fsck after the repair", ["fsck", "--repo", root], must_work=True)
        self.command("ls after the repair", ["ls", "--repo", root], must_work=True)
        for name in intact:
            self.check_values("load after the repair", s.root, name, name, must_work=True)
        self.save_true_big("save after the repair", s.root, must_work=True)
        return self.out


_REFUSING = {28, 122, 30, 13, 1}  # ENOSPC, EDQUOT, EROFS, EACCES, EPERM


def _snapshot(folder: Path) -> dict[str, Any]:
    """Everything under ``folder``: each entry's kind, and a file's bytes."""
    found: dict[str, Any] = {}
    if not folder.exists():
        return found
    found["."] = ("dir", os.stat(folder).st_mtime_ns)  # an entry made and removed again changes it
    for path in sorted(folder.rglob("*")):
        relative = str(path.relative_to(folder))
        if path.is_symlink():
            found[relative] = ("link", os.readlink(path))
        elif path.is_dir():
            found[relative] = ("dir", os.stat(path).st_mtime_ns)
        else:
            found[relative] = ("file", path.read_bytes())
    return found


def run_case(case: Case, folder: Path, template: Template) -> Outcome:
    """Copy the template, plant ``case``, run every consumer; what went wrong."""
    from modulelens.interfaces import _errors

    setup = Setup(folder, template)
    folder.mkdir(parents=True)
    setup.outside.mkdir()
    shutil.copytree(template.root, setup.root, symlinks=True)
    shutil.copytree(template.user, setup.user, symlinks=True)
    case.plant(setup)
    before = _snapshot(setup.outside)
    runner = _Runner(case, setup)
    original = _errors.as_modulelens_error

    def watched(error: BaseException) -> ModulelensError:
        if isinstance(error, OSError):
            runner.converted.append(error)
        return original(error)

    _errors.as_modulelens_error = watched  # OSErrors the CLI turns into messages: the refusing kinds only
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outcome = runner.run()
    finally:
        _errors.as_modulelens_error = original
    if _snapshot(setup.outside) != before:
        outcome.issues.append(("outside", f"{case.label}: files outside the repo changed"))
    return outcome


# ------------------------------------------------------------------------------------ 7a: full disk


def full_disk_outcome(folder: Path, template: Template) -> Outcome:
    """Pull ``big`` (5 MiB) into, and push it to, a repo on a 2 MiB tmpfs: one line, exit 8, the
    repo still lists, loads its own capture and is clean after gc; then the same with room."""
    out = Outcome()
    mount = folder / "disk"
    mount.mkdir(parents=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        out.issues.append(("broken", "full disk: cannot mount a tmpfs here"))
        return out
    try:
        from typer.testing import CliRunner

        from modulelens.interfaces.cli import app

        source = folder / "source"
        shutil.copytree(template.root, source, symlinks=True)
        user = mount / "user"
        shutil.copytree(template.user, user, symlinks=True)
        runner = CliRunner()
        for label, args in (("pull onto a full disk", ["pull", str(source), "big", "--repo", str(user)]),
                            ("push onto a full disk", ["push", "big", "--repo", str(source), "--to", str(mount / "pushed")])):
            out.attempts += 1
            result = runner.invoke(app, args)
            message = (result.stderr or result.stdout).strip()
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                out.issues.append(("traceback", f"{label}: {type(result.exception).__name__}: {result.exception}"))
            elif result.exit_code != 8 or len(message.splitlines()) != 1:
                out.issues.append(("unclear", f"{label}: exit {result.exit_code}: {message[:300]!r}"))
        out.attempts += 1
        ls = runner.invoke(app, ["ls", "--repo", str(user)])
        gc = runner.invoke(app, ["gc", "--repo", str(user), "--tmp-older-than", "0"])
        fsck = runner.invoke(app, ["fsck", "--repo", str(user)])
        try:
            modulelens.load("mine", repo=modulelens.Repo(user, create=False)).module  # noqa: B018
            loaded = True
        except Exception:
            loaded = False
        if ls.exit_code or gc.exit_code or fsck.exit_code or not loaded:
            out.issues.append(("broken", f"full disk: afterwards ls {ls.exit_code}, gc {gc.exit_code}, "
                                         f"fsck {fsck.exit_code}: {fsck.stdout[-200:]!r}, load {loaded}"))
    finally:
        import gc

        gc.collect()  # (maps of the loaded capture's files keep the mount busy)
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mount)], check=False)
    return out


# ------------------------------------------------------------------------------------ the rows


def _child(index: int, folder: str, template: Template, out: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["MODULELENS_FSYNC"] = "0"  # flushing is not what these rows test; on a busy disk it took minutes
    if index < 0:
        outcome = full_disk_outcome(Path(folder), template)
    else:
        outcome = run_case(CASES[index], Path(folder), template)
    Path(out).write_text(json.dumps({"attempts": outcome.attempts, "issues": outcome.issues}))


DEFECTS = {
    "markers": "forged/linked/damaged verification markers, pulled and re-saved blobs (issue 21, defect 2)",
    "packs": "pack headers that lie, members changed (issue 21, defect 3)",
    "links": "links at every path of the layout, top level included (issue 21, defect 4)",
    "entries": "one damaged file or folder of the layout (issue 21, defect 5)",
    "full disk": "pull and push onto a full disk (issue 21, defect 7a)",
}


def hostile_repo2_rows(tmp: Path) -> list[Row]:
    """One row per defect; every case through every consumer, each case in its own forked child."""
    config = tmp / "hostile2-config"
    with as_user(config):
        template = make_template(tmp)
        rows = {defect: Row(label) for defect, label in DEFECTS.items()}
        kinds: dict[str, dict[str, int]] = {d: {} for d in DEFECTS}
        jobs = [(i, case.defect) for i, case in enumerate(CASES)] + [(-1, "full disk")]
        for index, defect in jobs:
            row = rows[defect]
            start = time.perf_counter()
            folder = tmp / f"hostile2-case-{index}"
            out = tmp / f"hostile2-case-{index}.json"
            proc = _CTX.Process(target=_child, args=(index, str(folder), template, str(out)))
            proc.start()
            proc.join(TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
                result = {"attempts": 1, "issues": [("hang", f"{CASES[index].label if index >= 0 else defect}")]}
            elif not out.exists():
                result = {"attempts": 1, "issues": [("traceback", f"case {index}: the child died ({proc.exitcode})")]}
            else:
                result = json.loads(out.read_text())
            shutil.rmtree(folder, ignore_errors=True)
            issues = result["issues"]
            row.tried += result["attempts"]
            row.survived += max(0, result["attempts"] - len(issues))
            row.wrong += len(issues)
            for kind, what in issues:
                kinds[defect][kind] = kinds[defect][kind] + 1 if kind in kinds[defect] else 1
                row.notes.append(what)
            row.seconds += time.perf_counter() - start
        cases = {d: sum(c.defect == d for c in CASES) for d in DEFECTS}
        cases["full disk"] = 1
        for defect, row in rows.items():
            counts = kinds[defect]
            plural = "" if cases[defect] == 1 else "s"
            row.notes.insert(0, f"{cases[defect]} case{plural} x every consumer; outside {counts.get('outside', 0)}, "
                                f"wrong data {counts.get('wrong data', 0)}, tracebacks {counts.get('traceback', 0)}, "
                                f"unclear {counts.get('unclear', 0)}, broken {counts.get('broken', 0)}, "
                                f"hangs {counts.get('hang', 0)}")
    return list(rows.values())
