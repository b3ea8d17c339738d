"""Fidelity suite: 40+ real module types captured inside running models, replayed bit-exact in a
fresh process.

All scenarios (tests/support/fidelity_models.py) are captured here into one repo; then ONE subprocess
(tests/support/fidelity_replay.py) loads and replays every capture and reports per module type. The
summary line is written to ``build/fidelity.txt`` for the README.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import modulelens

pytest.importorskip("transformers")

import fidelity_models

HERE = Path(__file__).resolve().parent.parent / "support"
PACKAGE_ROOT = Path(modulelens.__file__).resolve().parent.parent
SUMMARY = PACKAGE_ROOT / "build" / "fidelity.txt"
LABELS = fidelity_models.labels()


def _capture_all(repo: Path) -> dict[str, str]:
    refs: dict[str, str] = {}
    with modulelens.track_init():
        for scenario in fidelity_models.SCENARIOS:
            torch.manual_seed(0)
            model = scenario.build().train(scenario.train)
            with warnings.catch_warnings():
                warnings.simplefilter("error", modulelens.CaptureWarning)  # a dropped target fails here
                with modulelens.capture(model, targets=list(scenario.targets.values()), repo=repo, name=f"fidelity/{scenario.name}",
                                        strict=True, record=modulelens.Recording(max_calls=scenario.max_calls)) as cap:
                    scenario.drive(model)
            saved = {info.name: info.ref for info in cap.saved}
            for label, pattern in scenario.targets.items():
                root = pattern == type(model).__name__  # the whole model, targeted by its class name
                refs[label] = saved[f"fidelity/{scenario.name}" if root else f"fidelity/{scenario.name}/{pattern}"]
    return refs


@pytest.fixture(scope="module")
def fidelity(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fidelity")
    refs = _capture_all(root / "repo")
    manifest = root / "manifest.json"
    manifest.write_text(json.dumps(refs))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PACKAGE_ROOT), str(HERE)]), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(HERE / "fidelity_replay.py"), str(root / "repo"), str(manifest)],
        capture_output=True, text=True, env=env, cwd=root, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_replay_process_is_fresh(fidelity: dict[str, Any]) -> None:
    assert fidelity["preloaded"] == []  # nothing of the models was imported before loading


@pytest.mark.parametrize("label", LABELS)
def test_module_type_replays_bit_exact(fidelity: dict[str, Any], label: str) -> None:
    result = fidelity["results"][label]
    assert result["status"] == "PASS", result.get("error") or result.get("report")
    assert result["mode"] == "bit-exact"
    assert result["tensor_leaves"] >= 1  # real tensors were compared, not just structure
    assert label.rpartition(".")[2] in result["class"]


@pytest.mark.parametrize("label", fidelity_models.cache_labels())
def test_cached_decode_replays_with_its_cache(fidelity: dict[str, Any], label: str) -> None:
    """Caches on (transformers' default): the prefill and the decode step(s) both replay, and the
    cache each call changed in place is compared after the call, not only the output."""
    result = fidelity["results"][label]
    assert result["unrecorded"] == []
    assert result["calls"] >= 2
    assert result["mutated_leaves"] >= 2  # keys and values of at least one cache layer, after the call


def test_fidelity_summary(fidelity: dict[str, Any]) -> None:
    results = fidelity["results"]
    passed = sorted(label for label, r in results.items() if r["status"] == "PASS" and r["mode"] == "bit-exact")
    line = f"fidelity: {len(passed)}/{len(LABELS)} module types replay bit-exact in a fresh process"
    SUMMARY.parent.mkdir(exist_ok=True)
    SUMMARY.write_text(line + "\n" + "\n".join(f"  {label}" for label in passed) + "\n")
    print(line)
    assert len(LABELS) >= 30
    assert len(set(LABELS)) == len(LABELS)
    assert len(passed) == len(LABELS), sorted(set(LABELS) - set(passed))
