"""modulelens diff: constructor, weight, input-statistics and output differences between captures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tools_models as tm
import torch
from typer.testing import CliRunner

from modulelens.tools.diff import diff


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("diff-repo")
    torch.manual_seed(0)
    base = tm.MLP(8, 16)
    inputs = [(torch.randn(5, 8),)]
    tm.capture(lambda: _clone(base), inputs, root, "mlp")                      # v1
    tm.capture(lambda: _clone(base, bump=0.5), [(inputs[0][0] + 1.0,)], root, "mlp")  # v2: a weight, inputs +1
    tm.capture(lambda: tm.MLP(8, 32), inputs, root, "wide")                     # another name, other hidden size
    return root


def _clone(module: tm.MLP, bump: float = 0.0) -> tm.MLP:
    copy = tm.MLP(8, 16)
    copy.load_state_dict(module.state_dict())
    with torch.no_grad():
        copy.fc2.weight[1, 3] += bump
    return copy


def test_changed_weight(repo: Path) -> None:
    report = diff("mlp/inner:v1", "mlp/inner:v2", repo=repo)
    assert report.constructor == []
    changed = report.changed_tensors
    assert [t["name"] for t in changed] == ["fc2.weight"]
    assert changed[0]["max_abs_diff"] == pytest.approx(0.5, abs=1e-6)
    from modulelens import load

    weight = load("mlp/inner:v1", repo=repo).state_dict()["fc2.weight"].double()
    assert changed[0]["rel_norm"] == pytest.approx(0.5 / float(weight.norm()), rel=1e-5)
    assert report.summary["tensors_changed"] == 1 and report.summary["tensors"] == 4
    # the inputs of v2 were shifted by +1
    (row,) = report.inputs
    assert row["leaf"] == "args[0]"
    assert row["shift"]["mean"] == pytest.approx(1.0, abs=1e-5)
    assert row["shift"]["std"] == pytest.approx(0.0, abs=1e-5)
    # v2's module on v1's inputs: hidden identical, logits differ
    (out,) = report.outputs
    assert not out["same"]
    status = {leaf["path"]: leaf["passed"] for leaf in out["leaves"]}
    assert status == {"output['hidden']": True, "output['logits']": False}


def test_identical_versions(repo: Path) -> None:
    report = diff("mlp/inner:v1", "mlp/inner:v1", repo=repo)
    assert report.changed_tensors == [] and report.constructor == []
    assert all(o["same"] for o in report.outputs)


def test_changed_constructor_argument_between_names(repo: Path) -> None:
    report = diff("mlp/inner:v1", "wide/inner", repo=repo)
    assert [(c["argument"], c["a_value"], c["b_value"]) for c in report.constructor] == [("hidden", 16, 32)]
    status = {t["name"]: t["status"] for t in report.tensors}
    assert status["fc1.weight"] == "shape changed" and status["fc2.bias"] == "changed"
    assert report.outputs[0]["max_abs_error"] > 0


def test_cli_diff(repo: Path) -> None:
    from modulelens.interfaces.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["diff", "mlp/inner:v1", "wide/inner", "--repo", str(repo), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)["result"]
    assert payload["constructor"][0]["argument"] == "hidden"
    human = runner.invoke(app, ["diff", "mlp/inner:v1", "mlp/inner:v2", "--repo", str(repo), "--no-outputs"])
    assert human.exit_code == 0 and "fc2.weight" in human.stdout and "3/4 tensors identical" in human.stdout
    missing = runner.invoke(app, ["diff", "mlp/inner:v1", "mlp/inner:v9", "--repo", str(repo)])
    assert missing.exit_code == 2
