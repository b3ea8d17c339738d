"""The external zoo (issue 11): third-party modules run as their users run them, each target
reloaded in a fresh process and replayed bit-exact.

Per group, one worker process captures (tests/support/zoo_capture.py; timm's torchvision imports
come from tests/support/shims there) and another replays every capture
(tests/support/fidelity_replay.py); scripts without a main guard run unmodified under
``modulelens run``. Every test run covers ``zoo_models.FAST``; the full zoo is ``slow`` (still
run by .ci/run) and writes its ``N/M`` line to ``build/zoo.txt`` for the README.

``KNOWN_FAILURES`` are defects found by the zoo and filed under issue 11 (other items than this
suite's); the full zoo asserts that exactly these fail, with the recorded reason, so a fix or a
new failure both show up here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import modulelens

pytest.importorskip("transformers")

import zoo_models

SUPPORT = Path(__file__).resolve().parent.parent / "support"
PACKAGE_ROOT = Path(modulelens.__file__).resolve().parent.parent
SUMMARY = PACKAGE_ROOT / "build" / "zoo.txt"
SCRIPTS: dict[str, list[str]] = {  # script -> targets, run unmodified under `modulelens run`
    "train_noguard.py": ["Net", "Block"],
    "notebook_export.py": ["TinyAttention"],
}
SCRIPT_LABELS = ["script.train_noguard", "script.train_noguard:blocks.0", "script.train_noguard:blocks.1",
                 "script.notebook_export"]

# label -> text in its error; issue 11 item that owns the defect
KNOWN_FAILURES: dict[str, str] = {}  # every zoo target replays bit-exact (issue 11's defects are fixed)


def _env(group: str) -> dict[str, str]:
    path = [str(PACKAGE_ROOT), str(SUPPORT)]
    if group == "timm":
        # not imported here: timm needs torchvision, which only the worker's shim provides
        assert importlib.util.find_spec("timm") is not None, "timm is installed by scripts/_setup_env.sh"
        path.append(str(SUPPORT / "shims"))  # never for transformers: it would believe torchvision is there
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1"}


def _run(args: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=1800,
                            check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _replay(refs: dict[str, str], repo: Path, env: dict[str, str], root: Path,
            trust_source: bool = False) -> dict[str, dict[str, Any]]:
    manifest = root / f"manifest-{len(list(root.glob('manifest-*')))}.json"
    manifest.write_text(json.dumps(refs))
    options = ["--trust-source"] if trust_source else []
    replayed = _run([str(SUPPORT / "fidelity_replay.py"), str(repo), str(manifest), *options], env, root)
    assert replayed["preloaded"] == []  # a fresh process: nothing of the models imported before loading
    return replayed["results"]


def run_group(group: str, root: Path, only: set[str] | None = None) -> dict[str, dict[str, Any]]:
    """label -> replay result (``status`` "ERROR" with ``error`` when capture already failed)."""
    env, repo = _env(group), root / f"repo-{group}"
    captured = _run([str(SUPPORT / "zoo_capture.py"), group, str(repo), ",".join(sorted(only or []))], env, root)
    results = {label: {"status": "ERROR", "error": error} for label, error in captured["errors"].items()}
    results.update(_replay(captured["refs"], repo, env, root))
    return results


def run_scripts(root: Path) -> dict[str, dict[str, Any]]:
    env, repo = _env("scripts"), root / "repo-scripts"
    for script, targets in SCRIPTS.items():
        name = f"zoo/{Path(script).stem}"
        command = [sys.executable, "-m", "modulelens", "run", *(a for t in targets for a in ("-t", t)),
                   "--repo", str(repo), "--name", name, "--", sys.executable, str(SUPPORT / "zoo_scripts" / script)]
        subprocess.run(command, capture_output=True, text=True, env=env, cwd=root, timeout=600, check=False)
    saved = {info.name: info.ref for info in modulelens.Repo(repo).list()} if repo.exists() else {}
    refs: dict[str, str] = {}
    results: dict[str, dict[str, Any]] = {}
    for label in SCRIPT_LABELS:
        stem, _, target = label.removeprefix("script.").partition(":")
        name = f"zoo/{stem}/{target}" if target else f"zoo/{stem}"
        if name in saved:
            refs[label] = saved[name]
        else:
            results[label] = {"status": "ERROR", "error": f"not saved by `modulelens run` (saved: {sorted(saved)})"}
    # the scripts' classes live in __main__: restoring them runs their stored source, which the
    # loading user must opt into (docs/security.md)
    results.update(_replay(refs, repo, env, root, trust_source=True) if refs else {})
    return results


def _failures(results: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {label: r.get("error") or r.get("report", "") for label, r in results.items()
            if not (r["status"] == "PASS" and r.get("mode") == "bit-exact")}


@pytest.mark.parametrize("group", sorted(zoo_models.FAST))
def test_zoo_fast_subset(group: str, tmp_path: Path) -> None:
    only = set(zoo_models.FAST[group])
    results = run_group(group, tmp_path, only)
    assert set(results) == only
    assert _failures(results) == {}
    assert all(r["tensor_leaves"] >= 1 for r in results.values())


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~5 min alone on 2 cores; more when the machine is shared
def test_zoo_full(tmp_path: Path) -> None:
    results: dict[str, dict[str, Any]] = {}
    for group in zoo_models.GROUPS:
        results.update(run_group(group, tmp_path))
    results.update(run_scripts(tmp_path))
    failures = _failures(results)
    passed = sorted(set(results) - set(failures))
    groups = {label.partition(".")[0] for label in results}
    line = f"zoo: {len(passed)}/{len(results)} targets replay bit-exact in a fresh process"
    SUMMARY.parent.mkdir(exist_ok=True)
    SUMMARY.write_text("\n".join([line, *(f"  FAIL {label}: {error.splitlines()[0][:200]}"
                                          for label, error in sorted(failures.items())),
                                  *(f"  {label}" for label in passed)]) + "\n")
    print(line)
    assert {"timm", "odd", "script"} <= groups and len(results) >= 100
    timm_archs = {label.partition(":")[0] for label in results if label.startswith("timm.")}
    hf_archs = {label.partition(".")[2].partition(":")[0] for label in results if label.startswith("hf-")}
    assert len(timm_archs) >= 15 and len(hf_archs) >= 10
    unexpected = {label: error for label, error in failures.items() if label not in KNOWN_FAILURES}
    assert unexpected == {}
    fixed = sorted(set(KNOWN_FAILURES) - set(failures))
    assert fixed == [], f"these now pass: remove them from KNOWN_FAILURES {fixed}"
    for label, reason in KNOWN_FAILURES.items():
        assert reason in failures[label], (label, failures[label])
