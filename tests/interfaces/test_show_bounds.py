"""``modulelens show`` prints a bounded page whatever the capture holds (a call returning a million
leaves printed 7.9 MB): the first ``SHOWN_CALLS`` calls, ``SHOWN_LEAVES`` leaves of each call's
inputs and outputs, the newest ``SHOWN_REPORTS`` reports, each cut counted; ``--all`` prints
everything; ``--json`` is complete (docs/cli-json.md, ``show``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import modulelens
from modulelens.interfaces.cli import app
from modulelens.interfaces.cli.core import SHOWN_CALLS, SHOWN_LEAVES, SHOWN_REPORTS
from stress.huge_captures import many_calls, many_leaves, many_reports

LEAVES, CALLS, REPORTS = 20_000, SHOWN_CALLS + 70, SHOWN_REPORTS + 25


@pytest.fixture(scope="module")
def huge(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    repo = modulelens.Repo(tmp_path_factory.mktemp("show-bounds"))
    refs = {"leaves": many_leaves(repo, leaves=LEAVES), "calls": many_calls(repo, calls=CALLS)}
    many_reports(repo, refs["calls"], REPORTS)
    return Path(repo.location), refs


def _show(huge: tuple[Path, dict[str, str]], kind: str, *extra: str) -> str:
    root, refs = huge
    result = CliRunner().invoke(app, ["show", refs[kind], "--repo", str(root), *extra])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_a_call_with_many_leaves_prints_a_bounded_cell_and_counts_the_rest(huge) -> None:
    text = _show(huge, "leaves")
    assert len(text) < 2_000, len(text)
    shown = ", ".join(["float32[2, 4]", *(str(i) for i in range(1, SHOWN_LEAVES))])
    assert f"{shown}, ... and {LEAVES - SHOWN_LEAVES:,} more leaves" in text
    everything = _show(huge, "leaves", "--all")
    assert len(everything) > 100_000 and f"{LEAVES - 1}" in everything and "more leaves" not in everything


def test_many_calls_and_reports_are_cut_and_counted(huge) -> None:
    text = _show(huge, "calls")
    rows = [line for line in text.splitlines() if line.strip().split(" ", 1)[0].isdigit()]
    assert len(rows) == SHOWN_CALLS and rows[-1].split()[0] == str(SHOWN_CALLS - 1)
    assert f"  ... and {CALLS - SHOWN_CALLS:,} more recorded calls, not shown (show --all or --json lists them)" in text
    assert f"... {REPORTS - SHOWN_REPORTS:,} older reports, not shown (show --all or --json lists them)" in text
    reports = [line for line in text.splitlines() if line.startswith("report: ")]
    assert len(reports) == SHOWN_REPORTS  # the newest: created at seconds 25..34 of many_reports' minute
    assert sorted(line.split()[2][-3:-1] for line in reports) == [str(s) for s in range(25, 35)]
    everything = _show(huge, "calls", "--all")
    assert "more recorded calls" not in everything and "older reports" not in everything
    assert sum(line.startswith("report: ") for line in everything.splitlines()) == REPORTS


def test_json_stays_complete(huge) -> None:
    result = json.loads(_show(huge, "leaves", "--json"))["result"]
    assert len(result["calls"][0]["outputs"]) == LEAVES
    result = json.loads(_show(huge, "calls", "--json"))["result"]
    assert len(result["calls"]) == CALLS and len(result["reports"]) == REPORTS


def test_op_traces_are_listed_for_the_calls_printed(tmp_path: Path) -> None:
    """``--ops`` reads and prints the op trace of the calls shown only (each trace is a blob of its own)."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with modulelens.capture(model, targets=["0"], repo=tmp_path, name="traced",
                            record=modulelens.Recording(op_trace=True, max_calls=SHOWN_CALLS + 5)), torch.no_grad():
        for _ in range(SHOWN_CALLS + 5):
            model(torch.randn(1, 2))
    runner = CliRunner()
    text = runner.invoke(app, ["show", "traced/0", "--repo", str(tmp_path), "--ops"]).stdout
    assert sum(line.startswith("op trace of call ") for line in text.splitlines()) == SHOWN_CALLS
    assert "aten::addmm" in text and "... and 5 more recorded calls, not shown" in text
    everything = runner.invoke(app, ["show", "traced/0", "--repo", str(tmp_path), "--ops", "--all"]).stdout
    assert sum(line.startswith("op trace of call ") for line in everything.splitlines()) == SHOWN_CALLS + 5
    result = json.loads(runner.invoke(app, ["show", "traced/0", "--repo", str(tmp_path), "--ops", "--json"]).stdout)
    assert all(call["ops"] for call in result["result"]["calls"]) and len(result["result"]["calls"]) == SHOWN_CALLS + 5
