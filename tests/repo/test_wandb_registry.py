"""W&B Registry conversion, offline (no W&B server can be reached from the tests): a real capture
becomes an artifact (files, manifest, metadata, aliases), is logged in offline mode into a run
directory, and the artifact's files come back into a repo as a loadable version."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import modulelens
from modulelens.errors import UsageError
from modulelens.repo.packs import referenced_blobs
from modulelens.repo.wandb_registry import (
    ARTIFACT_TYPE,
    WandbTarget,
    build_artifact,
    import_artifact_dir,
    import_downloaded,
    push_to_wandb,
)

# wandb's artifact code may start multiprocessing's resource tracker (a process) in the first test that uses it
pytestmark = pytest.mark.subprocess


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


@pytest.mark.subprocess  # wandb.init starts W&B's service process, inside push_to_wandb where no tier rule sees it
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


def _download_layout(artifact: object, directory: Path) -> Path:
    """The artifact's files where ``Artifact.download()`` puts them: each manifest path under ``directory``."""
    for path, entry in artifact.manifest.entries.items():
        (directory / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(entry.local_path, directory / path)
    return directory


def test_load_and_show_by_wandb_url_from_a_downloaded_artifact(source: modulelens.Repo, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``wandb://ENTITY/PROJECT/COLLECTION:alias`` resolves into the cache; after one import (the
    step that follows ``artifact.download()``), load and ``show`` work from the cache alone."""
    from typer.testing import CliRunner

    from modulelens.interfaces.cli import app

    monkeypatch.setenv("MODULELENS_CACHE", str(tmp_path / "cache"))
    artifact, aliases = build_artifact(source, "ranker/0:golden", tmp_path / "stage")
    url = "wandb://team/wandb-registry-model/ranker:golden"
    repo, ref = import_downloaded(_download_layout(artifact, tmp_path / "dl"), url[len("wandb://"):], artifact.digest,
                                  tuple(aliases))
    assert ref == "ranker/0:v1" and repo.root == tmp_path / "cache" / "wandb" / "repo"
    monkeypatch.setenv("MODULELENS_OFFLINE", "1")
    loaded = modulelens.load(url)
    assert loaded.replay().passed
    assert torch.equal(loaded.state_dict()["weight"], modulelens.load("ranker/0:v1", repo=source).state_dict()["weight"])
    shown = CliRunner().invoke(app, ["show", url, "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["result"]["ref"] == "ranker/0:v1"
    unknown = CliRunner().invoke(app, ["replay", "wandb://team/wandb-registry-model/ranker:other", "--json"])
    assert unknown.exit_code != 0 and "was never loaded on this machine" in json.loads(unknown.stdout)["error"]["message"]


def test_wandb_url_without_network_or_sdk_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No server is reachable from the tests: W&B's own client, pointed at a closed loopback port
    (and, separately, without an API key), fails, and so does a Python without the SDK."""
    monkeypatch.setenv("MODULELENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no W&B settings
    monkeypatch.delenv("MODULELENS_OFFLINE", raising=False)
    url = "wandb://team/wandb-registry-model/ranker:golden"
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(modulelens.RemoteRepoError, match=r"cannot fetch wandb://.*No API key configured"):
        modulelens.load(url)
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(modulelens.RemoteRepoError, match=r"cannot fetch wandb://.*127\.0\.0\.1:9") as error:
        modulelens.load(url)
    assert "\n" not in str(error.value)
    code = ("import sys; sys.modules['wandb'] = None\nimport modulelens\n"
            f"try:\n    modulelens.load({url!r})\nexcept modulelens.ModulelensError as e:\n    print(type(e).__name__, e)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MODULELENS_CACHE": str(tmp_path / "cache")})
    assert done.stdout.strip() == ("MissingDependencyError the W&B Registry needs the wandb SDK: "
                                   "pip install 'modulelens[wandb]'"), done.stderr
