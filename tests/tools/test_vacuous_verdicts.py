"""Verdicts that cannot fail (issue 35, item 4): a verify with nothing real to compare is
UNVERIFIED ("cannot verify: <reason>"), never PASS, in the API, the CLI, ``--json``, MCP and
``assert_matches``; a shape-only output is checked against its recorded statistics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import modulelens
from modulelens.errors import MatchError
from modulelens.format.shape_only import ShapeOnly, tensor_stats
from modulelens.restore.compare import compare, statistics_contradiction
from modulelens.testing import assert_matches
from stress.verdict_rows import NanOut, NoneOut, TensorNotNone, ZerosLinear, ZerosNan, vacuous_captures

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def vacuous(tmp_path_factory: pytest.TempPathFactory) -> tuple[modulelens.Repo, dict[str, str]]:
    repo = modulelens.Repo(tmp_path_factory.mktemp("vacuous"))
    return repo, vacuous_captures(repo)


def _load(vacuous: tuple[modulelens.Repo, dict[str, str]], kind: str) -> modulelens.Capture:
    repo, refs = vacuous
    return modulelens.load(refs[kind], repo=repo)


def test_zeros_against_a_shape_only_output_fail_on_its_recorded_statistics(vacuous) -> None:
    report = modulelens.verify(_load(vacuous, "shape-only"), ZerosLinear, timing=None, store=False)
    assert report.status == "FAIL" and not report.passed and report.unverified == []
    [leaf] = report.calls[0].leaves
    assert leaf.kind == "shape-only" and not leaf.passed and not leaf.compared
    assert "contradict its recorded statistics" in report.failures[0] and "std 0 vs recorded" in report.failures[0]


def test_the_true_module_against_a_shape_only_output_is_unverified_not_pass(vacuous) -> None:
    report = modulelens.verify(_load(vacuous, "shape-only"), torch.nn.Linear, timing=None, store=False)
    assert report.status == "UNVERIFIED" and not report.passed and report.failures == []
    assert report.calls[0].status == "unverified"
    [reason] = report.unverified
    assert reason.startswith("call 0: output: stored shape-only: shape, dtype and recorded statistics match")
    assert "cannot verify: call 0: output: stored shape-only" in str(report)
    assert report.to_dict()["status"] == "UNVERIFIED" and report.to_dict()["unverified"] == [reason]


@pytest.mark.parametrize(("kind", "true", "wrong", "reason"), [
    ("none", NoneOut, TensorNotNone, "the recorded output is None: nothing to compare"),
    ("nan", NanOut, ZerosNan, "every recorded output value is NaN or infinite"),
])
def test_none_and_nan_outputs_prove_nothing(vacuous, kind: str, true: type, wrong: type, reason: str) -> None:
    cap = _load(vacuous, kind)
    report = modulelens.verify(cap, true, timing=None, store=False)
    assert report.status == "UNVERIFIED" and reason in report.unverified[0]
    assert modulelens.verify(cap, wrong, timing=None, store=False).status == "FAIL"
    with pytest.raises(MatchError, match=f"cannot verify {true.__name__} against {cap.ref}: nothing recorded"):
        assert_matches(true, cap)


def test_a_capture_without_calls_cannot_be_verified(vacuous) -> None:
    cap = _load(vacuous, "no calls")
    report = modulelens.verify(cap, torch.nn.Linear, timing=None, store=False)
    assert report.status == "UNVERIFIED" and report.error is None
    assert report.unverified == [f"{cap.ref} has no recorded calls to verify against"]
    with pytest.raises(MatchError, match="has no recorded calls"):
        assert_matches(torch.nn.Linear, cap)


def test_a_call_that_raised_when_recorded_is_unverified_not_failed(vacuous) -> None:
    repo, refs = vacuous
    cap = modulelens.load(refs["nan"], repo=repo)
    cap.calls[0].finished = False  # as a call that raised in the original job is loaded
    report = modulelens.verify(cap, NanOut, timing=None, store=False)
    assert report.status == "UNVERIFIED" and "raised in the original job" in report.unverified[0]


def test_cli_says_cannot_verify_and_exits_1(vacuous) -> None:
    repo, refs = vacuous
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    base = [sys.executable, "-m", "modulelens", "verify", refs["shape-only"], "--repo", repo.location, "--no-timing", "--no-store"]
    human = subprocess.run([*base, "-c", "torch.nn:Linear"], capture_output=True, text=True, env=env, timeout=300)
    assert human.returncode == 1, human.stderr
    assert human.stdout.startswith("UNVERIFIED torch.nn:Linear") and "cannot verify: call 0: output: stored shape-only" in human.stdout
    as_json = subprocess.run([*base, "-c", "stress.verdict_rows:ZerosLinear", "--json"], capture_output=True, text=True,
                             env=env, timeout=300)
    result = json.loads(as_json.stdout)["result"]
    assert as_json.returncode == 1 and result["status"] == "FAIL" and result["calls"][0]["status"] == "fail"


def test_mcp_tool_reports_the_status(vacuous, monkeypatch: pytest.MonkeyPatch) -> None:
    from modulelens.interfaces.mcp_server import verify_in_subprocess

    repo, refs = vacuous
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = verify_in_subprocess(repo.location, refs["none"], "stress.verdict_rows:NoneOut", device=None, dtype=None,
                                  rtol=None, atol=None, timing=False, store=False, timeout_s=300)
    assert result["passed"] is False and result["status"] == "UNVERIFIED"
    assert result["unverified"] == ["call 0: the recorded output is None: nothing to compare"]


def test_statistics_bound_holds_for_outputs_within_tolerance() -> None:
    """Sound: anything within the elementwise tolerance of the recorded tensor agrees with its
    statistics (so a correct rewrite is never failed by them); zeros, a shift or a scale do not."""
    torch.manual_seed(0)
    recorded = torch.randn(64, 512) * 3 + 1
    want = ShapeOnly(torch.float32, (64, 512), tensor_stats(recorded, quantiles=False))
    rtol, atol = 1.3e-6, 1e-5
    for _ in range(20):  # perturbations right at the tolerance's edge
        edge = (atol + rtol * recorded.abs()) * torch.sign(torch.randn_like(recorded))
        assert statistics_contradiction(want, recorded + edge, rtol, atol) is None
    assert statistics_contradiction(want, recorded.to(torch.float64), rtol, atol) is None
    for wrong in (torch.zeros_like(recorded), recorded + 1e-3, recorded * 1.001, recorded.flip(0) * 0.5):
        assert statistics_contradiction(want, wrong, rtol, atol) is not None
    nan = recorded.clone()
    nan[0, 0] = float("nan")
    assert "non-finite" in (statistics_contradiction(want, nan, rtol, atol) or "")
    flags = ShapeOnly(torch.bool, (8,), tensor_stats(torch.tensor([True] * 3 + [False] * 5)))
    assert statistics_contradiction(flags, torch.tensor([True] * 3 + [False] * 5), 0, 0) is None
    assert statistics_contradiction(flags, torch.ones(8, dtype=torch.bool), 0, 0) is not None


def test_synthetic_replays_do_not_check_recorded_statistics() -> None:
    """Outputs computed from synthetic inputs are not those the statistics describe."""
    want = ShapeOnly(torch.float32, (4,), tensor_stats(torch.arange(4.0)))
    [leaf] = compare(want, torch.zeros(4), exact=False, synthetic=True)
    assert leaf.passed and not leaf.compared
    [leaf] = compare(want, torch.zeros(4), exact=False)
    assert not leaf.passed and "contradict" in leaf.message
