"""A capture written by modulelens 0.1 (format 1, repo layout 1) must load and replay forever.

``golden_v1/repo`` is a whole repo as 0.1 wrote it — metadata, blobs, an alias — made once by
``golden_v1/make_golden.py`` and never regenerated: its bytes are pinned below, so a change to the
reader that breaks what users already stored fails here instead of in their hands.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import blake3
import pytest
import torch

import modulelens

GOLDEN = Path(__file__).resolve().parent / "golden_v1"
CAPTURE_JSON = GOLDEN / "repo" / "names" / "golden" / "versions" / "1" / "capture.json"
CAPTURE_JSON_BLAKE3 = "276627feb2802092e33cd317f946e26a6c135ff059e2924d9fd6cc3bab4f18d4"


@pytest.fixture
def golden_repo(tmp_path: Path) -> Path:
    """A private copy: loading may write verification markers, and the tree stays untouched."""
    root = tmp_path / "repo"
    shutil.copytree(GOLDEN / "repo", root)
    return root


def test_golden_files_are_unchanged() -> None:
    assert blake3.blake3(CAPTURE_JSON.read_bytes()).hexdigest() == CAPTURE_JSON_BLAKE3


def test_golden_v1_loads_and_replays_bit_exact(golden_repo: Path) -> None:
    expected = json.loads((GOLDEN / "expected.json").read_text())
    cap = modulelens.load("golden:stable", repo=golden_repo)
    assert cap.ref == "golden:v1"
    assert type(cap.module) is torch.nn.Sequential
    assert sorted(cap.state_dict(0)) == expected["state_keys"]
    for call, want in zip(cap.calls, expected["calls"], strict=True):
        assert call.training == want["training"]
        assert call.args[0].tolist() == want["input"]
        assert call.output.tolist() == want["output"]
    report = cap.replay()
    assert report.passed, report
    # 0.1 did not note the CPU kernels that recorded: within tolerance (bit-exact only on the same)
    assert report.mode == "tolerance" and any("which CPU kernels" in note for note in report.notes), report
    assert [c.status for c in report.calls] == ["pass", "pass"]


def test_golden_v1_lists_with_its_alias(golden_repo: Path) -> None:
    [info] = modulelens.Repo(golden_repo).list()
    assert (info.name, info.version, "stable" in info.aliases) == ("golden", 1, True)
