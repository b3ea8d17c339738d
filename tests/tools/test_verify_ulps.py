"""Verdicts in ULPs for ``verify``, the pytest helper and ``replay`` (docs/tools.md, "Verdicts in ULPs").

A Block captured in bfloat16 and float16 (it rounds after every op): a correct rewrite that keeps
float32 inside and rounds once fails the per-dtype fixed tolerances (``oracle=False``) and passes
the oracle rule, which low-precision outputs get by default; a rewrite one ULP up everywhere passes
the fixed tolerances and fails the oracle rule; every output leaf reports its error in ULPs, in the
report, ``--json`` and the tables.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import tools_models as tm
import torch
from typer.testing import CliRunner

import modulelens
from modulelens.errors import MatchError
from modulelens.interfaces.cli import app
from modulelens.testing import assert_matches


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verify-ulps-repo")
    tm.capture_low_precision(root, torch.bfloat16, "bf16")
    tm.capture_low_precision(root, torch.float16, "fp16")
    return root


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_a_correct_rewrite_fails_fixed_tolerances_and_passes_the_oracle(repo: Path, name: str) -> None:
    cap = modulelens.load(f"{name}/inner", repo=repo)
    fixed = modulelens.verify(cap, tm.FusedBlock, timing=None, store=False, oracle=False)
    assert not fixed.passed and fixed.calls[0].leaves[0].rule == "tolerance", fixed
    report = modulelens.verify(cap, tm.FusedBlock, timing=None, store=False)  # the oracle: a low-precision capture
    assert report.passed, report
    leaf = report.calls[0].leaves[0]
    assert leaf.rule == "oracle" and leaf.max_ulps is not None and leaf.max_ulps >= 2 and leaf.oracle is not None
    assert leaf.oracle["factor"] == 3.0 and leaf.oracle["error_rms"] <= leaf.oracle["reference_rms"] * 1.2
    assert report.to_dict()["calls"][0]["leaves"][0]["oracle"]["numel"] == 512


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_one_ulp_up_passes_fixed_tolerances_and_fails_the_oracle(repo: Path, name: str) -> None:
    cap = modulelens.load(f"{name}/inner", repo=repo)
    assert modulelens.verify(cap, tm.OneUlpUpBlock, timing=None, store=False, oracle=False).passed
    report = modulelens.verify(cap, tm.OneUlpUpBlock, timing=None, store=False)
    assert not report.passed
    leaf = report.calls[0].leaves[0]
    assert leaf.oracle is not None and "bias" in leaf.oracle["failed"] and leaf.max_ulps == 1.0
    assert "biased up: median error +" in report.failures[0]


def test_assert_matches_with_the_oracle_and_with_ulps(repo: Path) -> None:
    cap = modulelens.load("bf16/inner", repo=repo)
    assert_matches(tm.FusedBlock, cap)
    with pytest.raises(MatchError) as failed:
        assert_matches(tm.OneUlpUpBlock, cap)
    header, first = str(failed.value).splitlines()[:2]
    assert header == "OneUlpUpBlock does not reproduce bf16/inner:v1 (2 of 2 calls failed, the float64 oracle rule)"
    assert first.startswith("  call 0: output: not within the oracle rule: ") and "biased up: median error +" in first
    assert_matches(tm.OneUlpUpBlock, cap, ulps=1)  # one ULP allowed: it is one ULP off
    with pytest.raises(MatchError, match=r"within bfloat16: 0 ULPs\)\n  call 0: output: 512/512 elements differ by more "
                                         r"than 0 ULPs of bfloat16, max 1 ULPs"):
        assert_matches(tm.OneUlpUpBlock, cap, ulps={"bfloat16": 0})


def test_cli_verify_oracle_json_and_table(repo: Path) -> None:
    runner = CliRunner()
    base = ["verify", "bf16/inner", "--repo", str(repo), "--no-store", "--no-timing", "--candidate"]
    result = runner.invoke(app, [*base, "tools_models:FusedBlock", "--json"])
    assert result.exit_code == 0, result.output
    leaf = json.loads(result.stdout)["result"]["calls"][0]["leaves"][0]
    assert leaf["rule"] == "oracle" and leaf["oracle"]["passed"] is True and leaf["max_ulps"] >= 2
    table = runner.invoke(app, [*base, "tools_models:OneUlpUpBlock", "--oracle"], env={"COLUMNS": "240"})
    assert table.exit_code == 1 and re.search(r"ULPs +┃", table.stdout) and "the float64 oracle rule" in table.stdout
    assert "biased up" in table.stdout
    ulps = runner.invoke(app, [*base, "tools_models:OneUlpUpBlock", "--ulps", "bfloat16=1", "--json"])
    assert ulps.exit_code == 0 and json.loads(ulps.stdout)["result"]["calls"][0]["leaves"][0]["rule"] == "ulps"
    fixed = runner.invoke(app, [*base, "tools_models:FusedBlock", "--no-oracle", "--json"])
    assert fixed.exit_code == 1 and json.loads(fixed.stdout)["result"]["calls"][0]["leaves"][0]["rule"] == "tolerance"
    bad = runner.invoke(app, [*base, "tools_models:OneUlpUpBlock", "--ulps", "int64=1"])
    assert bad.exit_code == 2 and "not a floating dtype" in bad.output


def test_replay_reports_ulps_and_takes_ulp_tolerances(repo: Path) -> None:
    runner = CliRunner()
    exact = runner.invoke(app, ["replay", "bf16/inner", "--repo", str(repo), "--json"])
    result = json.loads(exact.stdout)["result"]
    assert exact.exit_code == 0 and result["mode"] == "bit-exact"
    assert all(leaf["max_ulps"] == 0.0 and leaf["rule"] == "exact" for c in result["calls"] for leaf in c["leaves"])
    cast = runner.invoke(app, ["replay", "bf16/inner", "--repo", str(repo), "--dtype", "float32", "--ulps", "1", "--json"])
    result = json.loads(cast.stdout)["result"]
    assert result["mode"] == "within 1 ULPs"
    leaf = result["calls"][0]["leaves"][0]
    assert leaf["rule"] == "ulps" and leaf["ulps"] == 1.0 and leaf["max_ulps"] is not None  # in bfloat16 ULPs
    table = runner.invoke(app, ["replay", "bf16/inner", "--repo", str(repo)], env={"COLUMNS": "240"})
    assert re.search(r"ULPs +┃", table.stdout)
