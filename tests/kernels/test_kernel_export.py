"""`modulelens export --format kernelbench`: the problem folder KernelBench and KernelAgent load as is."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from kernel_models import capture_all, capture_dropout
from typer.testing import CliRunner

import modulelens
from modulelens.interfaces.cli import app
from modulelens.kernels.export import export_kernelbench

CANDIDATES = Path(__file__).resolve().parent.parent / "support" / "kernel_candidates"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("kernel-export-repo"))
    capture_all(path)
    return path


def kernelbench_load(source: str) -> tuple[Any, Any, Any]:
    """What KernelBench's eval.load_original_model_and_inputs does: exec of the text, no __file__."""
    context: dict[str, Any] = {}
    exec(compile(source, "<string>", "exec"), context)
    assert "__file__" not in context
    return context["Model"], context["get_init_inputs"], context["get_inputs"]


def recorded(repo: str, ref: str) -> list[tuple[tuple[torch.Tensor, ...], Any]]:
    cap = modulelens.load(ref, repo=repo)
    return [(c.args, c.output) for c in cap.calls]


def run_like_kernelbench(source: str, seed: int) -> tuple[list[Any], Any]:
    Model, get_init_inputs, get_inputs = kernelbench_load(source)  # noqa: N806
    torch.manual_seed(seed)
    init_inputs = get_init_inputs()
    torch.manual_seed(seed)
    with torch.no_grad():
        model = Model(*init_inputs)
    torch.manual_seed(seed)
    inputs = get_inputs()
    with torch.no_grad():
        return inputs, model(*inputs)


def test_problem_reproduces_recorded_calls_when_exec_from_text_elsewhere(repo: str, tmp_path: Path) -> None:
    result = export_kernelbench("km/act", tmp_path / "act", repo=repo)
    assert result.manifest["self_check"]["reproduces_recorded_outputs"] is True
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    copied = elsewhere / "1_ScaledGelu.py"
    shutil.copy(result.problem, copied)
    source = copied.read_text()
    assert "class ScaledGelu(nn.Module)" in source and "def gelu_erf" in source  # the real source, inlined
    calls = recorded(repo, "km/act")
    chosen = set()
    for seed in range(6):
        inputs, output = run_like_kernelbench(source, seed)
        match = [i for i, (args, _) in enumerate(calls) if torch.equal(args[0], inputs[0])]
        assert len(match) == 1, "get_inputs must return the real inputs of one recorded call"
        chosen.add(match[0])
        torch.testing.assert_close(output, calls[match[0]][1], rtol=0, atol=0)
    assert chosen == {0, 1}, "the recorded call is a seeded choice"
    # the data folder can move: $MODULELENS_PROBLEM_DATA overrides the absolute path in the file
    moved = tmp_path / "moved-data"
    shutil.move(str(tmp_path / "act" / "data"), moved)
    os.environ["MODULELENS_PROBLEM_DATA"] = str(moved)
    try:
        _, output = run_like_kernelbench(source, 0)
    finally:
        del os.environ["MODULELENS_PROBLEM_DATA"]
    assert output.shape == (3, 16)


def test_manifest_hashes_tolerances_and_safetensors_data(repo: str, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from modulelens.format.tensors import hash_bytes

    result = export_kernelbench("km/mlp", tmp_path / "mlp", repo=repo)
    m = json.loads((result.directory / "manifest.json").read_text())
    assert m == json.loads(json.dumps(result.manifest, default=str))
    assert m["capture"]["ref"] == "km/mlp:v1" and m["capture"]["version"] == 1
    assert m["capture"]["capture_id"].startswith("blake3:")
    for name, digest in m["files"].items():
        assert hash_bytes((result.directory / name).read_bytes()) == digest
    assert m["kernelbench_compatible"] is True and m["kernelbench_precision"] == "fp32"
    assert m["model"]["requires_modules"] == []  # kernel_models imports only math and torch
    assert m["tolerances"]["float32"] == {"rtol": 1e-4, "atol": 1e-4, "exact": False}
    # keyword-only `alpha` is bound to a position; Model.forward takes it positionally
    assert m["model"]["forward_arguments"] == ["x", "alpha"] and m["model"]["keyword_arguments"] == ["alpha"]
    assert m["kernel_function_signature"] == "kernel_function(x, alpha, fc.weight, fc.bias)"
    first = m["calls"][0]["arguments"]
    assert first[0]["kind"] == "tensor" and first[0]["shape"] == [3, 16] and first[0]["dtype"] == "float32"
    assert first[0]["payload"].startswith("blake3:") and first[1] == {"name": "alpha", "kind": "value", "value": 2.0}
    assert m["calls"][0]["outputs"][0]["payload"].startswith("blake3:")
    weights = load_file(str(result.directory / "data" / "weights.safetensors"))  # no pickle: safetensors
    assert set(weights) == {"fc.weight", "fc.bias"}
    cap = modulelens.load("km/mlp", repo=repo)
    torch.testing.assert_close(weights["fc.weight"], cap.module.fc.weight.detach(), rtol=0, atol=0)
    _, output = run_like_kernelbench(result.problem.read_text(), 3)
    assert output.shape == (3, 8)


def test_integer_inputs_are_marked_not_kernelbench_compatible(repo: str, tmp_path: Path) -> None:
    bag = export_kernelbench("km/bag", tmp_path / "bag", repo=repo)
    m = bag.manifest
    assert m["kernelbench_compatible"] is False
    assert any("'offsets' is int64" in r and "#151" in r for r in m["kernelbench_incompatible_reasons"])
    assert m["model"]["source"] == "imported" and m["model"]["class_expr"] == "torch.nn.EmbeddingBag"
    assert m["self_check"]["reproduces_recorded_outputs"] is True
    root = export_kernelbench("km", tmp_path / "root", repo=repo).manifest  # forward returns a tuple
    assert any("returns 2 tensors" in r for r in root["kernelbench_incompatible_reasons"])


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_kernelagent_test_file_runs_kernel_from_another_directory(repo: str, tmp_path: Path) -> None:
    result = export_kernelbench("km/act", tmp_path / "act", repo=repo)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": ""}
    outcomes = {}
    for name in ("scaled_gelu", "scaled_gelu_tanh"):
        workdir = tmp_path / f"ka-{name}"  # KernelAgent's worker dir: kernel.py + the user test, no problem file
        workdir.mkdir()
        shutil.copy(CANDIDATES / f"{name}.py", workdir / "kernel.py")
        shutil.copy(result.test, workdir / "test_extra_1_kernel.py")
        run = subprocess.run([sys.executable, "test_extra_1_kernel.py"], cwd=workdir, env=env,
                             capture_output=True, text=True, timeout=120)
        outcomes[name] = (run.returncode, run.stdout)
    assert outcomes["scaled_gelu"][0] == 0 and "PASS" in outcomes["scaled_gelu"][1]
    assert outcomes["scaled_gelu_tanh"][0] == 1 and "elements differ" in outcomes["scaled_gelu_tanh"][1]


def test_export_from_a_loaded_capture_and_selected_calls(repo: str, tmp_path: Path) -> None:
    capture = modulelens.load("km/mlp", repo=repo)  # what the MCP tool passes
    result = export_kernelbench(capture, tmp_path / "mlp", calls=[1], check=False)
    assert [c["index"] for c in result.manifest["calls"]] == [1]
    assert "self_check" not in result.manifest
    with pytest.raises(modulelens.ModulelensError, match="no call at position 5"):
        export_kernelbench(capture, tmp_path / "bad", calls=[5])


def test_constructor_with_module_tensor_and_function_arguments(tmp_path: Path) -> None:
    from kernel_models import Gated

    repo = str(tmp_path / "repo")
    with modulelens.track_init():
        model = Gated(torch.nn.Linear(4, 4), torch.linspace(0.5, 1.5, 4), torch.nn.functional.gelu, eps=0.25).eval()
    with modulelens.capture(model, targets=["Gated"], repo=repo, name="g"), torch.no_grad():
        model(torch.randn(2, 4))
    result = export_kernelbench("g", tmp_path / "g", repo=repo)
    source = result.problem.read_text()
    assert "get_init_inputs():\n" in source and "return []" in source  # not plain values: written into __init__
    assert "torch.nn.Linear(4, 4)" in source and "_ml_init['init.0']" in source
    assert "torch.nn.functional.gelu" in source and "eps=0.25" in source
    assert (result.directory / "data" / "init.safetensors").exists()
    assert result.manifest["model"]["forward_arguments"] == ["x"]  # the unused default `mask` is left out
    assert result.manifest["self_check"]["reproduces_recorded_outputs"] is True, result.manifest["self_check"]
    _, output = run_like_kernelbench(source, 0)
    torch.testing.assert_close(output, modulelens.load("g", repo=repo).calls[0].output, rtol=0, atol=0)


def test_export_cli_json_and_refusal_to_overwrite(repo: str, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "cli"
    first = runner.invoke(app, ["export", "km/act:v1", "--format", "kernelbench", "-o", str(out), "--repo", repo,
                                "--json"])
    assert first.exit_code == 0, first.output
    payload = json.loads(first.stdout)
    assert payload["ok"] and payload["result"]["manifest"]["capture"]["ref"] == "km/act:v1"
    assert (out / "problem.py").exists() and (out / "test_modulelens.py").exists()
    again = runner.invoke(app, ["export", "km/act", "-o", str(out), "--repo", repo, "--json"])
    assert again.exit_code == 2 and "not empty" in json.loads(again.stdout)["error"]["message"]  # a usage error
    # the folder is checked before anything is loaded (the refusal is immediate): even a missing capture says so
    early = runner.invoke(app, ["export", "km/no-such-capture", "-o", str(out), "--repo", repo, "--json"])
    assert early.exit_code == 2 and "is not empty" in json.loads(early.stdout)["error"]["message"]
    forced = runner.invoke(app, ["export", "km/act", "-o", str(out), "--repo", repo, "--force"])
    assert forced.exit_code == 0 and "KernelBench compatible" in forced.stdout


def kernelbench_correctness(source: str, trials: int = 3, seed: int = 42) -> int:
    """KernelBench's eval_kernel_against_ref with the reference as its own ModelNew: seeded
    construction of both, then per trial a seeded get_inputs(), both forwards, allclose at 1e-2."""
    Model, get_init_inputs, get_inputs = kernelbench_load(source)  # noqa: N806
    torch.manual_seed(seed)
    init_inputs = get_init_inputs()
    with torch.no_grad():
        torch.manual_seed(seed)
        original = Model(*init_inputs)
        torch.manual_seed(seed)
        new = Model(*init_inputs)
    passed = 0
    for trial in range(trials):
        torch.manual_seed(seed + trial)
        inputs = get_inputs()
        with torch.no_grad():
            want, got = original(*inputs), new(*inputs)
        passed += bool(want.shape == got.shape and torch.allclose(want, got, atol=1e-2, rtol=1e-2))
    return passed


def test_training_mode_dropout_is_marked_and_eval_export_passes_kernelbench(tmp_path: Path) -> None:
    repo = str(tmp_path / "repo")
    capture_dropout(repo, training=True, name="drop")
    recorded = export_kernelbench("drop", tmp_path / "train", repo=repo)
    m = recorded.manifest
    assert m["model"]["training"] is True and m["model"]["mode"] == "recorded"
    assert m["kernelbench_compatible"] is False
    assert any("random ops (bernoulli_)" in r for r in m["kernelbench_incompatible_reasons"]), m
    assert kernelbench_correctness(recorded.problem.read_text()) == 0  # the reference fails against itself
    runner = CliRunner()
    out = tmp_path / "eval"
    run = runner.invoke(app, ["export", "drop", "-o", str(out), "--repo", repo, "--eval", "--json"])
    assert run.exit_code == 0, run.output
    m = json.loads(run.stdout)["result"]["manifest"]
    assert m["model"]["training"] is False and m["model"]["mode"] == "eval"
    assert m["kernelbench_compatible"] is True, m["kernelbench_incompatible_reasons"]
    assert any("recorded in training mode" in n and "--eval" in n for n in m["notes"])
    assert "self.train(False)" in (out / "problem.py").read_text()
    assert kernelbench_correctness((out / "problem.py").read_text()) == 3


def test_eval_recorded_module_exports_in_eval_mode(tmp_path: Path) -> None:
    repo = str(tmp_path / "repo")
    capture_dropout(repo, training=False, name="drop")
    result = export_kernelbench("drop", tmp_path / "p", repo=repo)
    assert result.manifest["model"]["training"] is False and result.manifest["kernelbench_compatible"] is True
    assert result.manifest["self_check"]["reproduces_recorded_outputs"] is True
    assert kernelbench_correctness(result.problem.read_text()) == 3
    trained = export_kernelbench("drop", tmp_path / "t", repo=repo, mode="train", check=False).manifest
    assert trained["model"]["training"] is True and not trained["kernelbench_compatible"]


def test_problem_folder_moves_as_a_whole(repo: str, tmp_path: Path) -> None:
    import runpy

    result = export_kernelbench("km/act", tmp_path / "act", repo=repo)
    moved = tmp_path / "elsewhere" / "act"
    shutil.move(str(result.directory), moved)  # the exported absolute path no longer exists
    namespace = runpy.run_path(str(moved / "problem.py"))
    assert Path(namespace["DATA_DIR"]) == moved / "data"
    model = namespace["Model"](*namespace["get_init_inputs"]())
    with torch.no_grad():
        out = model(*namespace["get_inputs"]())
    assert out.shape == (3, 16)


MAIN_SCRIPT = """
import torch
import modulelens


def _scale(x):
    return x * 0.5


class ScriptBlock(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.proj = torch.nn.Linear(n, n)

    def forward(self, x):
        return _scale(torch.tanh(self.proj(x)))


if __name__ == "__main__":
    torch.manual_seed(0)
    with modulelens.track_init():
        block = ScriptBlock(6).eval()
    with modulelens.capture(block, targets=["ScriptBlock"], repo={repo!r}, name="script"), torch.no_grad():
        block(torch.randn(2, 6))
"""


def test_class_defined_in_a_script_exports_from_its_stored_source(tmp_path: Path) -> None:
    repo = str(tmp_path / "repo")
    script = tmp_path / "train_script.py"
    script.write_text(MAIN_SCRIPT.format(repo=repo))
    # captured by someone else (another signing key): a capture sent to us, not one of our own
    someone_else = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "someone-else")}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=someone_else)
    assert run.returncode == 0, run.stderr
    script.unlink()  # the class now exists only in the source stored with the capture
    with pytest.raises(modulelens.UntrustedCodeError, match="trust_source=True"):
        export_kernelbench("script", tmp_path / "p", repo=repo)  # its code runs only when trusted
    result = export_kernelbench(modulelens.load("script", repo=repo, trust_source=True), tmp_path / "p")
    m = result.manifest
    assert m["capture"]["module_class"] == "__main__:ScriptBlock"
    assert m["model"]["source"] == "inlined" and "def _scale" in result.problem.read_text()
    assert m["self_check"]["reproduces_recorded_outputs"] is True, m["self_check"]
    assert kernelbench_correctness(result.problem.read_text()) == 3


def test_tools_verify_eval_mode_compares_with_the_reference_in_eval(tmp_path: Path) -> None:
    repo = str(tmp_path / "repo")
    capture_dropout(repo, training=True, name="drop")
    runner = CliRunner()
    base = ["verify", "drop", "--repo", repo, "--no-timing", "--no-store", "--json", "--candidate"]
    good = runner.invoke(app, [*base, "kernel_models:DropMLP", "--eval"])
    assert good.exit_code == 0, good.output
    notes = json.loads(good.stdout)["result"]["notes"]
    assert any("recorded in training mode and ran in eval mode" in n for n in notes), notes
    wrong = runner.invoke(app, [*base, "kernel_models:AlwaysDropMLP", "--eval"])
    assert wrong.exit_code == 1, wrong.output
    cap = modulelens.load("drop", repo=repo)
    from modulelens.tools.verify import verify

    with pytest.raises(modulelens.ModulelensError, match="mode must be"):
        verify(cap, "kernel_models:DropMLP", mode="inference", timing=False, store=False)


SCRIPT = '''
from __future__ import annotations
import torch
from torch import nn
SCALE = 2.0
data = torch.randn(3)  # the job's data: not the class's
def helper(x):
    return x * SCALE
class Net(nn.Module):
    def forward(self, x):
        data = helper(x)  # a local that shares a module-level name
        return data
train = Net()(data)
if __name__ == "__main__":
    SCALE = 3.0
'''


def test_inliner_copies_the_dependency_slice_of_stored_source() -> None:
    """The inliner and stored-source restore share one slicer (restore.source_slice): only what
    the class reads at module level, never the job's top-level code or the ``__main__`` block."""
    from modulelens.kernels.inline import inlined_class_source

    net = type("Net", (torch.nn.Module,), {})
    source = inlined_class_source(net, module_name="__main__", text=SCRIPT)
    assert source.origin == "inlined" and source.future_annotations
    assert source.included == ["nn", "SCALE", "helper", "Net"]
    assert "data = torch.randn" not in source.code and "train" not in source.code and "3.0" not in source.code
    namespace: dict[str, Any] = {}
    exec(compile(source.code, "<problem>", "exec"), namespace)
    assert torch.equal(namespace["Net"]()(torch.ones(2)), torch.full((2,), 2.0))
