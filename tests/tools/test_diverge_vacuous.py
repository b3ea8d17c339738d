"""``modulelens diverge`` never PASSes vacuously (issue 35 item 4, as ``verify``): a capture whose
outputs are stored shape-only, ``None``, only NaN, or that has no calls is UNVERIFIED ("cannot
verify: ..."), with a non-zero exit, in the API, the CLI, ``--json`` and the MCP
``locate_divergence`` tool; a wrong candidate still FAILS, and a real comparison still PASSes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import modulelens
from modulelens.tools.diverge import find_divergence
from stress.huge_captures import capture_of
from stress.verdict_rows import NanOut, NoneOut, ZerosLinear, vacuous_captures

ROOT = Path(__file__).resolve().parent.parent.parent
SHAPE_ONLY = "output: stored shape-only: shape, dtype and recorded statistics match; values NOT compared"


@pytest.fixture(scope="module")
def vacuous(tmp_path_factory: pytest.TempPathFactory) -> tuple[modulelens.Repo, dict[str, str]]:
    """The vacuous captures of ``stress.verdict_rows``, and the same recorded with their op trace
    (a replay is compared with it: ``diverge`` without ``--candidate``), plus one with real values."""
    repo = modulelens.Repo(tmp_path_factory.mktemp("diverge-vacuous"))
    refs = vacuous_captures(repo)
    traced = modulelens.Recording(op_trace=True)
    refs["shape-only traced"] = capture_of(repo, "traced/shape-only", lambda: torch.nn.Linear(8, 512), torch.randn(2, 8),
                                           payload=modulelens.PayloadPolicy(shape_only_over=1024), record=traced)
    refs["none traced"] = capture_of(repo, "traced/none", NoneOut, torch.randn(2, 4), record=traced)
    refs["nan traced"] = capture_of(repo, "traced/nan", NanOut, torch.randn(2, 4), record=traced)
    refs["values traced"] = capture_of(repo, "traced/values", lambda: torch.nn.Linear(4, 4), torch.randn(2, 4),
                                       record=traced)
    return repo, refs


def _diverge(vacuous: tuple[modulelens.Repo, dict[str, str]], kind: str, candidate: object = None) -> dict:
    repo, refs = vacuous
    return find_divergence(modulelens.load(refs[kind], repo=repo), candidate, store=False)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kind", "candidate", "reason"), [
    ("shape-only", torch.nn.Linear, f"call 0: {SHAPE_ONLY}"),
    ("none", NoneOut, "call 0: the recorded output is None: nothing to compare"),
    ("nan", NanOut, "call 0: every recorded output value is NaN or infinite"),
    ("no calls", torch.nn.Linear, "has no recorded calls to verify against"),
    ("shape-only traced", None, f"call 0: {SHAPE_ONLY}"),
    ("none traced", None, "call 0: the recorded output is None: nothing to compare"),
    ("nan traced", None, "call 0: every recorded output value is NaN or infinite"),
])
def test_nothing_to_compare_is_unverified_not_pass(vacuous, kind: str, candidate: object, reason: str) -> None:
    result = _diverge(vacuous, kind, candidate)
    assert result["status"] == "UNVERIFIED" and result["passed"] is False and result["divergence"] is None
    [said] = result["unverified"]
    assert reason in said
    assert all(c["status"] == "unverified" and c["passed"] is False and c["unverified"] for c in result["calls"])


def test_a_replay_of_a_capture_without_calls_is_unverified(vacuous) -> None:
    """Without a candidate, no calls used to be reported as 'no op trace': it is nothing to compare."""
    result = _diverge(vacuous, "no calls")
    assert result["status"] == "UNVERIFIED" and result["calls"] == []
    assert result["unverified"] == [f"{vacuous[1]['no calls']} has no recorded calls to compare"]


def test_a_wrong_candidate_still_fails_and_a_real_comparison_still_passes(vacuous) -> None:
    wrong = _diverge(vacuous, "shape-only", ZerosLinear)
    assert wrong["status"] == "FAIL" and wrong["unverified"] == [] and wrong["calls"][0]["status"] == "fail"
    assert wrong["divergence"]["found"] is True  # zeros contradict the recorded statistics: located
    real = _diverge(vacuous, "values traced")
    assert real["status"] == "PASS" and real["passed"] is True and real["calls"][0]["status"] == "pass"
    assert _diverge(vacuous, "values traced", torch.nn.Linear)["status"] == "PASS"


def _cli(vacuous, kind: str, *extra: str) -> subprocess.CompletedProcess[str]:
    repo, refs = vacuous
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "modulelens", "diverge", refs[kind], "--repo", repo.location,
                           "--no-store", *extra], capture_output=True, text=True, env=env, timeout=300)


def test_cli_says_cannot_verify_and_exits_1(vacuous) -> None:
    human = _cli(vacuous, "none traced")
    assert human.returncode == 1, human.stderr
    assert human.stdout.startswith("UNVERIFIED this replay against the recorded job's trace")
    assert "cannot verify: call 0: the recorded output is None: nothing to compare" in " ".join(human.stdout.split())
    assert "call 0: UNVERIFIED" in human.stdout and "PASS" not in human.stdout
    as_json = _cli(vacuous, "shape-only", "-c", "torch.nn:Linear", "--json")
    result = json.loads(as_json.stdout)["result"]
    assert as_json.returncode == 1 and result["status"] == "UNVERIFIED" and result["passed"] is False
    assert result["unverified"][0].startswith(f"call 0: {SHAPE_ONLY}")
    wrong = _cli(vacuous, "shape-only", "-c", "stress.verdict_rows:ZerosLinear", "--json")
    assert wrong.returncode == 1 and json.loads(wrong.stdout)["result"]["status"] == "FAIL"
    real = _cli(vacuous, "values traced")
    assert real.returncode == 0 and real.stdout.startswith("PASS"), real.stdout + real.stderr


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_mcp_locate_divergence_reports_the_status(vacuous, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mcp")
    from mcp import Client

    from modulelens.interfaces.mcp_server import build_server

    repo, refs = vacuous
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    async with Client(build_server(repo.location), raise_exceptions=True) as client:
        replay = (await client.call_tool("locate_divergence", {"ref": refs["nan traced"]})).structured_content
        assert replay["status"] == "UNVERIFIED" and replay["passed"] is False
        assert "every recorded output value is NaN" in replay["unverified"][0]
        rewrite = (await client.call_tool("locate_divergence", {"ref": refs["none"],
                                                                "candidate": "stress.verdict_rows:NoneOut"})).structured_content
        assert rewrite["status"] == "UNVERIFIED" and rewrite["passed"] is False
        assert rewrite["unverified"] == ["call 0: the recorded output is None: nothing to compare"]


def test_a_divergence_with_no_op_paired_does_not_claim_agreement() -> None:
    """The locator's summary when nothing diverges counts the ops it compared, and says so when it
    compared none (it used to say "no op of the <reference's op count> compared diverges")."""
    from modulelens.restore.divergence import Divergence

    none = Divergence(compared="c", rule="bit-exact", reference_ops=12, candidate_ops=3)
    assert none.summary() == "no op could be compared: none of the reference's 12 ops was paired with one of the candidate's 3"
    some = Divergence(compared="c", rule="bit-exact", candidate="this replay", reference_ops=12, candidate_ops=12,
                      paired_ops=10)
    assert some.summary() == "no op of the 10 compared (of 12) diverges (bit-exact)"
