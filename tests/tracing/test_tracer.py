"""The tracer: target matching, warm-up, early stop, input snapshots, fail-open."""

from __future__ import annotations

import warnings

import pytest
import torch
from method_models import Pipeline
from modules_for_tests import InPlace, Tower
from torch import nn

import modulelens
from modulelens.errors import CaptureError, CaptureWarning, UsageError
from modulelens.tracing.runner import RunConfig
from modulelens.tracing.tracer import Tracer


def _all_hooks(model: nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def test_targets_match_globs_and_class_names() -> None:
    model = Tower()
    tracer = Tracer(model, ["blocks.*.0", "KeywordModule"])
    assert sorted(tracer.records) == ["blocks.0.0", "blocks.1.0", "blocks.2.0", "head"]
    tracer.stop()


def test_no_matching_target_is_a_clear_error() -> None:
    with pytest.raises(modulelens.ModulelensError, match="no submodule matches"):
        Tracer(Tower(), ["decoder.*"])


def test_option_groups_refuse_bad_values_before_the_job_runs() -> None:
    for bad in ({"warmup": -1}, {"max_calls": 0}, {"sync_timeout": 0}, {"ranks": "some"}):
        with pytest.raises(UsageError):
            modulelens.Recording(**bad)
    with pytest.raises(UsageError, match=r"PayloadPolicy\(max_bytes=...\) must be a number of bytes"):
        modulelens.PayloadPolicy(max_bytes=-1)
    assert modulelens.Recording(ranks=[2, 0]).ranks == (0, 2) and modulelens.Recording(ranks="all").ranks == "all"
    assert RunConfig(targets=["x"]).recording() == modulelens.Recording()  # `modulelens run` defaults are capture's


def test_early_stop_removes_every_hook_and_fires_on_complete(repo: modulelens.Repo) -> None:
    model = Tower()
    before = _all_hooks(model)
    fired = []
    with modulelens.capture(model, targets=["blocks.*.0", "head"], repo=repo,
                            record=modulelens.Recording(warmup=2, max_calls=2),
                            on_complete=lambda t: fired.append(_all_hooks(model))) as cap:
        assert _all_hooks(model) == before + 8
        for _step in range(3):
            model(torch.randn(2, 8))
            assert not cap.complete
        model(torch.randn(2, 8))  # 4th call: warm-up 2 + recorded 2 -> done
        assert cap.complete
        assert fired == [before]  # hooks were already gone when on_complete ran
        assert _all_hooks(model) == before
        assert cap.tracer.active_hooks == 0
        model(torch.randn(2, 8))  # later steps are not recorded
    record = cap.records["head"]
    assert [c.index for c in record.calls] == [2, 3]
    assert record.seen_calls == 4
    assert len(cap.saved) == 4


def test_in_place_op_inside_forward_does_not_corrupt_recorded_inputs(repo: modulelens.Repo) -> None:
    model = InPlace()
    x = torch.randn(3, 4)
    original = x.clone()
    with modulelens.capture(model, targets="InPlace", repo=repo, name="inplace"):
        model(x)
    assert not torch.equal(x, original)  # the module really did modify its input
    capture = modulelens.load("inplace", repo=repo)
    assert torch.equal(capture.calls[0].args[0], original)
    assert capture.replay().passed


def test_state_is_recorded_again_after_an_optimizer_step(repo: modulelens.Repo) -> None:
    model = Tower()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    with modulelens.capture(model, targets="head", repo=repo, name="opt", record=modulelens.Recording(max_calls=3)):
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
    capture = modulelens.load("opt/head", repo=repo)
    assert [c.state_index for c in capture.calls] == [0, 1, 2]
    report = capture.replay()
    assert report.passed, report


class _Checkpointed(nn.Module):
    """A block run through gradient checkpointing, as transformers' gradient_checkpointing_enable() does."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 8), nn.GELU())
        self.head = nn.Linear(8, 1)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=self.reentrant))


@pytest.mark.parametrize("reentrant", [True, False])
def test_a_checkpointed_target_records_each_step_once(repo: modulelens.Repo, reentrant: bool) -> None:
    """Gradient checkpointing runs the target's forward again inside the backward; the reentrant form
    runs it whole, and those runs were recorded as calls of their own (4 for 2 steps, using up
    max_calls). Only the job's forward calls are recorded, and each replays."""
    torch.manual_seed(0)
    model = _Checkpointed(reentrant)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(4, 8, requires_grad=True)
    with modulelens.capture(model, targets="block", repo=repo, name="ckpt", record=modulelens.Recording(max_calls=5)):
        for _ in range(2):
            model(x).sum().backward()
            optimizer.step()
    capture = modulelens.load("ckpt/block", repo=repo)
    assert [c.state_index for c in capture.calls] == [0, 1]
    report = capture.replay()
    assert report.passed, report



def _graph(traced: torch.jit.ScriptModule) -> list[tuple[str, list[str]]]:
    """Each node of a traced graph: its op and the names of the values it makes."""
    return [(node.kind(), [value.debugName() for value in node.outputs()]) for node in traced.inlined_graph.nodes()]


def test_a_jit_trace_during_a_capture_is_the_jobs_own_and_not_recorded(repo: modulelens.Repo) -> None:
    """torch.jit.trace runs the model to build a graph. The tracer's reads of the run's values gave
    the job's trace a "might cause the trace to be incorrect" warning each and renamed its values,
    and the trace's run was recorded as a call (using up max_calls). Now the trace is the one a
    job without a capture gets, and the calls recorded are the job's own, each replayed."""
    torch.manual_seed(0)
    model = Tower()
    x = torch.randn(2, 8)
    expected = _graph(torch.jit.trace(model, x, check_trace=False))
    with modulelens.capture(model, targets="head", repo=repo, name="traced", record=modulelens.Recording(max_calls=3)):
        model(x)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            traced = torch.jit.trace(model, x + 1, check_trace=False)
        model(x + 2)
    assert not [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)], [str(w.message) for w in caught]
    assert _graph(traced) == expected
    assert torch.equal(traced(x), model(x))
    capture = modulelens.load("traced/head", repo=repo)
    assert len(capture.calls) == 2
    report = capture.replay()
    assert report.passed, report


def test_outputs_are_copied_before_later_in_place_ops(repo: modulelens.Repo) -> None:
    lin = nn.Linear(4, 4)
    model = nn.Sequential(lin, nn.ReLU(inplace=True))
    x = torch.randn(8, 4)
    expected = lin(x).detach().clone()
    with modulelens.capture(model, targets="0", repo=repo, name="relu"):
        model(x)
    assert torch.equal(modulelens.load("relu/0", repo=repo).calls[0].output, expected)


def test_a_failing_capture_warns_and_leaves_the_job_running(repo: modulelens.Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    model = Tower()
    tracer = Tracer(model, ["head"])

    def broken(*_args: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(tracer, "_on_enter", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model(torch.randn(2, 8))
    assert out.shape == (2, 2)
    assert any("disk on fire" in str(w.message) for w in caught)
    assert tracer.active_hooks == 0


def test_strict_mode_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Tower()
    tracer = Tracer(model, ["head"], strict=True)
    monkeypatch.setattr(tracer, "_on_enter", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        model(torch.randn(2, 8))


def _refuse_forward_hooks(module: nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    """``module`` takes a pre-hook but no forward hook (as a wrapper class that refuses them)."""
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("forward hooks are not supported on this module")

    monkeypatch.setattr(module, "register_forward_hook", refuse)


def test_a_target_that_cannot_be_hooked_is_dropped_and_the_others_record(repo: modulelens.Repo,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Attaching to a target failed past its pre-hook: that target is dropped with a warning, its
    pre-hook taken off again, and the job and the other targets go on (it stopped the job before
    its first step, out of ``capture(...)``)."""
    model = Tower()
    _refuse_forward_hooks(model.blocks[1], monkeypatch)
    with pytest.warns(CaptureWarning, match=r"capture of blocks\.1 failed and was dropped: forward hooks are not"):
        cap = modulelens.capture(model, ["blocks.1", "head"], repo=repo, name="tower")
    assert not model.blocks[1]._forward_pre_hooks
    with cap:
        model(torch.randn(2, 8))
    assert "blocks.1: capture failed: RuntimeError: forward hooks are not supported" in cap.tracer.why_not_recorded(
        "blocks.1")
    assert len(cap.tracer.records["head"].calls) == 1 and cap.tracer.active_hooks == 0
    with pytest.raises(RuntimeError, match="forward hooks are not supported"):
        modulelens.capture(model, ["blocks.1"], repo=None, strict=True)
    assert not model.blocks[1]._forward_pre_hooks


def test_a_usage_error_in_the_targets_leaves_no_hook_on_the_others() -> None:
    model = Pipeline()
    with pytest.raises(UsageError, match="Linear has no method 'encod'"):  # after vae got its hooks
        modulelens.capture(model, ["vae", "head:encod"], repo=None)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def test_grad_mode_and_training_flag_are_recorded(repo: modulelens.Repo) -> None:
    model = Tower().eval()
    with modulelens.capture(model, targets="head", repo=repo, name="modes"), torch.no_grad():
        model(torch.randn(2, 8))
    call = modulelens.load("modes/head", repo=repo).calls[0]
    assert call.training is False and call.grad_enabled is False


def test_track_init_is_idempotent_and_a_context_manager() -> None:
    from modulelens.tracing.init_tracking import is_tracking

    assert is_tracking()  # the session fixture turned it on
    with modulelens.track_init():
        lin = nn.Linear(2, 3, bias=False)
    assert is_tracking()  # still on: the outer handle owns it
    record = modulelens.get_init_record(lin)
    assert record is not None and record.args == (2, 3) and record.kwargs == {"bias": False}


def test_a_forward_that_raises_inside_the_target_is_dropped(repo: modulelens.Repo) -> None:
    lin = nn.Linear(2, 2)
    cap = modulelens.capture(lin, targets="Linear", repo=repo, name="raise")
    with pytest.raises(RuntimeError):
        lin(torch.randn(1, 3))  # wrong shape: forward raises
    assert cap.records[""].calls == [] and not cap.complete
    lin(torch.randn(1, 2))
    assert cap.complete and cap.records[""].calls[0].index == 1


def test_weight_updates_through_data_are_recorded_as_new_states(repo: modulelens.Repo) -> None:
    """``p.data.add_()`` does not bump version counters; each call must still get the weights it saw."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    with modulelens.capture(model, targets=["0"], repo=repo, record=modulelens.Recording(max_calls=3)) as cap:
        for _step in range(3):
            loss = model(x).square().sum()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-0.1)  # the update of many hand-written loops
                    p.grad = None
    loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    assert [c.state_index for c in loaded.calls] == [0, 1, 2]
    assert not torch.equal(loaded.state_dict(0)["weight"], loaded.state_dict(1)["weight"])
    report = loaded.replay()
    assert report.passed, report


@pytest.mark.parametrize("features", [8, 600])  # hashed in place (< 1 MiB) / summed on its device
def test_one_element_written_through_data_is_a_new_state(repo: modulelens.Repo, features: int) -> None:
    model = nn.Linear(features, features)
    with modulelens.capture(model, targets=["Linear"], repo=repo, record=modulelens.Recording(max_calls=3)) as cap, \
            torch.no_grad():
        model(torch.randn(2, features))
        model.weight.data[3, 5] += 0.5  # keeps the version counter
        model(torch.randn(2, features))
        model(torch.randn(2, features))
    loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    assert [c.state_index for c in loaded.calls] == [0, 1, 1]
    assert loaded.replay().passed


def test_weights_permuted_through_data_are_a_new_state(repo: modulelens.Repo) -> None:
    """A permutation keeps every element's value, so a sum of the bits misses it; small weights are
    fingerprinted by a hash of their bytes, which does not."""
    model = nn.Linear(4, 4)
    with modulelens.capture(model, targets=["Linear"], repo=repo, record=modulelens.Recording(max_calls=2)) as cap, \
            torch.no_grad():
        model(torch.randn(2, 4))
        model.weight.data.copy_(model.weight.data.flip(0))
        model(torch.randn(2, 4))
    loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    assert [c.state_index for c in loaded.calls] == [0, 1]
    assert loaded.replay().passed


def test_unchanged_weights_share_one_state(repo: modulelens.Repo) -> None:
    model = nn.Linear(4, 4)
    with modulelens.capture(model, targets=["Linear"], repo=repo, record=modulelens.Recording(max_calls=3)) as cap, torch.no_grad():
        for _step in range(3):
            model(torch.randn(2, 4))
    assert [c.state_index for c in modulelens.load(cap.saved[0].ref, repo=repo).calls] == [0, 0, 0]


class _TwoLayers(nn.Module):
    """A class of the tests' own: an in-place compile skips the frames of torch's own modules."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


@pytest.mark.parametrize("in_place", [False, True], ids=["wrapper", "module.compile"])
def test_a_target_in_a_fullgraph_compiled_model_is_dropped_and_the_job_runs(repo: modulelens.Repo,
                                                                          in_place: bool) -> None:
    """Recording a module that runs in a compiled graph needs a graph break at its hooks, which
    torch.compile(fullgraph=True) refuses: the job stopped at its next call with dynamo's
    "Skip calling torch.compiler.disable()d function". Now the target is dropped with a warning
    that says so, and the job runs; strict=True raises instead."""
    torch.manual_seed(0)
    model = _TwoLayers()
    x = torch.randn(3, 4)
    expected = model(x)
    if in_place:
        model.compile(backend="eager", fullgraph=True)
    compiled = model if in_place else torch.compile(model, backend="eager", fullgraph=True)
    compiled(x)
    with pytest.warns(CaptureWarning, match=r"head runs in a torch.compile\(fullgraph=True\) graph"), \
            modulelens.capture(compiled, targets="head", repo=repo, name="full") as cap:
        for _ in range(2):
            assert torch.equal(compiled(x), expected)
    assert cap.saved == []
    with pytest.raises(CaptureError, match="fullgraph=False while capturing"):
        modulelens.capture(compiled, targets="head", repo=repo, name="full", strict=True).__enter__()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
