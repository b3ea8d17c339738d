"""Issue 34, defect 5: modules run through methods other than ``module(...)``.

A target ``PATTERN:METHOD`` records the calls of that method (tracing/methods.py) and replays them
through it. The libraries' own modules (census/families/methods.py builds them as the census does)
are captured here and replayed in ONE fresh process; the not-captured messages say what happened.
"""

from __future__ import annotations

import copy
import functools
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from child_process import PYTHON, replay_in_fresh_process, subprocess_env
from method_models import OwnCall, Pipeline, TinyVAE

import modulelens
from modulelens.errors import CorruptCaptureError, KernelError, UsageError
from modulelens.format.validate import validate_capture

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"
sys.path.insert(0, str(ROOT))

from census.families import methods as library_targets  # noqa: E402


def test_a_method_target_records_its_calls_and_replays_through_the_method(tmp_path: Path) -> None:
    model = Pipeline()
    other = TinyVAE()  # another instance of the same class: not a target, runs unchanged
    x = torch.randn(4, 6)
    with modulelens.capture(model, ["vae:encode", "vae:decode", "vae:forward"], repo=tmp_path / "repo",
                            name="pipe") as cap:
        mean, _ = model.vae.encode(x, temperature=0.5)
        model.vae.decode(mean)
        model.vae.forward(x)  # called directly: forward hooks never see it
        other.encode(x)
    assert sorted(v.name for v in cap.saved) == ["pipe/vae.decode", "pipe/vae.encode", "pipe/vae.forward"]
    assert "encode" in TinyVAE.__dict__ and not hasattr(TinyVAE.__dict__["encode"], "__modulelens_wrapped__")
    assert "__call__" not in TinyVAE.__dict__  # the class is as it was
    encode = modulelens.load("pipe/vae.encode", repo=tmp_path / "repo")
    assert encode.method == "encode" and len(encode.calls) == 1  # the other instance's call is not recorded
    assert encode.calls[0].kwargs == {"temperature": 0.5}
    assert encode.metadata["format_version"] == 3 and encode.metadata["module"]["qualified_name"] == "vae"
    with encode.calls[0].context():
        out = encode.entry_point()(*encode.calls[0].args, **encode.calls[0].kwargs)
    assert torch.equal(out[0], encode.calls[0].output[0])
    results = replay_in_fresh_process(tmp_path / "repo", {v.name: v.ref for v in cap.saved})
    assert {label: r["status"] for label, r in results.items()} == dict.fromkeys(results, "PASS")
    assert all(r["mode"] == "bit-exact" for r in results.values())


def test_a_module_capture_keeps_format_version_2(tmp_path: Path) -> None:
    """An older reader still reads every capture that has no method (format/spec.py)."""
    model = Pipeline()
    with modulelens.capture(model, ["vae"], repo=tmp_path / "repo", name="pipe") as cap:
        model(torch.randn(2, 6))
    meta = modulelens.load(cap.saved[0].ref, repo=tmp_path / "repo").metadata
    assert meta["format_version"] == 2 and "method" not in meta["module"]


def test_the_root_methods_and_own_call_classes(tmp_path: Path) -> None:
    model = OwnCall()
    with modulelens.capture(model, [":__call__", ":forward"], repo=tmp_path / "repo", name="own") as cap:
        model(torch.randn(2, 3))
    assert sorted(v.name for v in cap.saved) == ["own.__call__", "own.forward"]
    call = modulelens.load("own.__call__", repo=tmp_path / "repo")
    assert isinstance(call.calls[0].output, dict) and call.replay().passed
    assert "__call__" in OwnCall.__dict__ and OwnCall.__dict__["__call__"].__qualname__ == "OwnCall.__call__"


@pytest.mark.parametrize("name", list(library_targets.TARGETS))
def test_library_entry_points_are_captured(tmp_path: Path, name: str) -> None:
    """Each library's own module, run as its users run it, in eval and training mode; replayed
    bit-exact in a fresh process."""
    build, job_of, labels = library_targets.TARGETS[name]
    torch.manual_seed(0)
    model = build()
    model.eval()
    job = job_of(model)
    refs = {}
    for mode in ("eval", "train"):
        model.train(mode == "train")
        torch.manual_seed(1)
        with warnings.catch_warnings():
            warnings.simplefilter("error", modulelens.CaptureWarning)  # nothing dropped, nothing unrecorded
            with modulelens.capture(model, sorted(set(labels.values())), repo=tmp_path / "repo", name=mode) as cap:
                job(model)
        refs.update({f"{mode}:{v.name}": v.ref for v in cap.saved})
        assert len(cap.saved) == len(labels), (mode, [v.name for v in cap.saved])
    results = replay_in_fresh_process(tmp_path / "repo", refs)
    assert {label: r["status"] for label, r in results.items()} == dict.fromkeys(refs, "PASS"), \
        {label: r.get("report", r.get("error")) for label, r in results.items()}
    assert all(r["mode"] == "bit-exact" for r in results.values())


def test_timm_rope_get_embed(tmp_path: Path) -> None:
    from timm_support import SHIMS, import_timm

    import_timm()
    from timm.layers.pos_embed_sincos import RotaryEmbeddingCat

    rope = RotaryEmbeddingCat(dim=16, max_res=32, feat_shape=None)
    with modulelens.capture(rope, [":get_embed"], repo=tmp_path / "repo", name="rope") as cap:
        rope.get_embed(shape=[4, 4])
    assert [v.name for v in cap.saved] == ["rope.get_embed"]
    results = replay_in_fresh_process(tmp_path / "repo", {"rope": cap.saved[0].ref}, extra_path=[SHIMS])
    assert results["rope"]["status"] == "PASS" and results["rope"]["mode"] == "bit-exact", results


def test_not_captured_messages_say_what_happened(tmp_path: Path) -> None:
    model = Pipeline()
    own = OwnCall()
    with pytest.warns(modulelens.CaptureWarning) as caught:
        with modulelens.capture(model, ["vae", "vae:decode"], repo=tmp_path / "repo", name="p"):
            model.vae.forward(torch.randn(2, 6))  # forward called directly; decode runs inside it, recorded
        with modulelens.capture(model, ["vae:encode"], repo=tmp_path / "repo", name="q"):
            model.vae.decode(torch.randn(2, 2))  # encode never called
        with modulelens.capture(model, ["head"], repo=tmp_path / "repo", name="w",
                                record=modulelens.Recording(warmup=3)):
            model(torch.randn(2, 6))
        with modulelens.capture(own, ["."], repo=tmp_path / "repo", name="o"):
            own(torch.randn(1, 3))
    messages = [str(w.message) for w in caught]
    assert any("vae (TinyVAE) was never called as module(...)" in m and "'vae:forward'" in m for m in messages)
    assert any("vae:encode: TinyVAE.encode() was never called on this module" in m for m in messages)
    assert any("head (Linear) was called 1 time(s), all skipped as warm-up (warmup=3)" in m for m in messages)
    assert any("method_models.OwnCall defines its own __call__, which runs no forward hook" in m
               and "':__call__'" in m for m in messages), messages
    assert not any("after warm-up" in m for m in messages)


def test_a_method_that_does_not_exist_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"TinyVAE has no method 'encod' \(methods with that in their name: encode\)"):
        modulelens.capture(Pipeline(), ["vae:encod"], repo=None)
    with pytest.raises(UsageError, match=r"Pipeline\.dump_patches is a bool, not a method"):
        modulelens.capture(Pipeline(), [":dump_patches"], repo=None)


def test_a_stored_method_may_not_name_another_dunder(tmp_path: Path) -> None:
    model = Pipeline()
    with modulelens.capture(model, ["vae:decode"], repo=tmp_path / "repo", name="p") as cap:
        model.vae.decode(torch.randn(1, 2))
    meta = modulelens.load(cap.saved[0].ref, repo=tmp_path / "repo").metadata
    meta["module"]["method"] = "__init__"
    with pytest.raises(CorruptCaptureError, match=r"module\.method"):
        validate_capture(meta, "capture.json")


SCRIPT = textwrap.dedent('''
    import torch, transformers
    from method_models import TinyVAE
    config = transformers.BartConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=32)
    bart = transformers.BartForConditionalGeneration(config).eval()
    bart.generate(torch.randint(3, 64, (1, 6)), max_new_tokens=2, do_sample=False)
    vae = TinyVAE()
    for _ in range(2):
        vae.decode(vae.encode(torch.randn(2, 6))[0])
    print("END", flush=True)
''')


def test_run_captures_methods_and_a_submodule_called_before_its_model(tmp_path: Path) -> None:
    """``modulelens run``: BART's encoder runs (inside generate) before the model's first forward;
    a second model's targets are captured later without a warning at the first model; a method
    target of a module whose first module call ran inside that method records its later calls."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    result = subprocess.run([PYTHON, "-m", "modulelens", "run", "--repo", str(tmp_path / "repo"), "--json",
                             "-t", "model.encoder", "-t", "TinyVAE:encode", "-t", "TinyVAE:decode", "--",
                             PYTHON, str(script)], capture_output=True, text=True, env=subprocess_env(), timeout=600,
                            cwd=tmp_path)
    out = json.loads(result.stdout)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(s["name"] for s in out["result"]["saved"]) == [
        "BartForConditionalGeneration/model.encoder", "TinyVAE.decode", "TinyVAE.encode"]
    assert "matches no module" not in result.stderr and "END" in result.stderr
    results = replay_in_fresh_process(tmp_path / "repo", {s["name"]: s["ref"] for s in out["result"]["saved"]})
    assert {label: r["status"] for label, r in results.items()} == dict.fromkeys(results, "PASS")


def test_the_tools_run_a_method_capture_through_its_method(tmp_path: Path) -> None:
    """verify, diff and profile call ``module.encode``, not ``module(...)``; the kernel export refuses."""
    from modulelens.kernels import export_kernelbench
    from modulelens.tools.diff import output_differences

    model = Pipeline()
    for version in range(2):
        with modulelens.capture(model, ["vae:encode"], repo=tmp_path / "repo", name="p"):
            model.vae.encode(torch.randn(3, 6), temperature=0.5)
        if version == 0:
            with torch.no_grad():
                model.vae.encoder[0].weight.mul_(2)
    first = modulelens.load("p/vae.encode:v1", repo=tmp_path / "repo")
    second = modulelens.load("p/vae.encode:v2", repo=tmp_path / "repo")
    report = modulelens.verify(first, TinyVAE, timing=None, store=False)
    assert report.passed, report
    [row] = output_differences(first, second)
    assert row["error"] is None and row["same"] is False and row["max_abs_error"] > 0
    profiled = modulelens.profile(first, timing=modulelens.TimingConfig(warmup=1, iters=3, target_seconds=0.05))
    # the encoder's two Linears on 3 rows (2*3*6*8 + 2*3*8*4): forward would add the decoder's
    assert profiled.flops["total"] == 480, profiled.flops
    with pytest.raises(KernelError, match=r"recorded calls of encode\(\), not of forward"):
        export_kernelbench(first, tmp_path / "problem")


def test_torchmetrics_update_and_compute_are_recorded_with_each_calls_metric_state(tmp_path: Path) -> None:
    """A torchmetrics ``Metric`` binds ``update`` and ``compute`` to the instance in ``__init__``:
    targets ``:update``/``:compute`` recorded nothing and said the method was never called. And its
    running state (``add_state``: plain attributes, not buffers) was not part of a call's state, so
    every call shared the first snapshot: ``compute`` calls after the first, and a running mean's
    later calls, FAILed (found testing torchmetrics)."""
    build, job, _ = library_targets.TARGETS["torchmetrics.MeanSquaredError"]
    metric = build()
    running = library_targets.TARGETS["torchmetrics.RunningMean"][0]()
    repo = tmp_path / "repo"
    with warnings.catch_warnings():
        warnings.simplefilter("error", modulelens.CaptureWarning)
        with modulelens.capture(metric, [":update", ":compute"], repo=repo, name="mse",
                                record=modulelens.Recording(max_calls=3)) as cap:
            job(metric)(metric)
        with modulelens.capture(running, [""], repo=repo, name="mean",
                                record=modulelens.Recording(max_calls=3, warmup=1)) as cap_running:
            library_targets.TARGETS["torchmetrics.RunningMean"][1](running)(running)
    assert {v.name: v.calls for v in [*cap.saved, *cap_running.saved]} == {"mse.update": 3, "mse.compute": 3, "mean": 3}
    compute = modulelens.load("mse.compute", repo=repo)
    assert [call.state_index for call in compute.calls] == [0, 1, 2]  # the running sums differ at each
    assert compute.replay(calls=[2]).passed and compute.replay(calls=[1]).passed  # alone, in any order
    results = replay_in_fresh_process(repo, {"compute": "mse.compute", "mean": "mean"})
    assert {label: (r["status"], r["mode"]) for label, r in results.items()} == {
        "compute": ("PASS", "bit-exact"), "mean": ("PASS", "bit-exact")}, results


class BindsItsStep(torch.nn.Module):
    """Binds a wrapped ``step`` to the instance in ``__init__``, as torchmetrics does with ``update``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        inner = self.step
        self.step = functools.wraps(inner)(lambda *args, **kwargs: inner(*args, **kwargs))

    def step(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def test_a_method_bound_to_the_instance_is_recorded_and_given_back(tmp_path: Path) -> None:
    module = BindsItsStep()
    own = vars(module)["step"]
    with modulelens.capture(module, [":step"], repo=tmp_path / "repo", name="b",
                            record=modulelens.Recording(max_calls=2)) as cap:
        module.step(torch.randn(1, 2))
        copied = copy.deepcopy(module)  # a copy holds the library's own attribute, not the capture's
        assert vars(copied)["step"] is own
        copied.step(torch.randn(1, 2))  # (bound to the original: as without a capture)
        module.step(torch.randn(1, 2))
    assert vars(module)["step"] is own  # given back
    assert [(v.name, v.calls) for v in cap.saved] == [("b.step", 2)]
    assert modulelens.load("b.step", repo=tmp_path / "repo").replay().passed


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_gp_posterior_under_gpytorch_settings_replays_under_them(tmp_path: Path, dtype: torch.dtype) -> None:
    """botorch's ``posterior`` runs the model under ``gpytorch.settings.fast_pred_var()``: its
    replay ran without it and FAILed (a covariance 1e-16 apart, found testing botorch). The settings
    in force are recorded per call and a replay runs under them, in a fresh process."""
    gpytorch = pytest.importorskip("gpytorch")
    x = torch.linspace(0, 1, 12, dtype=dtype)
    with modulelens.track_init():
        gp = library_targets.ExactGPModel(x, torch.sin(6 * x), gpytorch.likelihoods.GaussianLikelihood()).to(dtype)
    gp.eval()
    with modulelens.capture(gp, [":__call__"], repo=tmp_path / "repo", name="gp",
                            record=modulelens.Recording(max_calls=2)) as cap:
        with gpytorch.settings.fast_pred_var():
            gp(torch.linspace(0, 1, 5, dtype=dtype))
        gp(torch.linspace(0, 1, 5, dtype=dtype))  # and without: each call's own settings
    loaded = modulelens.load(cap.saved[0].ref, repo=tmp_path / "repo")
    fast = "gpytorch.settings:fast_pred_var._state"
    assert [call.settings.get(fast) for call in loaded.calls] == [True, None]
    assert loaded.replay().passed
    assert not gpytorch.settings.fast_pred_var.on()  # the replay put the settings back
    results = replay_in_fresh_process(tmp_path / "repo", {"posterior": cap.saved[0].ref})
    assert (results["posterior"]["status"], results["posterior"]["mode"]) == ("PASS", "bit-exact"), results


def test_a_capture_may_set_no_other_setting(tmp_path: Path) -> None:
    from modulelens.format.library_settings import parse_setting

    assert parse_setting("gpytorch.settings:fast_pred_var._state", True) == ("gpytorch.settings", "fast_pred_var",
                                                                               "_state")
    for key, value in [("os:environ._state", True), ("gpytorch.settings:fast_pred_var.__class__", True),
                       ("gpytorch.settings:_feature_flag._state", True), ("gpytorch.settings:debug._state", [1])]:
        with pytest.raises(CorruptCaptureError):
            parse_setting(key, value)
