"""The trust model (docs/security.md): loading a capture runs no code from it unless trusted.

Hostile captures are real captures whose metadata was rewritten (stress/hostile.py); the code each
tries to run creates a marker file, so "nothing ran" is checked on disk.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
import warnings
from pathlib import Path

import pytest
from support.child_process import PYTHON, subprocess_env
from typer.testing import CliRunner

import modulelens
from modulelens.format.imports import resolve_import
from modulelens.interfaces.cli import app
from modulelens.repo.trust import TrustPolicy
from stress.hostile import CASES, Case, make_base_capture, plant, probe


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One real capture, copied for each hostile case (capturing once keeps these tests fast)."""
    root = tmp_path_factory.mktemp("pristine") / "repo"
    return root, make_base_capture(modulelens.Repo(root))


@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_hostile_capture_runs_no_code_by_default(pristine: tuple[Path, str], tmp_path: Path, case: Case) -> None:
    shutil.copytree(pristine[0], tmp_path / "repo")
    repo, ref = modulelens.Repo(tmp_path / "repo"), pristine[1]
    marker = tmp_path / "marker"
    plant(repo, ref, case, marker)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcome = probe(repo, ref, marker)
    assert not outcome.executed
    assert outcome.unexpected == []
    assert any(e.startswith(case.refused_with) for e in outcome.errors), outcome.errors


def test_untrusted_stored_source_error_says_how_to_trust(repo: modulelens.Repo, tmp_path: Path) -> None:
    case = next(c for c in CASES if c.label == "stored source: class body")
    ref = make_base_capture(repo)
    plant(repo, ref, case, tmp_path / "marker")
    with pytest.raises(modulelens.UntrustedCodeError, match=r"trust_source=True.*--trust-source.*modulelens trust"):
        _ = modulelens.load(ref, repo=repo).module


def test_stored_source_runs_when_trusted(repo: modulelens.Repo, tmp_path: Path) -> None:
    for case in (c for c in CASES if c.runs_with_trust):
        marker = tmp_path / f"marker-{len(case.label)}-{case.label[-4:]}"
        ref = make_base_capture(repo, name=f"trusted{len(list(tmp_path.iterdir()))}")
        plant(repo, ref, case, marker)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            probe(repo, ref, marker, trust_source=True)
        assert marker.exists(), case.label  # trusted: the definitions, class bodies included, run


def test_repo_trust_setting_is_bound_to_the_directory(repo: modulelens.Repo, tmp_path: Path) -> None:
    assert repo.trust_source is False
    result = CliRunner().invoke(app, ["trust", "--repo", str(repo.root), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["result"]["trust_source"] is True
    assert modulelens.Repo(repo.root).trust_source is True
    copy = tmp_path / "copied"
    shutil.copytree(repo.root, copy)  # a repo that arrives from elsewhere brings no trust along
    assert (copy / "trust.json").exists() and modulelens.Repo(copy).trust_source is False
    repo.trust_source = False
    assert modulelens.Repo(repo.root).trust_source is False


def test_load_resolves_one_trust_policy_from_argument_object_and_setting(repo: modulelens.Repo, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The order load() decides in (repo/trust.py): its argument, then ``Repo(..., trust_source=True)``,
    then the directory's setting; your signatures count only in a repo that is a directory."""
    ref = make_base_capture(repo)
    assert repo.trust_policy() == TrustPolicy(stored_source=False, own_repo=repo.root)
    assert modulelens.load(ref, repo=repo).trust_source is False
    assert modulelens.load(ref, repo=repo, trust_source=True).trust_source is True
    assert modulelens.Repo(repo.root, trust_source=True).trust_policy().stored_source is True
    repo.trust_source = True  # the setting, bound to the directory
    assert modulelens.load(ref, repo=repo.root).trust_source is True
    assert modulelens.load(ref, repo=repo.root, trust_source=False).trust_source is False  # the argument wins
    policy = repo.trust_policy()
    assert policy.provenance(*modulelens.Repo(repo.root).resolve(ref), repo.read_metadata(*repo.resolve(ref))).own
    repo.trust_source = False
    monkeypatch.setenv("MODULELENS_CACHE", str(tmp_path / "cache"))
    remote = modulelens.Repo("memory://trust-policy")
    assert remote.trust_policy() == TrustPolicy(stored_source=False, own_repo=None)
    assert remote.trust_policy().provenance("x", 1, {}).why == "it is not in a local repo"
    with pytest.raises(modulelens.RemoteRepoError, match="cannot be marked trusted"):
        remote.trust_source = True
    assert modulelens.Repo("memory://trust-policy", trust_source=True).trust_policy().stored_source is True


def test_run_source_is_a_deprecated_alias(repo: modulelens.Repo) -> None:
    ref = make_base_capture(repo)
    with pytest.warns(DeprecationWarning, match="trust_source"):
        cap = modulelens.load(ref, repo=repo, run_source=True)
    assert cap.replay().passed


def test_show_works_on_a_hostile_capture(repo: modulelens.Repo, tmp_path: Path) -> None:
    ref = make_base_capture(repo)
    marker = tmp_path / "marker"
    plant(repo, ref, CASES[0], marker)
    result = CliRunner().invoke(app, ["show", ref, "--repo", str(repo.root), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["result"]["module_class"] == "os:system" and not marker.exists()


def test_allowed_kinds() -> None:
    import torch

    assert resolve_import("torch.nn.modules.linear:Linear", "module") is torch.nn.Linear
    assert resolve_import("torch:relu") is torch.relu
    assert resolve_import("builtins:float") is float
    for path, kind in (("torch:relu", "module"), ("builtins:eval", "value"), ("torch:load", "value"),
                       ("collections:OrderedDict", "node"), ("torch.nn.modules.linear:Linear", "node")):
        if kind == "node" and path.startswith("collections"):
            assert resolve_import(path, "node") is __import__("collections").OrderedDict
            continue
        with pytest.raises(modulelens.UntrustedCodeError):
            resolve_import(path, kind)  # type: ignore[arg-type]


IMPORT_EVIL = """
import sys, warnings
import modulelens
warnings.simplefilter("ignore")
repo = modulelens.Repo(sys.argv[1])
try:
    modulelens.load(sys.argv[2], repo=repo).module
    print("LOADED")
except modulelens.RestoreError as error:
    print("REFUSED", type(error).__name__, error)
"""

EVIL_MODULE = """
open({marker!r}, "w").close()
import torch
class Evil(torch.nn.Linear):
    pass
"""


@pytest.mark.parametrize("where", ["cwd", "repo"])
def test_nothing_is_imported_from_the_current_directory_or_the_repo(repo: modulelens.Repo, tmp_path: Path,
                                                                   where: str) -> None:
    ref = make_base_capture(repo)
    marker = tmp_path / "marker"
    folder = tmp_path / "work" if where == "cwd" else repo.root
    folder.mkdir(exist_ok=True)
    (folder / "evil_local.py").write_text(EVIL_MODULE.format(marker=str(marker)))
    name, version = repo.resolve(ref)
    path = repo.version_path(name, version) / "capture.json"
    meta = json.loads(path.read_text())
    meta["module"]["class"] = meta["constructions"][meta["module"]["construction"]]["class"] = "evil_local:Evil"
    path.write_text(json.dumps(meta))
    env = subprocess_env()
    if where == "repo":
        env["PYTHONPATH"] += f":{repo.root}"  # even when the repo is on the path
    ran = subprocess.run([PYTHON, "-c", textwrap.dedent(IMPORT_EVIL), str(repo.root), ref], cwd=tmp_path / "work"
                         if where == "cwd" else tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "REFUSED" in ran.stdout, ran.stdout + ran.stderr
    assert "never imports from" in ran.stdout and not marker.exists()


def test_hostile_provenance_is_refused_without_running_code(tmp_path: Path) -> None:
    """The stress row of stress/hostile_trust.py: forged, lifted, copied, moved and other-key
    signatures, a rewritten source blob, modules planted in the current folder or the repo; each
    refused for its own reason, in real ``python -c`` children, and no marker file written."""
    from stress.hostile_trust import hostile_trust_row

    row = hostile_trust_row(tmp_path)
    assert row.tried >= 13 and row.executed == 0 and row.clean, row.notes
