"""``call.context()`` is scoped: the module is as it was after the block; a replay with the module's
current weights of a capture taken while training says why its calls fail.

The capture is a real training run: a small MLP with BatchNorm and Dropout, trained by SGD for
three steps, each step's call recorded (three weight states); the model is at its defaults
(training mode, running statistics on).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import modulelens


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 4))


@pytest.fixture
def training_capture(repo: modulelens.Repo) -> modulelens.Capture:
    torch.manual_seed(0)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    with modulelens.capture(model, targets=["."], repo=repo, name="train", strict=True,
                            record=modulelens.Recording(max_calls=3)) as cap:
        for _ in range(3):
            loss = model(torch.randn(32, 8)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    cap_loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    assert len({call.state_index for call in cap_loaded.calls}) == 3
    return cap_loaded


def _snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_context_runs_the_call_and_puts_the_module_back(training_capture: modulelens.Capture) -> None:
    cap = training_capture
    module = cap.module
    assert module.training  # recorded in training mode: it comes back in that mode (docs: "the module's mode")
    module.eval()
    x = torch.randn(4, 8)
    before, before_out = _snapshot(module), module(x)
    call = cap.calls[2]  # another weight state than the module holds
    with call.context() as running:
        assert running is module and running.training
        out = running(*call.args, **call.kwargs)
    assert torch.equal(out, call.output)  # the call as recorded: its weights, mode, dropout masks
    assert not module.training  # the mode it had, every submodule
    assert all(not sub.training for sub in module.modules())
    assert _same(_snapshot(module), before)  # its weights and running statistics, though the call updated them
    assert torch.equal(module(x), before_out)


def test_context_keeps_the_users_edits(training_capture: modulelens.Capture) -> None:
    cap = training_capture
    module = cap.module
    with torch.no_grad():
        module[0].weight.mul_(3)  # an edit: the module holds no recorded state now
    assert cap.held_state is None
    edited = _snapshot(module)
    call = cap.calls[1]
    with call.context():
        assert torch.equal(module(*call.args, **call.kwargs), call.output)
    assert _same(_snapshot(module), edited)


def test_context_on_another_module_restores_what_its_forward_changed(training_capture: modulelens.Capture) -> None:
    cap = training_capture
    other = _model()
    other.load_state_dict(cap.fresh_state_dict(0))
    other.eval()
    before = _snapshot(other)
    call = cap.calls[0]
    with call.context(other, weights=False):
        assert other.training  # the call ran in training mode: BatchNorm updates its running statistics
        other(*call.args, **call.kwargs)
        assert not torch.equal(other[1].running_mean, before["1.running_mean"])
    assert not other.training and _same(_snapshot(other), before)


def test_module_kept_puts_back_a_state_switch(training_capture: modulelens.Capture) -> None:
    cap = training_capture
    assert cap.held_state is None  # not built yet
    assert cap.module is not None and cap.held_state == 0
    with cap.module_kept():
        cap.use_state(2)
        assert cap.held_state == 2
    assert cap.held_state == 0 and _same(_snapshot(cap.module), cap.fresh_state_dict(0))


def test_replay_keeps_the_module_as_it_was(training_capture: modulelens.Capture) -> None:
    cap = training_capture
    with torch.no_grad():
        cap.module[4].bias.add_(1)
    edited = _snapshot(cap.module)
    assert cap.replay().passed  # each call on its recorded weights ...
    assert _same(_snapshot(cap.module), edited)  # ... and the edit is still there


def test_current_weights_replay_of_several_states_says_why_calls_fail(training_capture: modulelens.Capture) -> None:
    """Unedited, the module holds the first call's weights: the other two calls must fail, and say why."""
    report = training_capture.replay(weights="current")
    assert report.status == "FAIL"
    assert [c.status for c in report.calls] == ["pass", "fail", "fail"]
    text = str(report)
    assert "recorded with 3 different weight states" in text
    assert "the module holds the weights of calls 0, so the other calls differ even without an edit" in text
    assert "replay with the recorded weights" in text
    assert training_capture.replay(weights="current", calls=[0]).passed  # one state: no such note needed
    assert "different weight states" not in str(training_capture.replay(weights="current", calls=[0]))


def test_ml_replay_current_weights_shows_the_hint(training_capture: modulelens.Capture, repo: modulelens.Repo) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "modulelens")
    shell.run_line_magic("ml_load", f"{training_capture.ref} --repo {repo.root}")
    report = shell.run_line_magic("ml_replay", "capture --current-weights")
    assert report.status == "FAIL" and "different weight states" in repr(report)
    assert shell.run_line_magic("ml_replay", "capture --current-weights --calls 0").passed
