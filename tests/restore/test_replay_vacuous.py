"""A replay never PASSes vacuously (issue 35, item 4, as verify): an output that is ``None``, empty
or only NaN, a shape-only output, a call that raised when recorded, or a capture with no calls is
UNVERIFIED ("cannot verify: <reason>", exit 1), through the API, the CLI (human and ``--json``),
the notebook's HTML and the MCP ``replay_capture`` tool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import modulelens
from modulelens.interfaces.html import replay_html
from stress.huge_captures import capture_of
from stress.verdict_rows import EmptyOut, WritesInPlace, ZerosLinear, vacuous_captures

ROOT = Path(__file__).resolve().parent.parent.parent
REASONS = {
    "none": "call 0: the recorded output is None: nothing to compare",
    "nan": "call 0: every recorded output value is NaN or infinite: any candidate that returns them matches",
    "empty": "call 0: the recorded output is empty (no elements): nothing to compare",
}


@pytest.fixture(scope="module")
def vacuous(tmp_path_factory: pytest.TempPathFactory) -> tuple[modulelens.Repo, dict[str, str]]:
    repo = modulelens.Repo(tmp_path_factory.mktemp("vacuous"))
    refs = vacuous_captures(repo)
    refs["empty"] = capture_of(repo, "vacuous/empty", EmptyOut, torch.randn(2, 4))
    return repo, refs


def _load(vacuous: tuple[modulelens.Repo, dict[str, str]], kind: str) -> modulelens.Capture:
    repo, refs = vacuous
    return modulelens.load(refs[kind], repo=repo)


@pytest.mark.parametrize("kind", ["none", "nan", "empty"])
def test_outputs_with_nothing_to_compare_are_unverified(vacuous, kind: str) -> None:
    report = _load(vacuous, kind).replay()
    assert report.status == "UNVERIFIED" and not report.passed
    assert report.unverified == [REASONS[kind]]
    [call] = report.calls
    assert call.status == "unverified" and not call.passed and call.error is None
    assert all(leaf.passed for leaf in call.leaves)  # it matched: the match proves nothing
    text = str(report)
    assert text.splitlines()[0].endswith(": UNVERIFIED") and f"cannot verify: {REASONS[kind]}" in text
    data = report.to_dict()
    assert data["status"] == "UNVERIFIED" and data["passed"] is False and data["unverified"] == [REASONS[kind]]
    assert data["calls"][0]["status"] == "unverified" and data["calls"][0]["unverified"] == [REASONS[kind][8:]]


def test_a_capture_without_calls_is_unverified(vacuous) -> None:
    cap = _load(vacuous, "no calls")
    report = cap.replay()
    assert report.status == "UNVERIFIED" and not report.passed and report.calls == []
    assert report.unverified == [f"{cap.ref} has no recorded calls to replay"]
    none = _load(vacuous, "none").replay(calls=[])
    assert none.status == "UNVERIFIED" and none.unverified == ["no recorded call was selected (calls=[])"]


def test_a_shape_only_output_is_checked_and_unverified_not_pass(vacuous) -> None:
    cap = _load(vacuous, "shape-only")
    report = cap.replay()
    assert report.status == "UNVERIFIED" and not report.passed
    [reason] = report.unverified
    assert reason.startswith("call 0: output: stored shape-only: shape, dtype and recorded statistics match")
    wrong = ZerosLinear(8, 512)  # right shape and dtype, values that contradict the recorded statistics
    failed = cap.replay(module=wrong)
    assert failed.status == "FAIL" and failed.unverified == []
    assert "contradict its recorded statistics" in failed.calls[0].leaves[0].message


def test_a_call_that_raised_when_recorded_is_unverified_not_failed(vacuous) -> None:
    cap = _load(vacuous, "nan")
    cap.calls[0].finished = False  # as a call that raised in the original job is loaded
    report = cap.replay()
    assert report.status == "UNVERIFIED" and report.calls[0].error is None
    assert report.unverified == ["call 0: the recorded call raised in the original job: no output to compare"]


def test_a_none_output_with_an_input_written_in_place_passes(tmp_path: Path) -> None:
    """What the call wrote into its input is compared: a real value, so a real PASS."""
    repo = modulelens.Repo(tmp_path / "repo")
    torch.manual_seed(0)
    handle = modulelens.track_init()
    try:
        model = torch.nn.Sequential(WritesInPlace())
    finally:
        handle.stop()
    with modulelens.capture(model, targets=["0"], repo=repo, name="vacuous/in-place", strict=True) as cap:
        model[0](torch.randn(2, 4), torch.zeros(2, 4))
    report = modulelens.load(cap.saved[0].ref, repo=repo).replay()
    assert report.status == "PASS" and report.passed and report.unverified == []
    assert any("(after the call)" in leaf.path and leaf.compared for leaf in report.calls[0].leaves)


def test_notebook_html_shows_unverified_not_fail(vacuous) -> None:
    html = replay_html(_load(vacuous, "none").replay())
    assert ">UNVERIFIED</span>" in html and f"cannot verify: {REASONS['none']}" in html
    assert ">FAIL</span>" not in html and ">unverified</span>" in html


def _cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "modulelens", *args], capture_output=True, text=True, env=env,
                          timeout=300, stdin=subprocess.DEVNULL)


def test_cli_says_cannot_verify_and_exits_1(vacuous) -> None:
    repo, refs = vacuous
    human = _cli(["replay", refs["none"], "--repo", repo.location])
    assert human.returncode == 1, human.stderr
    assert human.stdout.startswith(f"UNVERIFIED replay of {refs['none']}")
    assert f"cannot verify: {REASONS['none']}" in human.stdout
    as_json = _cli(["replay", refs["no calls"], "--repo", repo.location, "--json"])
    envelope = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and envelope["ok"] is True
    result = envelope["result"]
    assert result["status"] == "UNVERIFIED" and result["passed"] is False
    assert result["unverified"] == [f"{refs['no calls']} has no recorded calls to replay"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_mcp_replay_tool_reports_the_status(vacuous) -> None:
    pytest.importorskip("mcp")
    from mcp import Client

    from modulelens.interfaces.mcp_server import build_server

    repo, refs = vacuous
    async with Client(build_server(repo.location), raise_exceptions=True) as client:
        r = await client.call_tool("replay_capture", {"ref": refs["nan"]})
    assert not r.is_error  # a verdict, not an error
    assert r.structured_content["status"] == "UNVERIFIED" and r.structured_content["passed"] is False
    assert r.structured_content["unverified"] == [REASONS["nan"]]


@pytest.mark.subprocess
def test_the_ui_replay_action_on_a_capture_without_calls_reports_unverified(vacuous) -> None:
    """The UI's action worker replays one call at a time; with no calls it raised IndexError."""
    repo, refs = vacuous
    ran = subprocess.run([sys.executable, "-m", "modulelens.interfaces.ui._action_worker", "replay", refs["no calls"],
                          "--repo", repo.location], capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert ran.returncode == 0, ran.stderr[-2000:]
    result = json.loads(ran.stdout.strip().splitlines()[-1])["result"]
    assert result["status"] == "UNVERIFIED" and not result["passed"] and result["calls"] == 0, result

