"""Hooks (issue 22, defect 5): a call is recorded as the parent sees it, before the module's own
pre-hooks and after its own forward hooks, since a rebuilt module registers those again in its
constructor; hooks added from outside are not rebuilt, and the capture warning, ``show`` and the
loaded capture's notes name them."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from child_process import PYTHON, subprocess_env
from hook_models import Outer, clip_output
from typer.testing import CliRunner

import modulelens
from modulelens.interfaces.cli import app

REPLAY = '''
import json, sys
import modulelens
cap = modulelens.load(sys.argv[2], repo=sys.argv[1])
report = cap.replay()
print(json.dumps({"status": report.status, "mode": report.mode, "notes": cap.notes, "report": str(report)}))
'''


def _replay_elsewhere(repo: modulelens.Repo, ref: str, cwd) -> dict:
    result = subprocess.run([PYTHON, "-c", REPLAY, str(repo.root), ref], capture_output=True, text=True,
                            env=subprocess_env(), timeout=300, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("train", [True, False])
def test_a_module_with_hooks_from_its_own_init_replays_bit_exact_in_a_fresh_process(repo, tmp_path, train) -> None:
    torch.manual_seed(0)
    model = Outer().train(train)
    with modulelens.capture(model, targets=["inner", ""], repo=repo, name="hooked", strict=True,
                            record=modulelens.Recording(max_calls=2)) as cap:
        for _ in range(2):
            model(torch.randn(4, 8))
    refs = {info.name: info.ref for info in cap.saved}
    inner = modulelens.load(refs["hooked/inner"], repo=repo)
    x = inner.calls[0].args[0]
    # recorded as Outer's forward passed it: before the x3 pre-hook and without the gate doubling
    assert inner.calls[0].kwargs == {"gate": 0.5}
    expected = model.inner.lin(x * 3.0) * 1.0 + 0.5  # gate 0.5 doubled by the with_kwargs pre-hook
    assert torch.equal(inner.calls[0].output, expected.detach())
    for ref in refs.values():
        replayed = _replay_elsewhere(repo, ref, tmp_path)
        assert replayed["status"] == "PASS" and replayed["mode"] == "bit-exact", replayed["report"]


@pytest.mark.filterwarnings("ignore:module forward hook with ``always_call=True``")
def test_an_always_call_hook_of_the_module_does_not_confuse_a_failing_call(repo) -> None:
    model = Outer()
    with modulelens.capture(model, targets=["inner"], repo=repo, name="raising",
                            record=modulelens.Recording(max_calls=1)) as cap:
        with pytest.raises(RuntimeError):
            model(torch.randn(4, 3))  # wrong width: forward raises, the always_call hooks still run
        model(torch.randn(4, 8))
    loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    assert [call.index for call in loaded.calls] == [1]
    assert loaded.replay().passed


def test_hooks_added_from_outside_are_named_at_capture_in_show_and_on_load(repo, tmp_path) -> None:
    torch.manual_seed(0)
    model = Outer()
    model.head.register_forward_hook(clip_output)  # added by the job, after construction
    with pytest.warns(modulelens.CaptureWarning, match=r"hooks added after construction are not rebuilt.*"
                                                       r"head: forward hook hook_models:clip_output"):
        with modulelens.capture(model, targets=[""], repo=repo, name="outside") as cap:
            model(torch.randn(4, 8))
    meta = json.loads((repo.root / "names" / "outside" / "versions" / "1" / "capture.json").read_text())
    assert meta["module"]["tree"]["head"]["hooks"] == [
        {"kind": "forward", "hook": "hook_models:clip_output", "rebuilt": False}]
    # the module's own hooks (inner) are rebuilt by its constructor: not named
    assert all(h["rebuilt"] for h in meta["module"]["tree"]["inner"]["hooks"])
    shown = CliRunner().invoke(app, ["show", "outside", "--repo", str(repo.root)])
    assert shown.exit_code == 0, shown.output
    assert "hooks not rebuilt: head: forward hook hook_models:clip_output" in shown.output
    described = json.loads(CliRunner().invoke(app, ["show", "outside", "--repo", str(repo.root), "--json"]).output)
    assert described["result"]["hooks_not_rebuilt"] == ["head: forward hook hook_models:clip_output"]
    replayed = _replay_elsewhere(repo, cap.saved[0].ref, tmp_path)
    assert any("hook_models:clip_output" in note for note in replayed["notes"])


def test_hooks_transformers_installs_at_the_first_call_are_installed_again_by_the_rebuilt_model(repo, tmp_path) -> None:
    """transformers 5 installs the forward hooks that collect ``hidden_states`` at the first call
    that asks for them and marks the model ``_output_capturing_hooks_installed``. That flag is not restored (the rebuilt
    model would then skip its hooks and return no hidden states: aya_vision in the census), and the
    hooks are not called missing: the rebuilt model installs them itself."""
    transformers = pytest.importorskip("transformers")
    with modulelens.track_init():
        model = transformers.LlamaModel(transformers.LlamaConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1))
    ids = torch.randint(0, 64, (1, 5))
    model(ids, output_hidden_states=True)  # the job's first call installs the hooks
    assert model._output_capturing_hooks_installed
    with modulelens.capture(model, targets=[""], repo=repo, name="llama", strict=True) as cap:
        out = model(ids, output_hidden_states=True)
    assert len(out.hidden_states) == 3
    meta = json.dumps(repo.read_metadata("llama", 1))
    assert "_output_capturing_hooks_installed" not in meta
    result = _replay_elsewhere(repo, cap.saved[0].ref, tmp_path)
    assert result["status"] == "PASS" and result["mode"] == "bit-exact", result["report"]
    assert not any("hook" in note for note in result["notes"]), result["notes"]
