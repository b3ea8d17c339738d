"""Modules made by tools, and classes with their own ``__new__`` (issue 34, defects 2 and 3),
captured with the tools and libraries at their defaults in one fresh process and replayed in
another: fx ``symbolic_trace``, ``torch.export(...).module()`` and ``unflatten`` (rebuilt from
their recorded graph), TorchScript (scripted and traced; as the target and as a child), pruning,
parametrizations, QAT, torchao's int8 weights (a tensor subclass), accelerate's
``add_hook_to_module`` and ``cpu_offload``, ``torch.compile`` (inductor), tensordict's modules,
torchrl's actor and neuraloperator's FNO. A ``forward`` replaced on the instance by anything but
accelerate cannot be rebuilt: it is named at capture and at load, never silent. Scenarios:
tests/support/tool_models.py.
"""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from child_process import PYTHON, REPO_ROOT, SUPPORT_DIR, subprocess_env
from torch import nn

import modulelens
from modulelens.errors import RestoreError, UntrustedCodeError

for _library in ("tensordict", "torchrl", "neuralop", "accelerate"):
    pytest.importorskip(_library)

TORCHAO_PATH = str(REPO_ROOT / ".venv" / "torchtune-site")  # scripts/_setup_env.sh keeps torchao apart
SCENARIOS = ["fx", "export", "unflatten", "script", "script_child", "trace", "prune", "parametrize", "qat", "torchao",
             "accelerate_hook", "forward_replaced", "cpu_offload", "compile", "tensordict", "torchrl_actor", "fno",
             "closure"]
EXACT = ["fx", "export", "unflatten", "script", "script_child", "script_child.block", "trace", "prune", "prune.fc2",
         "parametrize", "qat", "torchao", "torchao.fc1", "accelerate_hook", "accelerate_hook.fc2", "cpu_offload",
         "cpu_offload.fc1", "compile", "tensordict", "torchrl_actor", "fno", "closure", "closure.block"]


def _worker(*args: str) -> Any:
    env = subprocess_env()
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{TORCHAO_PATH}"
    result = subprocess.run([PYTHON, *args], capture_output=True, text=True, env=env, timeout=900, cwd=SUPPORT_DIR)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tools")
    found = _worker(str(SUPPORT_DIR / "tool_models.py"), str(root / "repo"), *SCENARIOS)
    manifest = root / "manifest.json"
    manifest.write_text(json.dumps(found["refs"]))
    replayed = _worker(str(SUPPORT_DIR / "fidelity_replay.py"), str(root / "repo"), str(manifest))["results"]
    return {"repo": root / "repo", "refs": found["refs"], "warnings": found["warnings"], "replayed": replayed}


@pytest.mark.parametrize("label", EXACT)
def test_a_tool_made_module_replays_bit_exact_in_a_fresh_process(captured: dict[str, Any], label: str) -> None:
    assert label in captured["refs"], f"{label} was not captured: {captured['warnings']}"
    result = captured["replayed"][label]
    assert (result["status"], result["mode"]) == ("PASS", "bit-exact"), result.get("error") or result["report"]
    assert result["tensor_leaves"] > 0


def _notes(captured: dict[str, Any], label: str) -> str:
    return captured["replayed"][label]["report"]


def test_a_forward_replaced_on_the_instance_is_named_at_capture_and_at_load(captured: dict[str, Any]) -> None:
    # the one silent wrong value of issue 34: a replay that FAILed by 1.32 with no word anywhere
    [warning] = [w for w in captured["warnings"]["forward_replaced"] if "forward replaced" in w]
    assert "fc2: forward replaced on the instance by tool_models:_forward_replaced.<locals>.<lambda>" in warning
    result = captured["replayed"]["forward_replaced"]
    assert result["status"] == "FAIL"
    assert "the module runs without them: fc2: forward replaced on the instance" in result["report"]


def test_accelerate_hooks_are_attached_again_and_offloaded_weights_recorded(captured: dict[str, Any]) -> None:
    assert "fc2: accelerate hooks" in _notes(captured, "accelerate_hook")
    assert captured["warnings"]["cpu_offload"] == []  # the weights were read where accelerate keeps them
    cap = modulelens.load(captured["refs"]["cpu_offload.fc1"], repo=captured["repo"])
    assert not any(t.is_meta for t in cap.state_dict().values())


def test_the_load_says_how_each_tool_made_module_was_rebuilt(captured: dict[str, Any]) -> None:
    assert "rebuilt as the eager modules torch.jit.script made them from" in _notes(captured, "script_child")
    assert "rebuilt as the eager modules torch.jit.trace made them from" in _notes(captured, "trace")
    assert "fc1.weight pruned (its recorded mask)" in _notes(captured, "prune")
    assert "compiled as the job compiled them (torch.compile, on the first call): <root> (inductor)" in \
        _notes(captured, "compile")
    assert "forward hook torch.ao.quantization.quantize:_observer_forward_hook" in _notes(captured, "qat")


def test_a_module_with_a_closure_argument_is_rebuilt_from_its_recorded_attributes(captured: dict[str, Any]) -> None:
    report = _notes(captured, "closure.block")
    assert "GatedBlock rebuilt from its recorded attributes, parameters, buffers and submodules, not by its " \
           "constructor, which did not run (args[1]: <function gain_layer.<locals>.create" in report
    cap = modulelens.load(captured["refs"]["closure.block"], repo=captured["repo"])
    assert cap.init_arguments is None  # no arguments were recorded: its attributes were
    assert cap.metadata["module"]["construction_missing"].startswith("args[1]: <function gain_layer.<locals>.create")


def test_a_graph_a_tool_generated_is_code_that_runs_only_with_trust(captured: dict[str, Any], tmp_path: Path) -> None:
    # a copy of the repo is not the repo the captures were saved into: they are not your own there
    copy = tmp_path / "elsewhere"
    shutil.copytree(captured["repo"], copy)
    ref = captured["refs"]["fx"]
    with pytest.raises(UntrustedCodeError, match=r"is code stored in the capture .* runs only if you trust"):
        modulelens.load(ref, repo=copy).module  # noqa: B018 - the rebuild is what refuses
    report = modulelens.load(ref, repo=copy, trust_source=True).replay()
    assert (report.status, report.mode) == ("PASS", "bit-exact")


def test_classes_with_their_own_new_get_their_constructor_arguments_recorded() -> None:
    from neuralop.models import FNO
    from tensordict.nn import TensorDictModule

    with modulelens.track_init():
        inner = nn.Linear(8, 8)
        module = TensorDictModule(inner, in_keys=["x"], out_keys=["y"])
        fno = FNO(n_modes=(4, 4), hidden_channels=8, in_channels=1, out_channels=1)
        traced = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2)))
    record = modulelens.get_init_record(module)
    assert record is not None and record.args == (inner,) and record.kwargs == {"in_keys": ["x"], "out_keys": ["y"]}
    record = modulelens.get_init_record(fno)  # neuraloperator's __new__ adds its defaults to its own kwargs
    assert record is not None and record.kwargs == {"n_modes": (4, 4), "hidden_channels": 8, "in_channels": 1,
                                                    "out_channels": 1}
    record = modulelens.get_init_record(traced)
    assert record is not None and isinstance(record.args[1], torch.fx.Graph)


def test_a_module_made_without_calling_its_class_is_refused_with_the_true_reason(tmp_path: Path) -> None:
    with modulelens.track_init():
        model = nn.Sequential(nn.Linear(4, 4))
        model[0] = pickle.loads(pickle.dumps(nn.Linear(4, 4)))  # the test's own object, unpickled
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with modulelens.capture(model, targets="0", repo=tmp_path, name="unpickled") as cap:
                model(torch.randn(2, 4))
    with pytest.raises(RestoreError, match=r"it was not constructed by calling Linear\(\.\.\.\) \(made without its "
                                           r"constructor: unpickled, or created by a tool\)"):
        modulelens.load(cap.saved[0].ref, repo=tmp_path).module  # noqa: B018
