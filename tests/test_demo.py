"""`modulelens demo`, the main job, end to end."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from child_process import PYTHON, subprocess_env

import modulelens


def test_demo_captures_reloads_and_replays(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    result = subprocess.run([PYTHON, "-m", "modulelens", "demo", "--repo", str(repo), "--steps", "8", "--json"],
                            capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)["result"]
    assert sorted(s["name"] for s in out["saved"]) == ["demo/attention", "demo/embeddings", "demo/interaction", "demo/top_mlp"]
    assert out["replay"]["passed"] and out["replay"]["mode"] == "bit-exact"
    assert len(out["replay"]["calls"]) == 2
    for name in ("demo/embeddings", "demo/attention", "demo/interaction"):
        assert modulelens.load(name, repo=repo).replay().passed
