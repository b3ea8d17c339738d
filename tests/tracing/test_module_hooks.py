"""The tracer's hooks on a user's modules travel with nothing that copies the module
(tracing/module_hooks.py): a job that saves its whole model during a capture, or copies it (an EMA
model, the best model so far), keeps working as without modulelens, and only the module the
capture was asked for is recorded."""

from __future__ import annotations

import collections
import contextlib
import copy
import subprocess
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

import modulelens
from modulelens.repo import Repo
from modulelens.tracing.module_hooks import is_modulelens_hook


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_a_model_saved_whole_during_a_capture_loads_where_modulelens_is_not(tmp_path: Path) -> None:
    """``torch.save(model, path)`` while the targets' hooks are on (it raised "Can't pickle local
    object"); the file names nothing of modulelens, loads in a process where importing modulelens
    fails, and computes what the model computes; the capture goes on recording."""
    repo, model, x = Repo(tmp_path / "repo"), _model(), torch.randn(3, 8)
    saved = tmp_path / "model.pt"
    with modulelens.capture(model, ["0", "2"], repo=repo, name="m", record=modulelens.Recording(max_calls=2)) as cap:
        model(x)
        torch.save(model, saved)
        model(x)
    assert [len(cap.tracer.records[t].calls) for t in ("0", "2")] == [2, 2]
    assert b"modulelens" not in saved.read_bytes()
    torch.save(model(x).detach(), tmp_path / "expected.pt")
    check = ("import sys, torch\n"
             "sys.modules['modulelens'] = None  # any import of it fails\n"
             f"model = torch.load({str(saved)!r}, weights_only=False)\n"
             f"x, expected = torch.load({str(tmp_path / 'x.pt')!r}), torch.load({str(tmp_path / 'expected.pt')!r})\n"
             "assert torch.equal(model(x), expected)\n"
             "print('ok', len(model[0]._forward_pre_hooks), len(model[0]._forward_hooks))\n")
    torch.save(x, tmp_path / "x.pt")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok"), done.stdout


def _data_parallel_replica(module: nn.Module) -> nn.Module:
    """What ``torch.nn.parallel.replicate`` makes of a leaf module for one device (it needs CUDA to
    broadcast; here the copies stay on the CPU): a shallow copy marked ``_is_replica``, its weights
    non-leaf copies set as plain attributes and listed in ``_former_parameters``."""
    replica = module._replicate_for_data_parallel()
    replica._former_parameters = collections.OrderedDict()
    for key, param in module._parameters.items():
        assert param is not None
        copied = param * 1
        setattr(replica, key, copied)
        replica._former_parameters[key] = copied
    return replica


def test_a_deep_copy_made_during_a_capture_is_not_recorded_as_the_target(tmp_path: Path) -> None:
    """An EMA model made with ``copy.deepcopy`` while the hooks are on: its calls were recorded as
    the target's (with its weights as new states); now only the model's own calls are, and those of
    ``nn.DataParallel``'s replicas of it, with the replica's weights (a state without them before)."""
    repo, model = Repo(tmp_path / "repo"), _model()
    with modulelens.capture(model, "0", repo=repo, name="m", record=modulelens.Recording(max_calls=3)) as cap:
        model(torch.randn(2, 8))
        ema = copy.deepcopy(model)
        with torch.no_grad():
            for param in ema.parameters():
                param.mul_(0.5)
        for _ in range(3):
            ema(torch.randn(2, 8))
        shallow = copy.copy(model[0])  # another Linear sharing the target's hook tables
        shallow(torch.randn(2, 8))
        assert len(cap.tracer.records["0"].calls) == 1
        _data_parallel_replica(model[0])(torch.randn(2, 8))  # the target's call, on a device
        assert len(cap.tracer.records["0"].calls) == 2
    capture = modulelens.load("m/0", repo=repo)
    assert len(capture.calls) == 2  # the model's and its replica's (whose own copies are its state)
    for index in (0, 1):
        assert all(torch.equal(capture.state_dict(index)[k], v) for k, v in model[0].state_dict().items())
    assert torch.equal(capture.state_dict(0)["weight"], model[0].weight)
    assert capture.replay().passed
    assert not model[0]._forward_pre_hooks and not model[0]._forward_hooks  # the capture took its hooks off
    left = [*ema[0]._forward_pre_hooks.values(), *ema[0]._forward_hooks.values()]
    assert left and all(hook.__func__ is contextlib.nullcontext.__exit__ for hook in left)  # no-ops, left in
    assert all(is_modulelens_hook(hook) for hook in left)  # which a capture of the copy passes over


def test_a_deep_copy_of_a_copied_model_still_captures_when_asked(tmp_path: Path) -> None:
    """The copy is a module like any other: a capture of it records it, without a word about the
    no-ops left in its hook tables."""
    repo, model = Repo(tmp_path / "repo"), _model()
    with modulelens.capture(model, "0", repo=repo, name="m", record=modulelens.Recording(max_calls=2)):
        model(torch.randn(2, 8))
        ema = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the no-ops the copy holds are not "hooks a load will not rebuild"
        with modulelens.capture(ema, "0", repo=repo, name="ema"):
            ema(torch.randn(2, 8))
    assert len(modulelens.load("ema/0", repo=repo).calls) == 1


def test_two_captures_of_one_module_do_not_report_each_others_hooks(tmp_path: Path) -> None:
    """A capture nested in another on the same target: neither calls the other's hooks "hooks
    added after construction" (they are not the job's), and both record."""
    repo, model = Repo(tmp_path / "repo"), _model()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with modulelens.capture(model, "0", repo=repo, name="outer", record=modulelens.Recording(max_calls=2)):
            with modulelens.capture(model, "0", repo=repo, name="inner"):
                model(torch.randn(2, 8))
            model(torch.randn(2, 8))
    assert [len(modulelens.load(n, repo=repo).calls) for n in ("outer/0", "inner/0")] == [2, 1]


def test_a_torchscript_target_is_captured_and_a_load_goes_through(tmp_path: Path) -> None:
    """A scripted and a traced child as targets: torch refuses a load_state_dict hook on a
    ScriptModule ("not supported on ScriptModules"), which stopped the capture from attaching at
    all; they get none, and a ``load_state_dict`` of the whole model between calls goes through."""
    modulelens.track_init()

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.jit.script(nn.Linear(4, 4))
            self.b = torch.jit.trace(nn.Linear(4, 2), torch.randn(1, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    repo, model = Repo(tmp_path / "repo"), Net()
    with modulelens.capture(model, ["a", "b"], repo=repo, name="s", record=modulelens.Recording(max_calls=2)):
        model(torch.randn(2, 4))
        model.load_state_dict(model.state_dict())
        model(torch.randn(2, 4))
    for name in ("s/a", "s/b"):
        capture = modulelens.load(name, repo=repo)
        assert len(capture.calls) == 2 and capture.replay().passed


def _doubled(module: nn.Module, inputs: tuple[torch.Tensor], output: torch.Tensor) -> torch.Tensor:
    """A forward hook of the job's own, in TorchScript."""
    return output * 2


def test_a_model_scripted_during_a_capture_compiles_the_jobs_hooks_only(tmp_path: Path) -> None:
    """``torch.jit.script(model)`` for an export, while a capture records (hooks on): it failed, torch
    compiling our hooks; the scripted model now has the job's own hook and not ours, and its calls
    are not the target's; the capture goes on recording the model."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    model[2].register_forward_hook(_doubled)
    x = torch.randn(3, 4)
    with modulelens.capture(model, targets=["0", "2"], repo=tmp_path / "repo", name="m",
                            record=modulelens.Recording(max_calls=3)) as cap:
        expected = model(x)
        scripted = torch.jit.script(model)
        assert torch.equal(scripted(x), expected)
        assert [is_modulelens_hook(h) for h in model[2]._forward_hooks.values()] == [False, True]  # order kept
        model(x)
    assert [len(cap.tracer.records[n].calls) for n in ("0", "2")] == [2, 2]
    assert modulelens.load("m/0", repo=tmp_path / "repo").replay().passed
