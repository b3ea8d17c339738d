"""modulelens verify: candidate implementations against every recorded call, and assert_matches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tools_models as tm
import torch

import modulelens
from modulelens.errors import MatchError
from modulelens.testing import assert_matches
from modulelens.tools.timing import TimingConfig

HERE = Path(__file__).resolve().parent.parent / "support"
CANDIDATES = HERE / "tools_models.py"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verify-repo")
    torch.manual_seed(0)
    tm.capture(lambda: tm.MLP(8, 16), [(torch.randn(5, 8),), (torch.randn(3, 8),)], root, "mlp")
    return root


@pytest.fixture
def cap(repo: Path) -> modulelens.Capture:
    return modulelens.load("mlp/inner", repo=repo)


def test_correct_refactor_passes_from_file_spec(cap: modulelens.Capture, repo: Path) -> None:
    report = modulelens.verify(cap, f"{CANDIDATES}:FusedMLP", timing=TimingConfig(iters=5))
    assert report.passed, report
    assert report.built_with == "constructor"
    assert [c.index for c in report.calls] == [0, 1]
    assert all(c.reference_ms and c.candidate_ms and c.speedup for c in report.calls)
    assert report.speedup is not None and report.speedup > 0
    assert all(c.max_abs_error <= 1e-5 and c.mean_abs_error <= c.max_abs_error for c in report.calls)
    stored = modulelens.Repo(repo).reports(cap.ref, "verify")
    assert stored[-1]["passed"] is True and stored[-1]["candidate"].endswith(":FusedMLP")


def test_class_object_and_from_original(cap: modulelens.Capture) -> None:
    assert modulelens.verify(cap, tm.FusedMLP, timing=None, store=False).passed
    report = modulelens.verify(cap, "tools_models:PackedMLP", timing=None, store=False)
    assert report.passed, report
    assert report.built_with == "from_original"


def test_subtly_wrong_candidate_names_the_leaf(cap: modulelens.Capture) -> None:
    report = modulelens.verify(cap, tm.SubtlyWrongMLP, timing=None, store=False)
    assert not report.passed
    for call in report.calls:
        failing = {leaf.path for leaf in call.leaves if not leaf.passed}
        assert failing == {"output['logits']"}
        assert call.max_rel_error == pytest.approx(1e-3, rel=1e-2)
        assert 0 < call.mean_rel_error <= call.max_rel_error * 1.0001
    assert "output['logits']" in report.failures[0] and "elements differ" in report.failures[0]
    # a looser tolerance accepts it
    assert modulelens.verify(cap, tm.SubtlyWrongMLP, rtol=2e-3, atol=1e-5, timing=None, store=False).passed


def test_candidate_that_mutates_its_input_fails(cap: modulelens.Capture) -> None:
    report = modulelens.verify(cap, tm.MutatingMLP, timing=None, store=False)
    assert not report.passed
    assert all(leaf.passed for c in report.calls for leaf in c.leaves)  # outputs are right
    assert [leaf.path for leaf in report.calls[0].mutated_inputs] == ["args[0]"]
    assert "modified its input args[0] in place" in report.failures[0]


def test_state_dict_key_mismatch_is_reported(cap: modulelens.Capture) -> None:
    report = modulelens.verify(cap, tm.RenamedMLP, timing=None, store=False)
    assert not report.passed and report.calls == []
    assert report.state_mismatch["missing"] == ["first.bias", "first.weight", "second.bias", "second.weight"]
    assert report.state_mismatch["unexpected"] == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert "missing keys" in report.error and "first.weight" in report.error
    assert "unexpected keys" in report.error and "fc1.weight" in report.error


def test_shape_mismatch_is_reported(cap: modulelens.Capture) -> None:
    report = modulelens.verify(cap, tm.MLP(8, 32), timing=None, store=False)
    assert not report.passed and report.built_with == "instance"
    assert {s["key"] for s in report.state_mismatch["shape"]} == {"fc1.weight", "fc1.bias", "fc2.weight"}
    assert "shape mismatch" in report.error


def test_bad_specs_are_clear_errors(cap: modulelens.Capture, tmp_path: Path) -> None:
    with pytest.raises(modulelens.ModulelensError, match="no such file"):
        modulelens.verify(cap, f"{tmp_path}/nope.py:X")
    with pytest.raises(modulelens.ModulelensError, match="has no attribute 'Nope'"):
        modulelens.verify(cap, f"{CANDIDATES}:Nope")
    with pytest.raises(modulelens.ModulelensError, match=r"use path/to/file\.py:ClassName"):
        modulelens.verify(cap, "no_colon_here")


def test_assert_matches(cap: modulelens.Capture) -> None:
    report = assert_matches(cap.module, cap)
    assert report.passed
    wrong = tm.SubtlyWrongMLP(8, 16)
    wrong.load_state_dict(cap.state_dict())
    with pytest.raises(MatchError) as info:
        assert_matches(wrong, cap)
    message = str(info.value)
    assert isinstance(info.value, AssertionError)
    assert message.startswith("SubtlyWrongMLP does not reproduce mlp/inner:v1 (2 of 2 calls failed")
    assert "call 0: output['logits']: " in message and "max abs error" in message
    assert_matches(wrong, cap, rtol=2e-3, atol=1e-5)


def _cli(*args: str, repo: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent.parent), str(HERE), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "modulelens", "verify", "mlp/inner", "--repo", str(repo), *args],
                          capture_output=True, text=True, env=env, timeout=120, check=False)


def test_cli_exit_codes(repo: Path) -> None:
    ok = _cli("--candidate", f"{CANDIDATES}:FusedMLP", "--iters", "3", repo=repo)
    assert ok.returncode == 0, ok.stderr
    assert "PASS" in ok.stdout and "speedup" in ok.stdout
    wrong = _cli("--candidate", "tools_models:SubtlyWrongMLP", "--no-timing", "--json", repo=repo)
    assert wrong.returncode == 1, wrong.stderr
    result = json.loads(wrong.stdout)["result"]
    assert result["passed"] is False and "output['logits']" in result["failures"][0]
    missing = _cli("--candidate", "tools_models:DoesNotExist", repo=repo)
    assert missing.returncode == 2 and missing.stderr.startswith("error:") and missing.stderr.count("\n") == 1


def test_cli_tolerances_and_key_mismatch(repo: Path) -> None:
    from typer.testing import CliRunner

    from modulelens.interfaces.cli import app

    base = ["verify", "mlp/inner", "--repo", str(repo), "--no-store", "--no-timing", "--candidate"]
    loose = CliRunner().invoke(app, [*base, "tools_models:SubtlyWrongMLP", "--rtol", "2e-3"])
    assert loose.exit_code == 0, loose.output
    keys = CliRunner().invoke(app, [*base, "tools_models:RenamedMLP"])
    assert keys.exit_code == 1 and "unexpected keys" in keys.stdout and "fc1.weight" in keys.stdout


def test_training_capture_with_several_states(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = tm.capture_training(tmp_path, "train")
    cap = modulelens.load(ref, repo=tmp_path)
    assert len(cap.metadata["states"]) == 3 and all(c.training for c in cap.calls)
    for _ in range(2):  # verifying (and timing the reference) leaves the capture as recorded
        report = modulelens.verify(cap, tm.FunctionalNormed, timing=TimingConfig(iters=3), store=False)
        assert report.passed, report
    modulelens.profile(cap, call=2, backward=True, timing=TimingConfig(iters=3), store=False)
    cap.replay()  # switches the capture's own module between states
    assert modulelens.verify(cap, tm.FunctionalNormed, timing=None, store=False).passed
    one = modulelens.verify(cap, tm.FunctionalNormed, timing=None, store=False, calls=[1])
    assert [c.index for c in one.calls] == [1] and one.passed


def test_bare_file_spec_picks_the_only_module_class(cap: modulelens.Capture, tmp_path: Path) -> None:
    single = tmp_path / "fast_mlp.py"
    single.write_text("import tools_models\n\nclass Fast(tools_models.FusedMLP):\n    pass\n")
    report = modulelens.verify(cap, str(single), timing=None, store=False)
    assert report.passed and report.candidate == str(single)
    with pytest.raises(modulelens.ModulelensError, match=r"classes defined there: .*FusedMLP"):
        modulelens.verify(cap, str(CANDIDATES), timing=None, store=False)


def test_assert_matches_gives_each_call_its_recorded_weights(tmp_path: Path) -> None:
    """Weights changed between the recorded calls: a correct module passes, and is left untouched."""
    torch.manual_seed(0)
    cap = modulelens.load(tm.capture_training(tmp_path, "train"), repo=tmp_path)
    module = cap.module
    before = {k: v.clone() for k, v in module.state_dict().items()}
    report = assert_matches(module, cap)
    assert report.passed and any("each call ran on a copy of the module" in n for n in report.notes)
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())

    renamed = tm.RenamedMLP(8, 16)
    with pytest.raises(MatchError, match="the weights changed between the recorded calls"):
        assert_matches(renamed, cap)
