"""Capture -> save -> load in a fresh subprocess -> replay bit-exact, for several module kinds."""

from __future__ import annotations

import json
import random
import subprocess

import pytest
import torch
from child_process import PYTHON, subprocess_env
from modules_for_tests import DictToTuple, KeywordModule, Wrapper
from torch import nn

import modulelens


def _cases() -> dict[str, tuple[nn.Module, list[tuple[tuple, dict]]]]:
    torch.manual_seed(0)
    seq = torch.randn(5, 3, 8)
    return {
        "linear": (nn.Linear(8, 4), [((torch.randn(3, 8),), {})]),
        "mha": (nn.MultiheadAttention(8, 2, batch_first=True),
                [((torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8)), {"need_weights": True})]),
        "encoder_layer": (nn.TransformerEncoderLayer(8, 2, dim_feedforward=16), [((seq,), {}), ((seq[:3],), {})]),
        "keyword": (KeywordModule(8, d_out=3, activation=nn.Tanh, scale=2.0, layers=(6, 5)), [((torch.randn(4, 8),), {})]),
        "dict_tuple": (DictToTuple(8), [(({"q": torch.randn(3, 8), "k": torch.randn(4, 8)},), {"normalise": False})]),
        "wrapper": (Wrapper(KeywordModule(8, 8, scale=3.0), residual=False), [((torch.randn(2, 8),), {})]),
    }


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    repo_path = tmp_path_factory.mktemp("roundtrip") / "repo"
    refs = {}
    for case, (module, calls) in _cases().items():
        module.train(case == "encoder_layer")  # dropout active: replay needs the recorded RNG state
        with modulelens.capture(module, targets=[type(module).__name__], repo=repo_path, name=case,
                                record=modulelens.Recording(max_calls=len(calls))) as cap:
            for args, kwargs in calls:
                module(*args, **kwargs)
        assert len(cap.saved) == 1
        refs[case] = cap.saved[0].ref
    out = subprocess.run([PYTHON, "-m", "replay_worker", str(repo_path), *refs.values()], env=subprocess_env(),
                         capture_output=True, text=True, timeout=300, check=True)
    by_ref = json.loads(out.stdout)
    return {case: by_ref[ref] for case, ref in refs.items()}


@pytest.mark.parametrize("case", ["linear", "mha", "encoder_layer", "keyword", "dict_tuple", "wrapper"])
def test_fresh_process_replay_is_bit_exact(replayed: dict[str, dict], case: str) -> None:
    result = replayed[case]
    assert result.get("error") is None, result.get("error")
    assert result["passed"], result["text"]
    assert result["mode"] == "bit-exact"


def test_every_recorded_call_is_replayed(replayed: dict[str, dict]) -> None:
    assert replayed["encoder_layer"]["calls"] == 2


def test_rebuilt_module_has_recorded_constructor_arguments(repo: modulelens.Repo) -> None:
    module = KeywordModule(8, d_out=3, activation=nn.Tanh, scale=2.0, layers=(6, 5))
    with modulelens.capture(module, targets="KeywordModule", repo=repo, name="kw"):
        module(torch.randn(2, 8))
    restored = modulelens.load("kw", repo=repo).module
    assert isinstance(restored.act, nn.Tanh)
    assert restored.scale == 2.0
    assert [layer.out_features for layer in restored.layers] == [6, 5, 3]
    for name, tensor in module.state_dict().items():
        assert torch.equal(restored.state_dict()[name], tensor)


def test_nested_module_argument_is_rebuilt_from_its_own_record(repo: modulelens.Repo) -> None:
    inner = KeywordModule(8, 8, scale=3.0)
    outer = Wrapper(inner, residual=False)
    with modulelens.capture(outer, targets="Wrapper", repo=repo, name="wrap"):
        outer(torch.randn(2, 8))
    meta = repo.read_metadata("wrap", 1)
    root = meta["constructions"][meta["module"]["construction"]]
    assert root["args"][0] == {"$type": "module", "ref": "m1"}
    assert meta["constructions"]["m1"]["class"] == "modules_for_tests:KeywordModule"
    restored = modulelens.load("wrap", repo=repo).module
    assert restored.inner.scale == 3.0 and restored.residual is False


def test_aliased_inputs_stay_aliased_on_replay(repo: modulelens.Repo) -> None:
    attn = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    with modulelens.capture(attn, targets="MultiheadAttention", repo=repo, name="self_attn"), torch.no_grad():
        attn(x, x, x)  # query is key is value: torch takes its fused self-attention path
    capture = modulelens.load("self_attn", repo=repo)
    args, _ = capture.calls[0].fresh_inputs()
    assert args[0] is args[1] is args[2]
    report = capture.replay()
    assert report.passed and report.mode == "bit-exact", report


def test_replay_twice_with_batchnorm_and_several_states(repo: modulelens.Repo) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with modulelens.capture(model, targets="Sequential", repo=repo, name="bn", record=modulelens.Recording(max_calls=3)):
        for _ in range(3):
            model(torch.randn(8, 4)).sum().backward()
            optimizer.step()
    capture = modulelens.load("bn", repo=repo)
    recorded = {k: v.clone() for k, v in capture.state_dict(0).items()}
    assert len(capture.metadata["states"]) == 3
    first, second = capture.replay(), capture.replay()
    assert first.passed and second.passed, (first, second)
    for key, value in capture.state_dict(0).items():
        assert torch.equal(value, recorded[key]), key  # running the module never changed the record


def test_loading_leaves_the_global_random_generators_alone(repo: modulelens.Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    """A seeded job that loads a capture draws what it would have drawn without the load: the
    bit-rot sample of a large payload picks its chunks with a generator of its own."""
    import numpy as np

    from modulelens.repo import local

    module = nn.Linear(1100, 1024)  # a 4.5 MB weight: over WHOLE_CHECK_MAX_BYTES, so sampled
    with modulelens.capture(module, targets="Linear", repo=repo, name="lin"):
        module(torch.randn(2, 1100))
    assert modulelens.load("lin", repo=repo).module is not None  # hashed in full once, then marked
    sampled = []
    check = local.sampled_check
    monkeypatch.setattr(local, "sampled_check", lambda *a, **k: sampled.append(check(*a, **k)) or sampled[-1])
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    states = random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()
    loaded = modulelens.load("lin", repo=repo)
    assert torch.equal(loaded.module.weight, module.weight) and loaded.replay().passed
    assert True in sampled  # the weight was sampled, not hashed in full
    assert random.getstate() == states[0]
    assert (np.random.get_state()[1] == states[1]).all()
    assert torch.equal(torch.get_rng_state(), states[2])
