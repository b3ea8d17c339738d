"""Install metadata: the extras resolve next to a CUDA torch that pins its own triton (issue 14 item 1).

These run pip's real resolver (``pip install --dry-run --report``) against PyPI with this project's
metadata, built by setuptools from pyproject.toml (so a license table setuptools refuses would fail
here too). ``--isolated`` ignores this machine's pip configuration (local CPU wheels, constraints),
so ``torch==2.13.0`` is the PyPI wheel, which on Linux x86_64 is the CUDA build and requires
``triton==3.7.*``. They need PyPI (as ``scripts/_setup_env.sh`` does); the full resolution of the
``test`` extra takes about two minutes, hence ``slow``.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
linux_x86 = pytest.mark.skipif(not (sys.platform == "linux" and platform.machine() == "x86_64"),
                               reason="the CUDA torch wheel that pins triton is the Linux x86_64 one")


def _resolve(tmp_path: Path, *requirements: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    report = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--isolated", "--cert", "/etc/ssl/certs/ca-certificates.crt",
                          "--disable-pip-version-check", "--dry-run", "--ignore-installed", "--quiet",
                          "--report", str(report), *requirements],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path)
    return run, (json.loads(report.read_text()) if report.exists() and run.returncode == 0 else {})


@linux_x86
@pytest.mark.slow
def test_test_and_kernels_extras_resolve_with_cuda_torch_and_its_triton(tmp_path: Path) -> None:
    run, report = _resolve(tmp_path, f"{ROOT}[test,kernels]", "torch==2.13.0")
    assert run.returncode == 0, run.stderr[-3000:]
    versions = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in report["install"]}
    assert versions["torch"] == "2.13.0" and versions["modulelens"] == "0.1.0"
    assert versions["triton"].startswith("3.7."), versions["triton"]  # the triton torch pins, not ours
    assert "safetensors" in versions


@linux_x86
def test_the_old_triton_pin_could_not_be_installed_with_cuda_torch(tmp_path: Path) -> None:
    run, _ = _resolve(tmp_path, "torch==2.13.0", "triton==3.9.0")  # what the test extra used to pin
    assert run.returncode != 0 and "ResolutionImpossible" in run.stderr, run.stderr[-3000:]


def test_pyproject_pins_no_triton_and_uses_an_spdx_license() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    for extra, requirements in project["project"]["optional-dependencies"].items():
        for requirement in requirements:
            if requirement.startswith("triton"):
                assert "==" not in requirement and "<" not in requirement, (extra, requirement)
