"""A layout-2 repo, on disk and in object storage, as modulelens wrote it before the Store refactor
(issue 24), must list, resolve, load and replay forever.

``golden_v2/repo`` (a local repo) and ``golden_v2/bucket`` (every object of a ``memory://`` repo, by
key) were made once by ``golden_v2/make_golden.py`` and are never regenerated: packs, a 1 MiB
payload in a blob of its own (with its verification marker), two names, several versions, an
alias, a removed version (its tombstone: ``versions/3.removed`` on disk, ``versions/3/removed`` in a
bucket) and a report. Their bytes are pinned below.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import blake3
import fsspec
import pytest
import torch
from torch import nn

import modulelens

GOLDEN = Path(__file__).resolve().parent / "golden_v2"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())
TREE_BLAKE3 = "ab8cd9e2031d5434ace7ae56124b6daeee96d7948982b0c20e88ee030e9422ff"


def _tree_digest() -> str:
    lines = [f"{p.relative_to(GOLDEN).as_posix()} {blake3.blake3(p.read_bytes()).hexdigest()}"
             for p in sorted(GOLDEN.rglob("*")) if p.is_file() and p.parent != GOLDEN]
    return blake3.blake3("\n".join(lines).encode()).hexdigest()


@pytest.fixture
def local_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A private copy: loading writes verification markers and the tests save into it."""
    monkeypatch.setenv("MODULELENS_CACHE", str(tmp_path / "cache"))
    shutil.copytree(GOLDEN / "repo", tmp_path / "repo")
    return str(tmp_path / "repo")


@pytest.fixture
def bucket_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The bucket's objects under a fresh ``memory://`` prefix, read through a fresh cache."""
    monkeypatch.setenv("MODULELENS_CACHE", str(tmp_path / "cache"))
    base = f"golden-v2-{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("memory")
    for path in sorted((GOLDEN / "bucket").rglob("*")):
        if path.is_file():
            fs.pipe_file(f"/{base}/{path.relative_to(GOLDEN / 'bucket').as_posix()}", path.read_bytes())
    return f"memory://{base}"


def test_golden_v2_files_are_unchanged() -> None:
    assert _tree_digest() == TREE_BLAKE3


@pytest.mark.parametrize("where", ["local_copy", "bucket_copy"])
def test_golden_v2_lists_resolves_and_loads(where: str, request: pytest.FixtureRequest) -> None:
    location = request.getfixturevalue(where)
    repo = modulelens.Repo(location, create=False)
    infos = repo.list()
    assert [i.ref for i in infos] == EXPECTED["refs"]
    assert {i.ref: list(i.tags) for i in infos} == EXPECTED["tags"]
    assert {i.ref: i.calls for i in infos} == EXPECTED["calls"]
    assert {i.ref: i.nbytes for i in infos} == EXPECTED["nbytes"]
    assert repo.names() == ["golden/mlp", "other"]
    assert repo.aliases("golden/mlp") == EXPECTED["aliases"]
    assert repo.version_numbers("golden/mlp") == [1, 2, 4]  # v3 was removed
    assert repo.resolve("golden/mlp") == ("golden/mlp", 4)
    assert repo.resolve("golden/mlp:stable") == ("golden/mlp", 2)
    assert [r["ms"] for r in repo.reports("golden/mlp:v2", "profile")] == [1.25]
    for ref in EXPECTED["refs"]:
        cap = modulelens.load(ref, repo=repo, verify=True)
        report = cap.replay()
        assert report.passed, report
    weights = modulelens.load("golden/mlp:stable", repo=repo).state_dict()
    assert weights["0.weight"].shape == (512, 512) and weights["0.weight"].dtype == torch.float32


@pytest.mark.parametrize("where", ["local_copy", "bucket_copy"])
def test_golden_v2_takes_new_versions_past_its_tombstone_and_collects_the_removed_pack(
        where: str, request: pytest.FixtureRequest) -> None:
    location = request.getfixturevalue(where)
    repo = modulelens.Repo(location, create=False)
    fresh = {} if where == "local_copy" else {"grace_s": 0}  # the bucket's objects were all just written
    assert repo.fsck().clean
    assert repo.gc(dry_run=True, **fresh).removed_blobs == 1  # v3's pack: no version references it
    module = nn.Linear(4, 4)
    with modulelens.capture(module, targets="Linear", name="golden/mlp", repo=repo) as cap:
        module(torch.randn(2, 4))
    assert [v.ref for v in cap.wait()] == ["golden/mlp:v5"]  # 3 stays used
    assert repo.gc(**fresh).removed_blobs == 1
    assert [i.ref for i in modulelens.Repo(location).list()] == [*EXPECTED["refs"][:3], "golden/mlp:v5", "other:v1"]
    for ref in EXPECTED["refs"]:
        assert modulelens.load(ref, repo=location, verify=True).replay().passed
