"""W&B Registry conversion, offline (no W&B server can be reached from the tests): a real capture
becomes an artifact (files, manifest, metadata, aliases), is logged in offline mode into a run
directory, and the artifact's files come back into a repo as a loadable version."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import modulelens
from modulelens.errors import UsageError
from modulelens.repo.packs import referenced_blobs
from modulelens.repo.wandb_registry import ARTIFACT_TYPE, WandbTarget, build_artifact, import_artifact_dir, push_to_wandb


@pytest.fixture
def source(tmp_path: Path) -> modulelens.Repo:
    repo = modulelens.Repo(tmp_path / "repo")
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    with modulelens.capture(model, targets=["0"], repo=repo, name="ranker", tags=["nightly"]):
        model(torch.randn(3, 16))
    repo.set_alias("ranker/0:v1", "golden")
    repo.add_report("ranker/0:v1", "profile", {"ms": 0.5})
    return repo


def test_artifact_from_a_capture_has_its_files_metadata_and_aliases(source: modulelens.Repo, tmp_path: Path) -> None:
    artifact, aliases = build_artifact(source, "ranker/0:golden", tmp_path / "stage")
    assert artifact.type == ARTIFACT_TYPE and artifact.name.startswith("ranker--0")
    assert aliases == ["golden"]
    assert artifact.metadata["modulelens_name"] == "ranker/0" and artifact.metadata["modulelens_ref"] == "ranker/0:v1"
    assert artifact.metadata["tags"] == ["nightly"]
    meta = source.read_metadata("ranker/0", 1)
    payloads = {d.partition(":")[2]: n for d, n in referenced_blobs(meta).items()}  # loose payloads and packs
    entries = artifact.manifest.entries
    assert {p: e.size for p, e in entries.items() if p.startswith("blobs/")} == {f"blobs/{h}": n for h, n in payloads.items()}
    assert "capture.json" in entries and any(p.startswith("reports/profile-") for p in entries)

    # The reverse conversion, from the files as the manifest lays them out (what a download gives).
    downloaded = tmp_path / "downloaded"
    for path, entry in entries.items():
        (downloaded / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(entry.local_path, downloaded / path)
    back = modulelens.Repo(tmp_path / "back")
    info = import_artifact_dir(downloaded, back, aliases=tuple(aliases))
    assert info.ref == "ranker/0:v1" and "golden" in info.aliases and info.tags == ("nightly",)
    assert [r["ms"] for r in back.reports("ranker/0:golden", "profile")] == [0.5]
    assert modulelens.load("ranker/0:golden", repo=back).replay().passed
    assert import_artifact_dir(downloaded, back).version == 1  # importing twice adds nothing


def test_offline_push_logs_the_artifact_into_the_run_directory(source: modulelens.Repo, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    result = push_to_wandb(source, "ranker/0:golden", "wandb://team/wandb-registry-model/ranker", work_dir=tmp_path / "w")
    assert result["linked"] is False and result["aliases"] == ["golden"]
    run_files = list((tmp_path / "w" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 1
    deadline = time.monotonic() + 60
    while b"modulelens-capture" not in run_files[0].read_bytes() and time.monotonic() < deadline:
        time.sleep(0.2)  # wandb's service process finishes writing the run file after finish() returns
    record = run_files[0].read_bytes()  # what `wandb sync` will upload: the artifact, its aliases, files
    meta = source.read_metadata("ranker/0", 1)
    assert b"modulelens-capture" in record and b"golden" in record and b'"modulelens_ref":"ranker/0:v1"' in record
    assert all(f"blobs/{d.partition(':')[2]}".encode() in record for d in referenced_blobs(meta))


def test_wandb_urls_are_parsed_strictly() -> None:
    assert WandbTarget.parse("wandb://team/wandb-registry-model/ranker:golden").alias == "golden"
    with pytest.raises(UsageError, match="ENTITY/PROJECT/COLLECTION"):
        WandbTarget.parse("wandb://team/ranker")
