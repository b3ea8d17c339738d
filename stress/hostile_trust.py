"""Hostile provenance and import locations: what the "your own captures" trust (docs/security.md)
must refuse.

A capture of your own may import its module from the current folder (the very file it recorded)
and run its stored source without ``modulelens trust``. Each case here tries to get code run
through that door without being the user's own capture of that file: a forged or copied
signature, one made with another key, a signed capture copied to another repo or moved inside
one, a stored source blob changed after the save, a module planted in the current folder (with or
without a signature, shadowing the user's ``PYTHONPATH``), a ``PYTHONPATH`` entry pointing into
the repo. The code each would run creates a marker file, so "executed" is a fact on disk.

Loads run in real ``python -c`` children started in the attacker's folder (``''`` first on
``sys.path``, as in IPython), with the user's key (``XDG_CONFIG_HOME``) and the case's
``PYTHONPATH``; the child does what a user does (module, calls, replay) and reports refusals.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import modulelens
from modulelens.format.provenance import PROVENANCE_FIELD, field_lines, seal, user_key
from modulelens.repo.trust import repo_identity
from stress.hostile import make_base_capture
from stress.table import Row

PLANTED = '''open({marker!r}, "w").close()
import torch
class Evil(torch.nn.Linear):
    pass
'''
EVIL_SOURCE = '''import torch
class Evil(torch.nn.Linear):
    open({marker!r}, "w").close()
'''

# Each item of $TRUST_JOB: load, build the module, decode the calls, replay; one JSON line out.
PROBE = '''
import json, os, warnings
import modulelens
warnings.simplefilter("ignore")
out = {}
for item in json.loads(os.environ["TRUST_JOB"]):
    steps = []
    try:
        cap = modulelens.load(item["ref"], repo=item["repo"])
        cap.module
        [(c.args, c.output) for c in cap.calls]
        steps.append("loaded, replay passed" if cap.replay().passed else "loaded, replay failed")
    except modulelens.ModulelensError as error:
        steps.append("refused: " + type(error).__name__ + ": " + str(error))
    except Exception as error:
        steps.append("unexpected: " + type(error).__name__ + ": " + str(error)[:300])
    out[item["label"]] = steps
print("RESULT " + json.dumps(out))
'''


@dataclass
class Case:
    label: str
    repo: modulelens.Repo
    ref: str
    marker: Path
    because: str  # the refusal must say this: a refusal for another reason means the case tests nothing
    pythonpath: str = ""  # the child's PYTHONPATH


@contextlib.contextmanager
def as_user(config: Path) -> Iterator[None]:
    """Save as the user whose key lives under ``config`` (the children load as that user too)."""
    before = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(config)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("XDG_CONFIG_HOME", None)
        else:
            os.environ["XDG_CONFIG_HOME"] = before


def _capture_file(repo: modulelens.Repo, ref: str) -> Path:
    return repo.version_path(*repo.resolve(ref)) / "capture.json"


def _rewrite(repo: modulelens.Repo, ref: str, change: Callable[[dict[str, Any]], None]) -> None:
    path = _capture_file(repo, ref)
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


def _names_module(module: str, recorded: Path, text: str | None = None) -> Callable[[dict[str, Any]], None]:
    """The module class becomes ``module:Evil``, recorded as defined in ``recorded`` (with ``text``
    stored inline as its source, when given)."""
    def change(meta: dict[str, Any]) -> None:
        path = f"{module}:Evil"
        meta["module"]["class"] = path
        meta["constructions"][meta["module"]["construction"]]["class"] = path
        meta["sources"] = {module: {"file": str(recorded), "hash": None, "classes": {"Evil": {"hash": None}},
                                    **({"text": text} if text is not None else {})}}
        if text is not None:
            from modulelens.format.sources import source_hash

            meta["sources"][module]["hash"] = source_hash(text)
    return change


def _signed(repo: modulelens.Repo, key: bytes, identity_of: Path | None = None) -> Callable[[dict[str, Any]], None]:
    """Sign the (already changed) metadata with ``key`` for the repo at ``identity_of`` (default: its own)."""
    def change(meta: dict[str, Any]) -> None:
        meta[PROVENANCE_FIELD] = seal(field_lines(meta), repo_identity(identity_of or repo.root), key)
    return change


def _capture(repo: modulelens.Repo, name: str, *changes: Callable[[dict[str, Any]], None]) -> str:
    ref = make_base_capture(repo, name)
    for change in changes:
        _rewrite(repo, ref, change)
    return ref


def _cases(tmp: Path, config: Path) -> tuple[list[Case], Path]:
    """The cases, and the attacker's folder the children run in."""
    here = tmp / "attacker-folder"  # where the user runs python/IPython: files planted here
    project = tmp / "user-project"  # where the user's own module really is (not on any path here)
    here.mkdir()
    project.mkdir()
    key = user_key(create=True)
    other_key = os.urandom(32)
    repo = modulelens.Repo(tmp / "trust-repo")
    cases: list[Case] = []

    def plant(folder: Path, module: str) -> Path:
        marker = tmp / f"marker-{module}"
        (folder / f"{module}.py").write_text(PLANTED.format(marker=str(marker)))
        return marker

    # unsigned, module planted in the current folder, no PYTHONPATH
    marker = plant(here, "planted_unsigned")
    cases.append(Case("planted module in the current folder, no PYTHONPATH",
                      repo, _capture(repo, "unsigned", _names_module("planted_unsigned", here / "planted_unsigned.py"),
                                     lambda m: m.pop(PROVENANCE_FIELD)), marker, "it has no provenance"))
    # the user's own capture recorded its module elsewhere: a same-named file here is not it
    marker = plant(here, "planted_elsewhere")
    cases.append(Case("own capture, a same-named module planted in the current folder",
                      repo, _capture(repo, "elsewhere", _names_module("planted_elsewhere", project / "planted_elsewhere.py"),
                                     _signed(repo, key)), marker, "in the current directory"))
    # forged: the user's key id with a made-up MAC
    marker = plant(here, "planted_forged")
    ref = _capture(repo, "forged", _names_module("planted_forged", here / "planted_forged.py"), _signed(repo, key))
    _rewrite(repo, ref, lambda m: m[PROVENANCE_FIELD].update(mac="0" * 64))
    cases.append(Case("forged signature (the user's key id, a made-up MAC)", repo, ref, marker, "signature does not match"))
    # a provenance field of the wrong shape: a MAC compare_digest cannot take
    marker = plant(here, "planted_oddmac")
    ref = _capture(repo, "oddmac", _names_module("planted_oddmac", here / "planted_oddmac.py"), _signed(repo, key))
    _rewrite(repo, ref, lambda m: m[PROVENANCE_FIELD].update(mac="\u00e9" * 64, repo=["not", "a", "path"]))
    cases.append(Case("provenance with a non-ASCII MAC", repo, ref, marker, "not one this modulelens signs"))
    # a genuine provenance lifted from another capture of the same repo
    marker = plant(here, "planted_lifted")
    genuine = json.loads(_capture_file(repo, cases[1].ref).read_text())[PROVENANCE_FIELD]
    cases.append(Case("provenance copied from another of the user's captures",
                      repo, _capture(repo, "lifted", _names_module("planted_lifted", here / "planted_lifted.py"),
                                     lambda m: m.update({PROVENANCE_FIELD: genuine})), marker,
                      "signature does not match"))
    # signed with another user's key, for this very repo
    marker = plant(here, "planted_otherkey")
    cases.append(Case("signature from another key", repo, _capture(
        repo, "otherkey", _names_module("planted_otherkey", here / "planted_otherkey.py"), _signed(repo, other_key)),
        marker, "signed with another key"))
    # stored source carried by a capture signed with another key
    marker = tmp / "marker-stored-source"
    cases.append(Case("stored source signed with another key", repo, _capture(
        repo, "storedother", _names_module("gone_module", project / "gone_module.py",
                                           EVIL_SOURCE.format(marker=str(marker))), _signed(repo, other_key)), marker,
        "signed with another key"))
    # a capture signed for repo A, copied (with everything) into repo B
    marker = plant(here, "planted_copied")
    origin = modulelens.Repo(tmp / "trust-repo-origin")
    ref = _capture(origin, "copied", _names_module("planted_copied", here / "planted_copied.py"), _signed(origin, key))
    copy = modulelens.Repo(tmp / "trust-repo-copy")
    origin.push(ref, copy)
    cases.append(Case("signed capture pushed into another repo", copy, ref, marker, "signed for another repo"))
    # moved inside the repo: v1's signed capture.json put where v2 is
    marker = plant(here, "planted_moved")
    ref = _capture(repo, "moved", _names_module("planted_moved", here / "planted_moved.py"), _signed(repo, key))
    second = make_base_capture(repo, "moved")
    _capture_file(repo, second).write_bytes(_capture_file(repo, ref).read_bytes())
    _rewrite(repo, ref, lambda m: m["tags"].append("edited"))  # and v1 itself edited: not yours either
    cases.append(Case("signed capture moved to another version", repo, second, marker, "not where it is now"))
    cases.append(Case("signed capture with edited metadata", repo, ref, marker, "signature does not match"))
    # the user's own stored source, its blob rewritten after the save (the metadata untouched)
    cases.append(_tampered_source_blob(tmp, project))
    # a PYTHONPATH entry pointing into the repo, with and without a signature
    for signed in (False, True):
        module = f"planted_inrepo_{'signed' if signed else 'unsigned'}"
        marker = plant(repo.root, module)
        changes = [_names_module(module, repo.root / f"{module}.py"), *([_signed(repo, key)] if signed else [])]
        cases.append(Case(f"PYTHONPATH entry pointing into the repo ({'signed' if signed else 'unsigned'})",
                          repo, _capture(repo, module.replace("_", "-"), *changes), marker, "inside the repo",
                          pythonpath=str(repo.root)))
    # the user's PYTHONPATH names the project, but '' finds a planted file of the same name first
    marker = plant(here, "shadowed")
    (project / "shadowed.py").write_text("import torch\nclass Evil(torch.nn.Linear):\n    pass\n")
    cases.append(Case("module planted in the current folder shadowing the user's PYTHONPATH", repo, _capture(
        repo, "shadowed", _names_module("shadowed", here / "shadowed.py")), marker, "in the current directory",
        pythonpath=str(project)))
    return cases, here


def _tampered_source_blob(tmp: Path, project: Path) -> Case:
    """A capture of the user's own, saved for real, whose module then is not on the path: its
    class comes from the source stored with it (a blob). After the save the bytes of that source
    in the repo's blob or pack are replaced by code of the same length (the metadata untouched)."""
    import importlib

    import torch

    repo = modulelens.Repo(tmp / "trust-repo-blob")
    marker = tmp / "marker-blob"
    evil = f"import torch\nclass Evil(torch.nn.Linear):\n    open({str(marker)!r}, 'w').close()\n"
    honest = "import torch\nclass Evil(torch.nn.Linear):\n    pass\n"
    honest += "#" * (len(evil) - len(honest))
    (project / "blob_module.py").write_text(honest)
    sys.path.insert(0, str(project))
    handle = modulelens.track_init()
    try:
        model = torch.nn.Sequential(importlib.import_module("blob_module").Evil(4, 4))
        with modulelens.capture(model, targets=["0"], repo=repo, name="blob", strict=True) as cap:
            model(torch.randn(2, 4))
    finally:
        handle.stop()
        sys.path.remove(str(project))
        sys.modules.pop("blob_module", None)
    for path in (repo.root / "blobs").rglob("*"):
        if path.is_file() and honest.encode() in (data := path.read_bytes()):
            os.chmod(path, 0o644)
            path.write_bytes(data.replace(honest.encode(), evil.encode()))
    return Case("own capture, stored source blob rewritten after the save", repo, cap.saved[0].ref, marker,
                "is corrupted|hash differs")


def _probe(cases: list[Case], cwd: Path, config: Path, pythonpath: str) -> dict[str, list[str]]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MODULELENS_REPO")}
    env.update(XDG_CONFIG_HOME=str(config), OMP_NUM_THREADS="1",
               TRUST_JOB=json.dumps([{"label": c.label, "repo": str(c.repo.root), "ref": c.ref} for c in cases]))
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    ran = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    line = next((x for x in ran.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        tail = (ran.stderr or ran.stdout)[-300:].replace("\n", " ")
        return {c.label: [f"unexpected: the child failed (exit {ran.returncode}): {tail}"] for c in cases}
    return json.loads(line[len("RESULT "):])


def hostile_trust_row(tmp: Path) -> Row:
    """Every case, loaded by the user in the attacker's folder: 0 executed, each refused cleanly."""
    row = Row("hostile provenance: forged/copied/other-key signatures, planted modules, PYTHONPATH into the repo")
    start = time.perf_counter()
    base = tmp / "hostile-trust"
    base.mkdir()
    config = base / "user-config"
    with as_user(config):
        cases, here = _cases(base, config)
    for pythonpath in dict.fromkeys(c.pythonpath for c in cases):
        group = [c for c in cases if c.pythonpath == pythonpath]
        outcomes = _probe(group, here, config, pythonpath)
        for case in group:
            steps = outcomes.get(case.label, ["unexpected: no outcome"])
            row.tried += 1
            executed = case.marker.exists()
            unexpected = [s for s in steps if s.startswith("unexpected")]
            clean = all(s.startswith("refused") and re.search(case.because, s) for s in steps)
            row.executed += executed
            row.wrong += bool(unexpected)
            row.survived += clean and not executed and not unexpected
            if executed or unexpected or not clean:
                why = "" if clean else f"not refused because {case.because!r}: "
                row.notes.append(f"{case.label}: {'EXECUTED; ' if executed else ''}{why}{steps[0][:160]}")
    row.notes.insert(0, f"{row.tried} kinds, each refused with UntrustedCodeError/RestoreError/CorruptCaptureError")
    row.seconds = time.perf_counter() - start
    return row
