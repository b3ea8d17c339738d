"""`kernel verify` judges a recorded output stored shape-only as `verify` does (issue 35 item 4):
shape, dtype and recorded statistics are checked; agreement is UNVERIFIED ("cannot verify: ..."),
never PASS; a candidate that contradicts them FAILS on them (not on a leaf count, which would fail a
correct candidate too). A recorded output that is NaN throughout is UNVERIFIED too (NaN matches
NaN). CPU, Triton kernels under the interpreter."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from kernel_models import LinearRelu
from typer.testing import CliRunner

import modulelens
from modulelens.format.shape_only import ShapeOnly
from modulelens.interfaces.cli import app
from modulelens.kernels.options import CandidatePolicy, KernelChecks
from modulelens.kernels.verify import verify_kernel
from stress.verdict_rows import vacuous_captures

CANDIDATES = Path(__file__).resolve().parent.parent / "support" / "kernel_candidates"
CHECKS = KernelChecks(random_samples=1)
SHAPE_ONLY = "output: stored shape-only: shape, dtype and recorded statistics match; values NOT compared"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed (pip install 'modulelens[kernels]')")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``so/mlp``: a LinearRelu(16, 256) called twice on (4, 16) inputs; its (4, 256) outputs (4 KiB)
    are over ``shape_only_over`` and stored shape-only, its inputs and weights with their values."""
    path = str(tmp_path_factory.mktemp("kernel-shape-only"))
    torch.manual_seed(0)
    with modulelens.track_init():
        model = torch.nn.Sequential(LinearRelu(16, 256)).eval()
    with modulelens.capture(model, targets=["0"], repo=path, name="so/mlp", record=modulelens.Recording(max_calls=2),
                            payload=modulelens.PayloadPolicy(shape_only_over=1024)), torch.no_grad():
        for _ in range(2):
            model[0](torch.randn(4, 16), alpha=2.0)
    capture = modulelens.load("so/mlp/0", repo=path)
    assert all(isinstance(call.output, ShapeOnly) for call in capture.calls)
    assert not isinstance(capture.calls[0].args[0], ShapeOnly)
    return path


def _verify(repo: str, candidate: str) -> dict:
    report = verify_kernel("so/mlp/0", CANDIDATES / candidate, repo=repo, checks=CHECKS,
                           policy=CandidatePolicy(timeout=120), store=False)
    data = report.to_dict()
    assert report.status == data["status"] and report.passed is (data["status"] == "PASS")
    return data


def test_a_correct_kernel_on_a_shape_only_output_is_unverified_not_pass(repo: str) -> None:
    d = _verify(repo, "linear_relu_modelnew.py")
    assert d["status"] == "UNVERIFIED" and d["passed"] is False and d["failures"] == [] and d["failed_checks"] == []
    assert [s["status"] for s in d["samples"]] == ["unverified", "unverified", "pass"]  # the random one has values
    assert d["unverified"] == [f"call {i} (recorded): {SHAPE_ONLY} (none were recorded)" for i in (0, 1)]
    recorded = d["samples"][0]
    assert recorded["expected_from"] == "recorded output" and recorded["leaves"][0]["kind"] == "shape-only"
    assert recorded["reference_vs_recorded"]["passed"] is True  # the reference agrees with the statistics
    assert not any("does not reproduce" in note for note in d["notes"])
    assert d["correctness"]["unverified_samples"] == 2 and d["correctness"]["passed_samples"] == 1


def test_a_zeros_kernel_fails_on_the_recorded_statistics(repo: str) -> None:
    d = _verify(repo, "linear_relu_zeros.py")
    assert d["status"] == "FAIL" and d["unverified"] == [] and "correctness" in d["failed_checks"]
    first = d["failures"][0]
    assert first.startswith("call 0 (recorded): output: stored shape-only, and the values contradict its recorded "
                            "statistics: mean 0 vs recorded")
    assert all("output value(s), expected" not in line for line in d["failures"])  # no leaf-count mismatch
    assert [s["status"] for s in d["samples"]] == ["fail", "fail", "fail"]


def test_cli_says_cannot_verify_and_exits_1(repo: str) -> None:
    runner = CliRunner()
    base = ["kernel", "verify", "so/mlp/0", "--repo", repo, "--random", "1", "--no-store"]
    human = runner.invoke(app, [*base, "--candidate", str(CANDIDATES / "linear_relu_modelnew.py")])
    assert human.exit_code == 1, human.output
    text = " ".join(human.stdout.split())
    assert text.startswith("UNVERIFIED ModelNew (triton)")
    assert f"cannot verify: call 0 (recorded): {SHAPE_ONLY}" in text
    assert text.split("samples", 1)[1].count("UNVERI") == 2  # the two recorded samples' result (the table may cut it)
    as_json = runner.invoke(app, [*base, "--candidate", str(CANDIDATES / "linear_relu_zeros.py"), "--json"])
    result = json.loads(as_json.stdout)["result"]
    assert as_json.exit_code == 1 and result["status"] == "FAIL" and result["passed"] is False


def test_a_recorded_output_of_nan_only_is_unverified_a_wrong_one_fails(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    ref = vacuous_captures(repo)["nan"]
    report = verify_kernel(ref, CANDIDATES / "nan_out.py", repo=repo, checks=CHECKS,
                           policy=CandidatePolicy(timeout=120), store=False)
    assert report.status == "UNVERIFIED" and report.failures == []
    assert report.unverified == ["call 0 (recorded): every recorded output value is NaN or infinite: any candidate "
                                 "that returns them matches"]
    zeros = verify_kernel(ref, CANDIDATES / "nan_out_zeros.py", repo=repo, checks=CHECKS,
                          policy=CandidatePolicy(timeout=120), store=False)
    assert zeros.status == "FAIL" and zeros.unverified == []
    assert zeros.failures[0].startswith("call 0 (recorded): output: ")
