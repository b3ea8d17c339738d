"""Hostile captures: metadata that tries to make loading run code, and a probe that touches
everything a user would (module, call data, replay, ``show``) and reports whether code ran.

Each case edits the metadata of a real capture of a small ``nn.Sequential(nn.Linear)``; the code
it tries to run creates a *marker file*, so "executed" is a fact on disk, not a guess. Used by
``tests/restore/test_trust.py`` and the stress suite (``python -m stress``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import modulelens
from modulelens.errors import ModulelensError
from modulelens.repo.packs import referenced_blobs

Edit = Callable[[dict[str, Any], str], None]


def _py(marker: str) -> str:
    """Python source that creates ``marker`` when it runs."""
    return f"open({marker!r}, 'w').close()"


def _construction(meta: dict[str, Any]) -> dict[str, Any]:
    return meta["constructions"][meta["module"]["construction"]]


def _class_is(path: str) -> Edit:
    def edit(meta: dict[str, Any], marker: str) -> None:
        meta["module"]["class"] = path
        construction = _construction(meta)
        construction["class"] = path
        construction["args"] = [_py(marker)] if path.endswith(("system", "exec", "eval")) else [["touch", marker]]
        construction["kwargs"] = {}
    return edit


def _kwarg(value: Any) -> Edit:
    def edit(meta: dict[str, Any], marker: str) -> None:
        _construction(meta)["kwargs"]["x"] = json.loads(json.dumps(value).replace("MARKER", marker))
    return edit


def _call_arg(value: Any) -> Edit:
    def edit(meta: dict[str, Any], marker: str) -> None:
        meta["calls"][0]["inputs"]["leaves"].append(json.loads(json.dumps(value).replace("MARKER", marker)))
        spec = meta["calls"][0]["inputs"]["spec"]
        spec["children"][0]["children"].append("*")
    return edit


def _partial(func: str, *args: Any) -> dict[str, Any]:
    return {"$type": "codec", "codec": "partial", "class": "functools:partial",
            "value": {"$type": "dict", "items": [["func", {"$type": "import", "path": func}],
                                                 ["args", {"$type": "tuple", "items": list(args)}],
                                                 ["keywords", {"$type": "dict", "items": []}]]}}


def _stored_source(body: str) -> Edit:
    """The module class lives only in stored source whose class body / decorator / default runs code."""
    def edit(meta: dict[str, Any], marker: str) -> None:
        text = textwrap.dedent(body).replace("MARKER", repr(marker))
        meta["module"]["class"] = "evil_captured_module:Evil"
        construction = _construction(meta)
        construction.update({"class": "evil_captured_module:Evil", "args": [], "kwargs": {}})
        meta["sources"] = {"evil_captured_module": {"file": "/nonexistent/evil_captured_module.py", "text": text,
                                                    "hash": "blake3:" + "0" * 64, "classes": {}}}
    return edit


CLASS_BODY = '''
import torch
class Evil(torch.nn.Module):
    open(MARKER, "w").close()
    def __init__(self):
        super().__init__()
'''
DECORATOR = '''
import torch
def mark(cls):
    open(MARKER, "w").close()
    return cls
@mark
class Evil(torch.nn.Module):
    pass
'''
DEFAULT_ARG = '''
import torch
class Evil(torch.nn.Module):
    def __init__(self, x=open(MARKER, "w").close()):
        super().__init__()
'''
MODULE_ASSIGN = '''
import torch
X = list(open(MARKER, "w").close() or [])
class Evil(torch.nn.Module):
    pass
'''


@dataclass(frozen=True)
class Case:
    label: str
    edit: Edit
    runs_with_trust: bool = False  # stored source: trusted, it is meant to run
    # what refuses it: a class or code (the import rules), or a document the format does not allow
    refused_with: tuple[str, ...] = ("UntrustedCodeError", "RestoreError")


CASES: list[Case] = [
    Case("module class os:system", _class_is("os:system")),
    Case("module class posix:system", _class_is("posix:system")),
    Case("module class subprocess:Popen", _class_is("subprocess:Popen")),
    Case("module class builtins:exec", _class_is("builtins:exec")),
    Case("module class builtins:eval", _class_is("builtins:eval")),
    Case("module class importlib:import_module", _class_is("importlib:import_module")),
    Case("module class torch:load", _class_is("torch:load")),
    Case("module class via attribute hop torch:serialization.load", _class_is("torch:serialization.load")),
    Case("module class dunder hop", _class_is("torch.nn:Module.__init__.__globals__")),
    Case("import value os:system", _kwarg({"$type": "import", "path": "os:system"})),
    Case("import value builtins:__import__", _kwarg({"$type": "import", "path": "builtins:__import__"})),
    Case("import value shutil:rmtree", _kwarg({"$type": "import", "path": "shutil:rmtree"})),
    Case("partial of os:system", _kwarg(_partial("os:system", "touch MARKER"))),
    Case("partial of subprocess:call", _kwarg(_partial("subprocess:call", ["touch", "MARKER"]))),
    Case("partial of operator:methodcaller", _kwarg(_partial("operator:methodcaller", "system", "touch MARKER"))),
    Case("namedtuple class subprocess:Popen",
         _kwarg({"$type": "namedtuple", "class": "subprocess:Popen", "items": [["touch", "MARKER"]]})),
    Case("dataclass class builtins:exec",
         _kwarg({"$type": "dataclass", "class": "builtins:exec", "fields": {"$type": "dict", "items": []}})),
    Case("codec enum with class os:system",
         _kwarg({"$type": "codec", "codec": "enum", "class": "os:system", "value": "touch MARKER"})),
    Case("codec enum with a non-enum class",
         _kwarg({"$type": "codec", "codec": "enum", "class": "torch.nn.modules.linear:Linear", "value": 3})),
    Case("call input namedtuple subprocess:Popen",
         _call_arg({"$type": "namedtuple", "class": "subprocess:Popen", "items": [["touch", "MARKER"]]})),
    Case("call input partial of os:system", _call_arg(_partial("os:system", "touch MARKER"))),
    Case("buffers after the call: partial of os:system", lambda meta, marker: meta["calls"][0].update(
        buffers_after={"spec": {"type": "builtins:dict", "context": {"value": ["weight"]}, "children": ["*"]},
                       "leaves": [_partial("os:system", f"touch {marker}")]})),
    Case("pytree node type os:system", lambda meta, marker: meta["calls"][0]["output"].update(
        spec={"type": "os:system", "context": {"value": None}, "children": ["*"]})),
    Case("call setting of os:environ", lambda meta, marker: meta["calls"][0].update(
        settings={"os:environ._state": "touch MARKER"}), refused_with=("CorruptCaptureError",)),
    Case("call setting of a dunder attribute", lambda meta, marker: meta["calls"][0].update(
        settings={"gpytorch.settings:fast_pred_var.__class__": True}), refused_with=("CorruptCaptureError",)),
    Case("codec numpy.generic with a non-numeric class",
         _call_arg({"$type": "codec", "codec": "numpy.generic", "class": "numpy:str_",
                    "value": {"$type": "dict", "items": [["values", 1]]}})),
    Case("codec gymnasium.Box with class os:system",
         _kwarg({"$type": "codec", "codec": "gymnasium.Box", "class": "os:system", "value": "touch MARKER"})),
    Case("stored source: class body", _stored_source(CLASS_BODY), runs_with_trust=True),
    Case("stored source: decorator", _stored_source(DECORATOR), runs_with_trust=True),
    Case("stored source: default argument", _stored_source(DEFAULT_ARG), runs_with_trust=True),
    Case("stored source: module-level call in an assignment", _stored_source(MODULE_ASSIGN)),
]


def make_base_capture(repo: modulelens.Repo, name: str = "victim") -> str:
    """A real capture of ``nn.Sequential(nn.Linear(4, 4))``'s Linear; returns its ref."""
    torch.manual_seed(0)
    handle = modulelens.track_init()  # record the constructor (a no-op when already on)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    finally:
        handle.stop()
    with modulelens.capture(model, targets=["0"], repo=repo, name=name, strict=True) as cap:
        model(torch.randn(2, 4))
    return cap.wait()[0].ref  # a remote repo's version exists once its background upload ended


def plant(repo: modulelens.Repo, ref: str, case: Case, marker: Path) -> None:
    """Rewrite the metadata of ``ref`` with ``case``'s hostile edit."""
    name, version = repo.resolve(ref)
    path = repo.version_path(name, version) / "capture.json"
    meta = json.loads(path.read_text())
    case.edit(meta, str(marker))
    os.chmod(path, 0o644)
    path.write_text(json.dumps(meta))


@dataclass
class Outcome:
    executed: bool
    errors: list[str]  # "Type: message" of each step that was refused
    unexpected: list[str]  # exceptions that are not modulelens errors


def probe(repo: modulelens.Repo, ref: str, marker: Path, *, trust_source: bool | None = None) -> Outcome:
    """Do what a user does with a capture, step by step; record refusals and whether code ran."""
    from modulelens.restore.summary import describe

    errors: list[str] = []
    unexpected: list[str] = []

    def step(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except ModulelensError as error:
            errors.append(f"{type(error).__name__}: {error}")
        except Exception as error:
            unexpected.append(f"{type(error).__name__}: {error}")
        return None

    step(lambda: describe(repo, ref))
    cap = step(lambda: modulelens.load(ref, repo=repo, trust_source=trust_source))
    if cap is not None:
        step(lambda: cap.module)
        step(lambda: cap.init_arguments)
        step(lambda: [(c.args, c.kwargs, c.output, c.mutated_inputs, c.buffers_after) for c in cap.calls])
        step(lambda: cap.replay())
    sys.modules.pop("evil_captured_module", None)
    return Outcome(executed=marker.exists(), errors=errors, unexpected=unexpected)


# ---------------------------------------------------------------------------------- stress rows


def hostile_capture_row(tmp: Path) -> Any:
    """Every hostile capture, loaded with the default (no trust): 0 code executed."""
    import time
    import warnings

    from stress.table import Row

    row = Row("hostile captures (class paths, codec payloads, stored source), default trust")
    start = time.perf_counter()
    repo = modulelens.Repo(tmp / "hostile-repo")
    for i, case in enumerate(CASES):
        ref = make_base_capture(repo, f"h{i}")
        marker = tmp / f"hostile-marker-{i}"
        plant(repo, ref, case, marker)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outcome = probe(repo, ref, marker)
        row.tried += 1
        row.survived += not outcome.unexpected and any(e.startswith(case.refused_with) for e in outcome.errors)
        row.executed += outcome.executed
        row.wrong += bool(outcome.unexpected)
        row.notes.extend(f"{case.label}: {u}" for u in outcome.unexpected[:1])
    row.notes.insert(0, f"{len(CASES)} kinds, each refused with UntrustedCodeError or RestoreError (a setting the "
                        "format does not allow: CorruptCaptureError)")
    row.seconds = time.perf_counter() - start
    return row


def hostile_repo_row(tmp: Path) -> Any:
    """Symlinks planted in a repo and names with traversal: nothing outside the repo is written or deleted."""
    import time

    from stress.table import Row

    row = Row("symlinked blob folders/staging/packs/summaries/aliases/tombstones/versions, names with traversal")
    start = time.perf_counter()
    outside = tmp / "outside"
    outside.mkdir()

    def check(label: str, action: Callable[[], Any], escaped: Callable[[], bool]) -> None:
        row.tried += 1
        error = None
        try:
            action()
        except ModulelensError as refused:
            error = refused
        except Exception as crash:  # not a documented error
            row.wrong += 1
            row.notes.append(f"{label}: {type(crash).__name__}: {crash}")
            return
        if escaped():
            row.wrong += 1
            row.notes.append(f"{label}: escaped the repo" + (f" ({error})" if error else ""))
        else:
            row.survived += 1

    # gc through a symlinked blob folder must not delete the file it points at
    repo = modulelens.Repo(tmp / "symlink-gc")
    make_base_capture(repo)
    victim_dir = outside / "gc"
    victim_dir.mkdir()
    victim = victim_dir / ("ab" * 32)
    victim.write_text("not yours")
    (repo.root / "blobs" / "ab").mkdir(exist_ok=True)
    (repo.root / "blobs" / "ab").rmdir()
    (repo.root / "blobs" / "ab").symlink_to(victim_dir, target_is_directory=True)
    check("gc via a symlinked blob folder", lambda: repo.gc(tmp_age_s=0), lambda: not victim.exists())

    # a save through a symlinked staging folder must not write outside
    repo2 = modulelens.Repo(tmp / "symlink-tmp")
    staging = outside / "staging"
    staging.mkdir()
    os.rmdir(repo2.root / "tmp")
    (repo2.root / "tmp").symlink_to(staging, target_is_directory=True)
    check("save via a symlinked staging folder", lambda: make_base_capture(repo2), lambda: any(staging.iterdir()))

    # a blob that is a symlink to a file outside: a save of the same content must not overwrite it
    repo3 = modulelens.Repo(tmp / "symlink-blob")
    ref = make_base_capture(repo3)
    meta = repo3.read_metadata(*repo3.resolve(ref))
    digest = next(iter(referenced_blobs(meta)))  # a loose payload or a pack: both are blob files
    blob = repo3.blob_path(digest)
    secret = outside / "secret"
    secret.write_bytes(b"secret")
    blob.unlink()
    blob.symlink_to(secret)
    check("save over a symlinked blob", lambda: make_base_capture(repo3), lambda: secret.read_bytes() != b"secret")
    check("load of a symlinked blob", lambda: modulelens.load(ref, repo=repo3).module,
          lambda: secret.read_bytes() != b"secret")

    # links where a pack, a summary, an alias, a tombstone or a version folder should be: listing,
    # loading, saving, rm, gc and fsck --repair must neither read through them nor change the target
    for what in ("pack", "summary", "alias", "tombstone", "version"):
        _planted_link(tmp, outside, what, check)

    repo4 = modulelens.Repo(tmp / "traversal")
    for name in ("../../evil", "a/../../evil", "/abs/evil", "..", "a/./b", "a//b", "x" * 300, "a\x00b"):
        check(f"name {name[:20]!r}", lambda name=name: make_base_capture(repo4, name),
              lambda: any(p.name == "evil" for p in tmp.rglob("evil")))
    row.seconds = time.perf_counter() - start
    return row


def _planted_link(tmp: Path, outside: Path, what: str, check: Callable[..., None]) -> None:
    repo = modulelens.Repo(tmp / f"symlink-{what}")
    ref = make_base_capture(repo)
    repo.set_alias(ref, "golden")
    repo.remove(make_base_capture(repo))  # leaves the tombstone 2.removed
    folder = repo.info(*repo.resolve(ref)).path.parent.parent  # names/<quoted name>
    meta = repo.read_metadata(*repo.resolve(ref))
    target = {"pack": repo.blob_path(meta["packs"][0]["payload"]) if meta.get("packs") else None,
              "summary": folder / "summary.json", "alias": folder / "aliases" / "golden",
              "tombstone": folder / "versions" / "2.removed", "version": folder / "versions" / "1"}[what]
    if target is None:
        return
    victim = outside / f"linked-{what}"
    if target.is_dir():
        shutil.copytree(target, victim)
        shutil.rmtree(target)
    else:
        victim.write_bytes(target.read_bytes())
        target.unlink()
    before = {str(p): p.read_bytes() for p in ([victim] if victim.is_file() else sorted(victim.rglob("*")))
              if p.is_file()}
    target.symlink_to(victim)

    def act() -> None:
        fresh = modulelens.Repo(repo.root)
        fresh.list()
        with contextlib.suppress(ModulelensError):
            _ = modulelens.load(ref, repo=fresh).module  # refused for a linked pack or version folder
        make_base_capture(fresh)
        fresh.gc(tmp_age_s=0)
        if not fresh.fsck(repair=True).clean or not fresh.fsck().clean:
            raise AssertionError("fsck --repair left a problem")

    check(f"symlinked {what}", act, lambda: before != {
        str(p): p.read_bytes() for p in ([victim] if victim.is_file() else sorted(victim.rglob("*"))) if p.is_file()})
