"""Capture fidelity, feature by feature (issue #3): codecs, call structures, stored source,
shape-only records, shared tensors, state that decides the result, backward, dtype overrides,
wrapped models and repeated calls."""

from __future__ import annotations

import ast
import copy
import dataclasses
import enum
import functools
import json
import os
import subprocess
import sys
import textwrap
import threading
import warnings
from collections import namedtuple
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

import modulelens
from modulelens.format.shape_only import tensor_stats
from modulelens.restore.source_slice import slice_source

PACKAGE_ROOT = Path(modulelens.__file__).resolve().parent.parent


def run_python(code: str, *args: str, cwd: Path, extra_path: list[Path] | None = None,
               config_home: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that imports modulelens from this checkout; with
    ``config_home``, as another user would (another signing key: the captures are not its own)."""
    path = [str(PACKAGE_ROOT), *(str(p) for p in extra_path or [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1"}
    if config_home is not None:
        env["XDG_CONFIG_HOME"] = str(config_home)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def capture_one(model: nn.Module, target: str, repo: modulelens.Repo, drive: Any, *,
                record: modulelens.Recording = modulelens.Recording(), strict: bool = False) -> modulelens.Capture:
    with modulelens.capture(model, targets=[target], repo=repo, name="t", record=record, strict=strict) as cap:
        drive(model)
    assert cap.saved, "nothing was saved"
    return modulelens.load(cap.saved[0].ref, repo=repo)


# ============================================================================================
# 1. Constructor arguments through the codec registry
# ============================================================================================


class Mode(enum.Enum):
    SUM = "sum"
    MEAN = "mean"


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    width: int
    mode: Mode = Mode.MEAN
    scale: torch.Tensor | None = None
    derived: int = dataclasses.field(init=False, default=0)


class Point(NamedTuple):
    x: int
    y: int


class Scaled:
    """A user type taught to modulelens with register_codec."""

    def __init__(self, factor: float) -> None:
        self.factor = factor


modulelens.register_codec(Scaled, lambda s: {"factor": s.factor}, lambda cls, d: cls(**d))


class Configured(nn.Module):
    def __init__(self, config: BlockConfig, *, activation: Any, init: Any, origin: Point, scaled: Scaled,
                 dtype: torch.dtype, extras: Any) -> None:
        super().__init__()
        self.config, self.activation, self.init, self.origin = config, activation, init, origin
        self.scaled, self.extras = scaled, extras
        self.lin = nn.Linear(config.width, config.width, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.activation(self.lin(x)) * self.scaled.factor
        return y * self.config.scale if self.config.scale is not None else y


def test_builtin_and_registered_codecs_round_trip(repo: modulelens.Repo) -> None:
    config = BlockConfig(4, Mode.SUM, scale=torch.tensor([1.0, 2.0, 3.0, 4.0]))
    object.__setattr__(config, "derived", 7)
    model = nn.Sequential(Configured(
        config, activation=torch.nn.functional.gelu, init=functools.partial(torch.nn.init.normal_, std=0.02),
        origin=Point(1, 2), scaled=Scaled(0.5), dtype=torch.float32,
        extras={"size": torch.Size([2, 3]), 3: (1 + 2j, b"\x00\x01", slice(1, None), frozenset({1, 2})),
                "device": torch.device("cpu"), "type": nn.ReLU, "nan": float("nan")},
    ))
    cap = capture_one(model, "0", repo, lambda m: m(torch.randn(2, 4)), strict=True)
    module = cap.module
    assert type(module.config) is BlockConfig and module.config.width == 4 and module.config.derived == 7
    assert module.config.mode is Mode.SUM
    assert torch.equal(module.config.scale, config.scale)
    assert module.activation is torch.nn.functional.gelu
    assert isinstance(module.init, functools.partial) and module.init.keywords == {"std": 0.02}
    assert module.origin == Point(1, 2) and type(module.origin) is Point
    assert isinstance(module.scaled, Scaled) and module.scaled.factor == 0.5
    assert module.extras["size"] == torch.Size([2, 3]) and module.extras["type"] is nn.ReLU
    assert module.extras[3] == (1 + 2j, b"\x00\x01", slice(1, None), frozenset({1, 2}))
    assert cap.replay().passed


def test_unsupported_constructor_argument_fails_loudly_naming_it(repo: modulelens.Repo) -> None:
    class Holder(nn.Module):
        def __init__(self, width: int, *, lock: Any) -> None:
            super().__init__()
            self.lin = nn.Linear(width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x)

    model = nn.Sequential(Holder(3, lock=threading.Lock()))
    with pytest.raises(modulelens.UnsupportedValueError, match=r"kwargs\['lock'\].*_thread\.lock"):
        with modulelens.capture(model, targets=["0"], repo=repo, name="strict", strict=True):
            model(torch.randn(1, 3))
    # Not strict: the module is recorded by its attributes instead, and the warning says so (issue 34)
    with pytest.warns(modulelens.CaptureWarning, match=r"recorded by their attributes, not their constructor "
                                                       r"arguments.*kwargs\['lock'\].*_thread\.lock"):
        with modulelens.capture(model, targets=["0"], repo=repo, name="lenient") as cap:
            model(torch.randn(1, 3))
    loaded = modulelens.load(cap.saved[0].ref, repo=repo, trust_source=True)
    assert loaded.replay().status == "PASS"
    assert any("rebuilt from its recorded attributes" in note and "kwargs['lock']" in note for note in loaded.notes)


def test_transformers_config_codec_is_lazy_and_exact(tmp_path: Path) -> None:
    result = run_python("""
        import json, sys
        import modulelens
        from modulelens.format import values
        assert "transformers" not in sys.modules, "modulelens must not import transformers"
        assert "transformers.PretrainedConfig" not in values._CODECS
        import transformers
        config = transformers.T5Config(d_model=32, d_kv=8, num_heads=4, num_layers=2, vocab_size=64,
                                       id2label={0: "a", 1: "b"})
        config._attn_implementation = "eager"
        ctx = values.EncodeContext(add_tensor=lambda t, p: "t0")
        data = json.loads(json.dumps(values.encode_value(config, ctx, "config")))
        assert "transformers.PretrainedConfig" in values._CODECS   # registered on first use
        back = values.decode_value(data, values.DecodeContext(get_tensor=None))
        print(json.dumps({"class": type(back).__name__, "same": back.to_dict() == config.to_dict(),
                          "attn": back._attn_implementation, "codec": data["codec"]}))
    """, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out == {"class": "T5Config", "same": True, "attn": "eager", "codec": "transformers.PretrainedConfig"}


def test_a_sub_config_that_resolved_another_attention_rebuilds_with_it(tmp_path: Path) -> None:
    """DETR's transformers ResNet backbone resolves to eager attention while DETR itself runs sdpa;
    recording only the top value asked the rebuilt backbone for sdpa, which it refuses (found by the
    census). Captured at the defaults, replayed in a fresh process."""
    transformers = pytest.importorskip("transformers")
    config = transformers.DetrConfig(
        use_timm_backbone=False, use_pretrained_backbone=False, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=4,
        backbone_config=transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 8, 8, 16], depths=[1, 1, 1, 1],
                                                  out_features=["stage4"]).to_dict())
    with modulelens.track_init():
        model = transformers.DetrModel(config)
    assert (config._attn_implementation, config.backbone_config._attn_implementation) == ("sdpa", "eager")
    repo = modulelens.Repo(tmp_path / "repo")
    with modulelens.capture(model, targets=[""], repo=repo, name="detr", strict=True) as cap:
        model(torch.randn(1, 3, 64, 64))
    result = run_python("""
        import json, sys
        import modulelens
        cap = modulelens.load(sys.argv[2], repo=sys.argv[1])
        report = cap.replay()
        config = cap.module.config
        print(json.dumps({"status": report.status, "mode": report.mode, "report": str(report),
                          "attn": [config._attn_implementation, config.backbone_config._attn_implementation]}))
    """, str(repo.root), cap.saved[0].ref, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert (out["status"], out["mode"], out["attn"]) == ("PASS", "bit-exact", ["sdpa", "eager"]), out["report"]


def test_numpy_randomness_of_a_train_mode_forward_replays_bit_exact(tmp_path: Path) -> None:
    """wav2vec2-style audio models draw their SpecAugment masks (and data2vec-audio its LayerDrop)
    from numpy's global generator in train mode, at their defaults: a replay that put back only
    torch's RNG state gave other values (found by the census: data2vec-audio). numpy's and Python's
    generator states are recorded per call and set around the replay, then put back."""
    transformers = pytest.importorskip("transformers")
    import numpy as np

    config = transformers.Data2VecAudioConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, conv_dim=(8, 8),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=3, num_conv_pos_embedding_groups=2,
        vocab_size=12)
    with modulelens.track_init():
        model = transformers.Data2VecAudioForCTC(config)  # train mode, as built
    assert model.training and config.mask_time_prob > 0
    repo = modulelens.Repo(tmp_path / "repo")
    with modulelens.capture(model, targets=[""], repo=repo, name="audio", strict=True) as cap:
        for _ in range(3):
            model(torch.randn(1, 800))
    result = run_python("""
        import json, sys
        import numpy as np
        import modulelens
        np.random.seed(1)
        before = np.random.get_state()[1].tolist()
        cap = modulelens.load(sys.argv[2], repo=sys.argv[1])
        report = cap.replay()
        print(json.dumps({"status": report.status, "mode": report.mode, "report": str(report),
                          "put_back": np.random.get_state()[1].tolist() == before}))
    """, str(repo.root), cap.saved[0].ref, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert (out["status"], out["mode"], out["put_back"]) == ("PASS", "bit-exact", True), out["report"]
    assert np.random.get_state()[0] == "MT19937"


# ============================================================================================
# 2. Any input/output structure
# ============================================================================================


class Options(NamedTuple):
    scale: float
    tag: str


@dataclasses.dataclass
class Packed:
    values: torch.Tensor
    lengths: list[int]
    note: str | None = None


@dataclasses.dataclass
class Result:
    total: torch.Tensor
    per_item: list[torch.Tensor]
    meta: dict[str, Any]


class Structured(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, packed: Packed, options: Options, extra: dict[str, Any], flag: bool = False,
                missing: Any = None) -> tuple[Result, Options, None, str, dict[int, torch.Tensor]]:
        rows = self.lin(packed.values) * options.scale
        pieces = list(rows.split(packed.lengths))
        total = rows.sum() + extra["bias"][0] + extra["offsets"][1]
        result = Result(total=total, per_item=pieces, meta={"n": len(pieces), "tag": options.tag, "flag": flag})
        return result, Options(options.scale * 2, options.tag + "!"), None, "done", {0: rows[0], 1: rows[-1]}


def test_nested_structures_round_trip_and_compare(repo: modulelens.Repo) -> None:
    model = nn.Sequential(Structured())
    packed = Packed(torch.randn(5, 3), [2, 3], note=None)
    extra = {"bias": (torch.tensor(1.0), None), "offsets": [0, 2.5], "name": "x"}
    cap = capture_one(model[0], "Structured", repo, lambda m: m(packed, Options(0.5, "a"), extra, flag=True),
                      strict=True)
    args, kwargs = cap.calls[0].args, cap.calls[0].kwargs
    assert type(args[0]) is Packed and args[0].lengths == [2, 3] and torch.equal(args[0].values, packed.values)
    assert type(args[1]) is Options and args[1] == Options(0.5, "a")
    assert args[2]["bias"][1] is None and args[2]["offsets"] == [0, 2.5] and kwargs == {"flag": True}
    output = cap.calls[0].output
    assert type(output[0]) is Result and output[0].meta == {"n": 2, "tag": "a", "flag": True}
    assert output[1] == Options(1.0, "a!") and output[2] is None and output[3] == "done"
    assert set(output[4]) == {0, 1}
    report = cap.replay()
    assert report.passed, report
    paths = {leaf.path for leaf in report.calls[0].leaves}
    assert any("per_item" in p for p in paths) and any("total" in p for p in paths)  # dataclass fields compared


def test_dataclass_output_mismatch_is_detected(repo: modulelens.Repo) -> None:
    model = Structured()
    cap = capture_one(model, "Structured", repo, lambda m: m(Packed(torch.randn(4, 3), [1, 3]), Options(1.0, "t"),
                                                             {"bias": (torch.tensor(0.0),), "offsets": [0, 0]}))
    other = copy.deepcopy(cap.module)
    with torch.no_grad():
        other.lin.bias.add_(1e-3)
    report = cap.replay(module=other)
    assert not report.passed
    assert any(not leaf.passed and "per_item" in leaf.path for leaf in report.calls[0].leaves)


def test_transformers_model_output_round_trips(repo: modulelens.Repo) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, use_cache=False)
    model = transformers.LlamaModel(config).eval()
    cap = capture_one(model, "LlamaModel", repo, lambda m: m(input_ids=torch.randint(0, 32, (1, 5)),
                                                             output_hidden_states=True))
    output = cap.calls[0].output
    assert type(output).__name__ == "BaseModelOutputWithPast"
    assert output.last_hidden_state.shape == (1, 5, 16) and len(output.hidden_states) == 2
    assert cap.replay().passed


class OpaqueCache:
    """Not encodable: stands for a KV cache object or a handle."""


class UsesCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor, cache: Any = None) -> tuple[torch.Tensor, Any]:
        return self.lin(x), cache


def test_unrecorded_values_are_explicit_never_silent(repo: modulelens.Repo) -> None:
    local_pair = namedtuple("local_pair", "a b")  # a container type that cannot be imported later
    model = UsesCache()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cap = capture_one(model, "UsesCache", repo, lambda m: (m(torch.randn(1, 2), cache=OpaqueCache()),
                                                               m(torch.randn(1, 2), cache=local_pair(torch.ones(1), 2))),
                          record=modulelens.Recording(max_calls=2))
    # never silent: the capture is saved, and one warning names every value it could not record
    said = " ".join(str(w.message) for w in caught if issubclass(w.category, modulelens.CaptureWarning))
    assert "OpaqueCache" in said and "local_pair" in said, said
    unrecorded = {u["path"]: u for u in cap.metadata["unrecorded"]}
    assert "call0.inputs[1]['cache']" in unrecorded and unrecorded["call0.inputs[1]['cache']"]["type"].endswith(
        "OpaqueCache")
    assert "call0.output[1]" in unrecorded
    assert unrecorded["call1.inputs[1]['cache']"]["type"].endswith(".local_pair")  # the container, as a whole
    cache = cap.calls[0].kwargs["cache"]
    assert isinstance(cache, modulelens.Unrecorded) and cache is not None
    with pytest.raises(modulelens.RestoreError, match=r"input kwargs\['cache'\].*OpaqueCache.*not recorded"):
        cap.calls[0].fresh_inputs()
    report = cap.replay()
    assert report.status == "FAIL" and "kwargs['cache']" in report.calls[0].error
    assert "kwargs['cache']" in report.calls[1].error
    # passing the missing input by hand works
    out, _ = cap.module(*cap.calls[0].args, cache=None)
    assert torch.equal(out, cap.calls[0].output[0])


class MakesCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return self.lin(x), OpaqueCache()


def test_unrecorded_output_makes_replay_unverified_not_pass(repo: modulelens.Repo) -> None:
    cap = capture_one(MakesCache(), "MakesCache", repo, lambda m: m(torch.randn(1, 2)))
    report = cap.replay()
    assert report.status == "UNVERIFIED" and not report.passed
    assert [leaf.kind for leaf in report.calls[0].leaves] == ["tensor", "unrecorded"]
    assert "NOT compared" in str(report)


class KeepsAHandle(nn.Module):
    """Keeps a constructor argument no codec stores (stable-baselines3's policies keep their
    gymnasium spaces), so its constructor is not recorded."""

    def __init__(self, handle: OpaqueCache) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.handle = handle

    def forward(self, x: torch.Tensor, cache: Any = None) -> torch.Tensor:
        return self.lin(x)


def test_unrecorded_call_values_are_named_when_the_constructor_is_not_recorded_either(repo: modulelens.Repo) -> None:
    """The capture saved without its constructor warned only about the constructor: the call value
    it stored as a marker went unnamed (found with stable-baselines3's ``predict`` of numpy input)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = KeepsAHandle(OpaqueCache())
        with modulelens.capture(model, targets=[""], repo=repo, name="t"):
            model(torch.randn(1, 2), cache=OpaqueCache())
    said = [str(w.message) for w in caught if issubclass(w.category, modulelens.CaptureWarning)]
    assert any("constructor not recorded" in m for m in said), said
    assert any("1 call value(s) not recorded" in m and "markers: call0.inputs[1]['cache']: cannot store a value of "
               "type test_fidelity_features.OpaqueCache" in m for m in said), said


class Grid:
    """A value whose ``==`` is element-wise (numpy's arrays, with a codec of the user's)."""

    def __init__(self, cells: torch.Tensor) -> None:
        self.cells = cells

    def __eq__(self, other: object) -> Any:
        return self.cells == other.cells if isinstance(other, Grid) else NotImplemented


modulelens.register_codec(Grid, lambda g: {"cells": g.cells}, lambda cls, d: cls(d["cells"]))


class MakesGrid(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> Grid:
        return Grid(self.lin(x).detach())


def test_an_output_whose_equality_is_element_wise_is_not_compared_and_the_report_is_made(repo: modulelens.Repo) -> None:
    """Replay compared such a leaf with ``bool(want == got)``: the ValueError of a many-element
    truth value ended the whole replay (found with a numpy codec on stable-baselines3's ``predict``)."""
    cap = capture_one(MakesGrid(), "MakesGrid", repo, lambda m: m(torch.randn(3, 2)))
    report = cap.replay()
    assert report.status == "UNVERIFIED" and not report.passed
    [leaf] = report.calls[0].leaves
    assert not leaf.compared and "Grid values have no true ==" in leaf.message and "NOT compared" in leaf.message


# ============================================================================================
# 3. Classes that cannot be imported later: source stored with the capture
# ============================================================================================

SCRIPT = '''
import sys
from dataclasses import dataclass
from enum import Enum

import torch
import modulelens

WIDTH = 6
print("top-level side effect ran")


class Act(Enum):
    TANH = "tanh"
    RELU = "relu"


@dataclass
class Cfg:
    width: int
    act: Act = Act.TANH


class ScriptBlock(torch.nn.Module):
    def __init__(self, cfg: Cfg) -> None:
        super().__init__()
        self.cfg = cfg
        self.lin = torch.nn.Linear(cfg.width, cfg.width)

    def forward(self, x):
        y = self.lin(x)
        return torch.tanh(y) if self.cfg.act is Act.TANH else torch.relu(y)


def make_head():
    class LocalHead(torch.nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(width, 2)

        def forward(self, x):
            return self.fc(x) * 2

    return LocalHead


for step in range(3):
    print("a training loop at module level", step)

if __name__ == "__main__":
    modulelens.track_init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(ScriptBlock(Cfg(WIDTH, Act.RELU)), make_head()(WIDTH))
    with modulelens.capture(model, targets=["0", "1"], repo=sys.argv[1], name="script") as cap:
        model(torch.randn(3, WIDTH))
    print("SAVED", [info.ref for info in cap.saved])
'''

LOAD_AND_REPLAY = '''
import json, sys, warnings
import modulelens
results = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for ref in sys.argv[2:]:
        cap = modulelens.load(ref, repo=sys.argv[1])
        report = cap.replay()
        results[ref] = {"status": report.status, "notes": cap.notes, "module": type(cap.module).__module__,
                        "class": type(cap.module).__name__}
results["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
print(json.dumps(results))
'''


def test_class_defined_in_main_restores_from_stored_source(tmp_path: Path) -> None:
    script_dir = tmp_path / "job"
    script_dir.mkdir()
    script = script_dir / "train.py"
    script.write_text(SCRIPT)
    repo = tmp_path / "repo"
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT), "OMP_NUM_THREADS": "1"}
    ran = subprocess.run([sys.executable, str(script), str(repo)], cwd=script_dir, env=env, capture_output=True,
                         text=True, timeout=180, check=False)
    assert ran.returncode == 0, ran.stderr
    assert "SAVED ['script/0:v1', 'script/1:v1']" in ran.stdout
    meta = modulelens.Repo(repo).read_metadata("script/0", 1)
    assert meta["module"]["class"] == "__main__:ScriptBlock"
    assert meta["module"]["source"]["file"] == str(script)
    assert modulelens.load("script/0", repo=repo).stored_source("__main__") == SCRIPT

    elsewhere = tmp_path / "elsewhere"  # another process, another folder: train.py is not importable
    elsewhere.mkdir()
    # the user who made it: their own signed capture, its stored source runs with no extra step
    own = run_python(LOAD_AND_REPLAY, str(repo), "script/0", cwd=elsewhere)
    assert own.returncode == 0, own.stderr
    assert json.loads(own.stdout.strip().splitlines()[-1])["script/0"]["status"] == "PASS"
    # anyone else (another key): refused, with what to do
    someone_else = tmp_path / "someone-else"
    untrusted = run_python(LOAD_AND_REPLAY, str(repo), "script/0", cwd=elsewhere, config_home=someone_else)
    assert untrusted.returncode != 0 and "UntrustedCodeError" in untrusted.stderr
    assert "trust_source=True" in untrusted.stderr and "side effect" not in untrusted.stdout
    modulelens.Repo(repo).trust_source = True  # the repo trusted: stored source may run for anyone it trusts
    loaded = run_python(LOAD_AND_REPLAY, str(repo), "script/0", "script/1", cwd=elsewhere, config_home=someone_else)
    assert loaded.returncode == 0, loaded.stderr
    out = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert "side effect" not in loaded.stdout and "training loop" not in loaded.stdout  # definitions only
    for ref, cls in (("script/0", "ScriptBlock"), ("script/1", "LocalHead")):
        assert out[ref]["status"] == "PASS" and out[ref]["class"] == cls
        assert out[ref]["module"].startswith("modulelens_source.")
        assert any("rebuilt from the source stored with the capture" in note for note in out[ref]["notes"])
    assert out["warnings"] == []

    script.write_text(SCRIPT.replace("* 2", "* 3"))  # the script changed since the capture
    loaded = run_python(LOAD_AND_REPLAY, str(repo), "script/1", cwd=elsewhere)
    out = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert out["script/1"]["status"] == "PASS"  # the captured source is what runs
    assert any(w.startswith("SourceChangedWarning") and "train.py" in w for w in out["warnings"])
    assert any("has changed since it was captured" in note for note in out["script/1"]["notes"])


MODULE_V1 = '''
import torch


class FolderBlock(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x):
        return self.lin(x).relu()
'''

CAPTURE_FOLDER_MODULE = '''
import sys, torch, modulelens
modulelens.track_init()
from folder_model import FolderBlock
model = torch.nn.Sequential(FolderBlock(4))
with modulelens.capture(model, targets=["0"], repo=sys.argv[1], name="folder") as cap:
    model(torch.randn(2, 4))
print([info.ref for info in cap.saved])
'''


def test_script_folder_module_warns_when_changed_and_falls_back_to_stored_source(tmp_path: Path) -> None:
    folder = tmp_path / "scripts"
    folder.mkdir()
    (folder / "folder_model.py").write_text(MODULE_V1)
    repo = tmp_path / "repo"
    captured = run_python(CAPTURE_FOLDER_MODULE, str(repo), cwd=tmp_path, extra_path=[folder])
    assert captured.returncode == 0, captured.stderr
    meta = modulelens.Repo(repo).read_metadata("folder/0", 1)
    assert meta["module"]["class"] == "folder_model:FolderBlock" and meta["module"]["source"]["class_hash"]

    # importable and unchanged: imported, no warning
    same = json.loads(run_python(LOAD_AND_REPLAY, str(repo), "folder/0", cwd=tmp_path,
                                 extra_path=[folder]).stdout.strip().splitlines()[-1])
    assert same["folder/0"]["status"] == "PASS" and same["folder/0"]["module"] == "folder_model"
    assert same["warnings"] == []

    # importable but changed: imported, SourceChangedWarning, noted, and the replay shows the change
    (folder / "folder_model.py").write_text(MODULE_V1.replace(".relu()", ".tanh()"))
    changed = json.loads(run_python(LOAD_AND_REPLAY, str(repo), "folder/0", cwd=tmp_path,
                                    extra_path=[folder]).stdout.strip().splitlines()[-1])
    assert changed["folder/0"]["status"] == "FAIL"
    assert any(w.startswith("SourceChangedWarning") and "FolderBlock" in w for w in changed["warnings"])
    assert any("has changed since it was captured" in note for note in changed["folder/0"]["notes"])

    # not importable any more (folder not on the path): someone else's capture without trust is
    # refused with what to do (the user's own signed capture would rebuild from its stored source)
    someone_else = tmp_path / "someone-else"
    refused = run_python("""
        import sys, modulelens
        try:
            modulelens.load("folder/0", repo=sys.argv[1]).module
        except modulelens.UntrustedCodeError as error:
            print("REFUSED", error)
    """, str(repo), cwd=tmp_path, config_home=someone_else)
    assert "REFUSED" in refused.stdout and "trust_source=True" in refused.stdout
    # with the user's trust: rebuilt from the stored, original source
    modulelens.Repo(repo).trust_source = True
    gone = json.loads(run_python(LOAD_AND_REPLAY, str(repo), "folder/0", cwd=tmp_path,
                                 config_home=someone_else).stdout.strip().splitlines()[-1])
    assert gone["folder/0"]["status"] == "PASS" and gone["folder/0"]["module"].startswith("modulelens_source.")


def test_stored_source_runs_only_what_the_class_needs() -> None:
    text = textwrap.dedent('''
        import math
        import os
        from collections import namedtuple
        try:
            import numpy as np
        except ImportError:
            np = None
        WIDTH = 4
        UNUSED = 5
        Pair = namedtuple("Pair", "a b")
        data = load_everything()
        train(model)
        for step in range(10):
            loss = step
        def helper():
            return math.pi * WIDTH
        def other():
            return os.getcwd()
        class Thing:
            def forward(self, loss):
                step = 3
                return helper() + loss + step + np.pi
        if __name__ == "__main__":
            main()
    ''')
    kept = [ast.unparse(node).partition("\n")[0] for node in slice_source(text, "<x>", ["Thing"]).body]
    assert kept == ["import math", "try:", "WIDTH = 4", "def helper():", "class Thing:"]


# ============================================================================================
# 4. Shape-only records for huge tensors
# ============================================================================================


class Recommender(nn.Module):
    def __init__(self, rows: int, dim: int) -> None:
        super().__init__()
        self.table = nn.Embedding(rows, dim)
        self.proj = nn.Linear(dim, 1)

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return self.proj(self.table(ids).mean(1) + dense)


def _recommender_capture(repo: modulelens.Repo, payload: modulelens.PayloadPolicy) -> modulelens.VersionInfo:
    torch.manual_seed(0)
    model = Recommender(rows=1000, dim=8)
    ids = torch.randint(100, 900, (64, 16))  # 8 KiB of indices, a "huge" tensor here
    with modulelens.capture(model, targets=["Recommender"], repo=repo, name="rec", payload=payload) as cap:
        model(ids, torch.randn(64, 8))
    return cap.saved[0]


def test_shape_only_index_input_synthesizes_valid_indices(repo: modulelens.Repo) -> None:
    info = _recommender_capture(repo, modulelens.PayloadPolicy(shape_only_over=4096))
    cap = modulelens.load(info.ref, repo=repo)
    assert cap.shape_only == ["call0.inputs[0][0]"]  # ids only: dense (2 KiB) and parameters keep payloads
    ids_entry = next(e for e in cap.metadata["tensors"].values() if e.get("shape_only"))
    assert "payload" not in ids_entry and ids_entry["dtype"] == "int64" and ids_entry["shape"] == [64, 16]
    stats = ids_entry["stats"]
    assert 100 <= stats["min"] <= stats["quantiles"]["0.5"] <= stats["max"] <= 899
    assert isinstance(cap.calls[0].args[0], modulelens.ShapeOnly)
    with pytest.raises(modulelens.RestoreError, match=r"args\[0\] \(int64\[64, 16\]\) was stored shape-only.*synthesize=True"):
        cap.calls[0].fresh_inputs()
    report = cap.replay()
    assert report.status == "FAIL" and "shape-only" in report.calls[0].error

    synth = modulelens.load(info.ref, repo=repo, synthesize=True)
    ids = synth.calls[0].args[0]
    assert ids.dtype == torch.int64 and ids.shape == (64, 16)
    assert int(ids.min()) >= stats["min"] and int(ids.max()) <= stats["max"]  # valid embedding rows
    assert torch.equal(synth.calls[0].args[1], cap.calls[0].args[1])  # the stored input is the real one
    report = synth.replay()
    assert report.status == "UNVERIFIED" and not report.passed  # it ran; nothing pretends to pass
    leaf = report.calls[0].leaves[0]
    assert leaf.kind == "shape-only" and not leaf.compared and leaf.passed
    assert "synthetic inputs" in leaf.message and "NOT compared" in str(report)


def test_max_bytes_budget_and_parameters(repo: modulelens.Repo) -> None:
    info = _recommender_capture(repo, modulelens.PayloadPolicy(max_bytes=40_000))  # weights 32 KiB + ids 8 KiB + dense 2 KiB > 40 KB
    cap = modulelens.load(info.ref, repo=repo)
    assert cap.shape_only == ["call0.inputs[0][0]"]  # the largest call tensor went; parameters never do
    assert cap.metadata["capture"]["max_bytes"] == 40_000
    assert all("payload" in cap.metadata["tensors"][e["tensor"]]
               for e in cap.metadata["states"][0]["parameters"].values())

    info = _recommender_capture(repo, modulelens.PayloadPolicy(shape_only_over=1024, shape_only_params=True))
    cap = modulelens.load(info.ref, repo=repo)
    assert "state0.table.weight" in cap.shape_only
    with pytest.raises(modulelens.RestoreError, match="stored shape-only"):
        _ = cap.module
    synth = modulelens.load(info.ref, repo=repo, synthesize=True)
    assert synth.module.table.weight.shape == (1000, 8)
    assert synth.replay().status == "UNVERIFIED"


def test_tensor_stats() -> None:
    values = torch.tensor([0.0, 0.0, 1.0, 3.0, float("inf")])
    stats = tensor_stats(values)
    assert stats["zero_fraction"] == 0.4 and stats["nonfinite"] == 1
    assert stats["min"] == 0.0 and stats["max"] == 3.0 and stats["mean"] == 1.0
    ints = tensor_stats(torch.arange(10, 20))
    assert (ints["min"], ints["max"]) == (10, 19) and isinstance(ints["min"], int)
    assert tensor_stats(torch.tensor([True, False, True, True]))["fraction_true"] == 0.75


# ============================================================================================
# 5. Shared tensors are stored once
# ============================================================================================


class TiedLM(nn.Module):
    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.embed(ids))))


def test_tied_weights_stay_tied(repo: modulelens.Repo) -> None:
    cap = capture_one(TiedLM(50, 8), "TiedLM", repo, lambda m: m(torch.randint(0, 50, (2, 5))).sum().backward(),
                      record=modulelens.Recording(backward=True))
    params = cap.metadata["states"][0]["parameters"]
    assert params["embed.weight"]["tensor"] == params["head.weight"]["tensor"]
    module = cap.module
    assert module.embed.weight is module.head.weight
    payloads = {e["payload"] for e in cap.metadata["tensors"].values() if "payload" in e}
    weight_digest = cap.metadata["tensors"][params["embed.weight"]["tensor"]]["payload"]
    assert weight_digest in payloads and sum(e.get("payload") == weight_digest for e in cap.metadata["tensors"].values()) == 1
    report = cap.replay(backward=True)
    assert report.passed, report
    assert {leaf.path for leaf in report.calls[0].grad_leaves} >= {"grad['params']['embed.weight']",
                                                                   "grad['params']['head.weight']"}


def test_output_of_one_capture_feeding_another_is_stored_once(repo: modulelens.Repo) -> None:
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 4))
    with modulelens.capture(model, targets=["0", "1"], repo=repo, name="chain") as cap:
        model(torch.randn(32, 64))
    first, second = (modulelens.load(info.ref, repo=repo) for info in cap.saved)

    def digest(c: modulelens.Capture, tree: dict[str, Any]) -> str:
        return c.metadata["tensors"][tree["leaves"][0]["id"]]["payload"]

    out_digest = digest(first, first.metadata["calls"][0]["output"])
    assert out_digest == digest(second, second.metadata["calls"][0]["inputs"])
    for c in (first, second):  # content-addressed: the shared activation is one payload in each save's pack
        members = [e for e in c.metadata["tensors"].values() if e.get("payload") == out_digest]
        assert len(members) == 1 and "pack" in members[0]
    blob_files = {p.name for p in (repo.root / "blobs").glob("*/*") if not p.name.endswith(".ok")}
    packs = {p["payload"].partition(":")[2] for c in (first, second) for p in c.metadata["packs"]}
    assert blob_files == packs


class TwoViews(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        q.mul_(2)  # in place, through a view: the other view of the storage must not see it
        return self.lin(q) + k


def test_views_of_one_storage_are_stored_once_and_restored_as_views(repo: modulelens.Repo) -> None:
    qk = torch.randn(3, 8)
    q, k = qk.chunk(2, dim=-1)
    cap = capture_one(TwoViews(), "TwoViews", repo, lambda m: m(q, k))
    tensors = cap.metadata["tensors"]
    leaves = cap.metadata["calls"][0]["inputs"]["leaves"]
    q_entry, k_entry = (tensors[leaf["id"]] for leaf in leaves)
    assert q_entry["view_of"] == k_entry["view_of"] and "payload" not in q_entry
    assert (q_entry["storage_offset"], k_entry["storage_offset"], q_entry["stride"]) == (0, 4, [8, 1])
    assert tensors[q_entry["view_of"]]["shape"] == [3 * 8]  # one span of the storage, not two copies
    args = cap.calls[0].args
    assert args[0].untyped_storage().data_ptr() == args[1].untyped_storage().data_ptr()
    fresh, _ = cap.calls[0].fresh_inputs()
    assert fresh[0].untyped_storage().data_ptr() == fresh[1].untyped_storage().data_ptr()
    assert fresh[0].untyped_storage().data_ptr() != args[0].untyped_storage().data_ptr()
    assert cap.replay().passed


# ============================================================================================
# 6. State that decides the result
# ============================================================================================


class Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.drop(self.lin(x)), torch.rand_like(x)


def test_dropout_in_training_mode_replays_bit_exact(repo: modulelens.Repo) -> None:
    model = Noisy().train()
    cap = capture_one(model, "Noisy", repo, lambda m: [m(torch.randn(8, 16)) for _ in range(3)],
                      record=modulelens.Recording(max_calls=3))
    assert [c.training for c in cap.calls] == [True, True, True]
    assert all(c.rng and "cpu" in c.rng for c in cap.calls)
    masks = [(c.output[0] == 0) for c in cap.calls]
    assert int(masks[0].sum()) > 16 and not torch.equal(masks[0], masks[1])  # dropout really dropped, per call
    report = cap.replay()
    assert report.passed and report.mode == "bit-exact", report
    # the recorded RNG state is what makes it exact: from another RNG state the replay differs
    module = cap.use_state(0).train()
    torch.manual_seed(12345)
    assert not torch.equal(module(*cap.calls[0].fresh_inputs()[0])[0], cap.calls[0].output[0])


def test_grad_mode_and_autocast_are_recorded_and_replayed(repo: modulelens.Repo) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))

    def drive(m: nn.Module) -> None:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            m(torch.randn(4, 8))

    cap = capture_one(model, "0", repo, drive)
    call = cap.calls[0]
    assert call.grad_enabled is False and call.autocast == {"cpu": "bfloat16"}
    assert call.output.dtype == torch.bfloat16
    report = cap.replay()
    assert report.passed and report.mode == "bit-exact", report
    assert report.calls[0].leaves[0].dtype == "bfloat16"


class Stateful(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4), persistent=False)
        self.step = 0

    def get_extra_state(self) -> Any:
        return {"step": self.step, "offset": torch.full((4,), float(self.step))}

    def set_extra_state(self, state: Any) -> None:
        self.step = state["step"]
        self.offset = state["offset"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.offset = torch.full((4,), float(self.step))
        return self.lin(x) * self.scale + self.offset


def test_extra_state_and_non_persistent_buffers_restore(repo: modulelens.Repo) -> None:
    model = Stateful()
    model.scale.mul_(3)
    model.step = 5
    cap = capture_one(model, "Stateful", repo, lambda m: m(torch.randn(2, 4)))
    state = cap.metadata["states"][0]
    assert state["buffers"]["scale"]["persistent"] is False and state["extra_state"]["_extra_state"]
    module = cap.module
    assert module.step == 5 and torch.equal(module.scale, torch.full((4,), 3.0))
    assert "scale" not in module.state_dict() and "scale" in dict(module.named_buffers())
    assert cap.replay().passed


# ============================================================================================
# 7. Backward
# ============================================================================================


class ResidualBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)
        self.drop = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.down(self.drop(torch.relu(self.up(x))))
        return h * gate, h.sum(-1)


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 6)
        self.block = ResidualBlock(6)
        self.out = nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        gate = torch.sigmoid(h)
        y, s = self.block(h, gate)
        return self.out(y + h).sum() + s.mean() + (h * 3).sum()  # h is used outside the block too


def test_backward_replay_compares_input_and_parameter_gradients(repo: modulelens.Repo) -> None:
    model = Stack().train()
    x = torch.randn(5, 6)
    cap = capture_one(model, "block", repo, lambda m: m(x).backward(), record=modulelens.Recording(backward=True))
    call = cap.calls[0]
    grads = call.backward
    assert grads is not None and set(grads["param_grads"]) == {"up.weight", "up.bias", "down.weight", "down.bias"}
    assert isinstance(grads["input_grads"][0][0], torch.Tensor) and isinstance(grads["input_grads"][0][1], torch.Tensor)
    assert model.block.up.weight.grad is not None and torch.equal(grads["param_grads"]["up.weight"],
                                                                   model.block.up.weight.grad)
    report = cap.replay(backward=True)
    assert report.passed and report.mode == "bit-exact", report
    grad_paths = {leaf.path for leaf in report.calls[0].grad_leaves}
    assert grad_paths == {"grad['inputs']['[0][0]']", "grad['inputs']['[0][1]']", "grad['params']['up.weight']",
                          "grad['params']['up.bias']", "grad['params']['down.weight']", "grad['params']['down.bias']"}
    assert "backward: 6/6 gradients match" in str(report)

    other = copy.deepcopy(cap.module)
    with torch.no_grad():
        # a different module must not pass the backward check (scaling all of down.weight changes h,
        # hence the gradient into `gate`; one entry of up.weight could sit behind a dead ReLU unit)
        other.down.weight.mul_(1.01)
    broken = cap.replay(backward=True, module=other)
    assert not broken.passed and any(not leaf.passed for leaf in broken.calls[0].grad_leaves)


def test_backward_input_gradient_is_module_local(repo: modulelens.Repo) -> None:
    model = Stack().eval()  # gate = sigmoid(h) and h both enter the block; h is also used after it
    seen: dict[str, torch.Tensor] = {}

    def keep_input(_module: nn.Module, args: tuple[Any, ...]) -> None:
        seen.setdefault("h", args[0])

    model.block.register_forward_pre_hook(keep_input)
    cap = capture_one(model, "block", repo, lambda m: m(torch.randn(3, 6)).backward(), record=modulelens.Recording(backward=True))
    recorded = cap.calls[0].backward
    h = seen["h"].detach().requires_grad_(True)
    gate = torch.sigmoid(seen["h"]).detach().requires_grad_(True)
    y, s = model.block(h, gate)
    grad_h, grad_gate = torch.autograd.grad((y, s), (h, gate), tuple(recorded["output_grads"]))
    assert torch.equal(recorded["input_grads"][0][0], grad_h)  # not the job's total dL/dh
    assert torch.equal(recorded["input_grads"][0][1], grad_gate)


# ============================================================================================
# 8. dtype (and device) overrides
# ============================================================================================


def test_replay_is_bit_exact_only_on_the_kernels_that_recorded(repo: modulelens.Repo) -> None:
    """AVX2 and AVX-512 kernels round the same float operations differently (the golden v1 capture
    replays 1.5e-8 off on an AVX-512 machine): elsewhere, the true verdict is a pass within
    tolerance, said in a note, and exact=True still asks for bits."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(approximate="tanh"), nn.LayerNorm(32))
    with modulelens.capture(model, targets=["Sequential"], repo=repo, name="mlp") as cap:
        model(torch.randn(8, 16))
    here = modulelens.load(cap.saved[0].ref, repo=repo)
    assert here.environment["cpu_capability"] == str(torch.backends.cpu.get_cpu_capability())
    report = here.replay()
    assert report.passed and report.mode == "bit-exact" and not report.notes, report

    elsewhere = modulelens.load(cap.saved[0].ref, repo=repo)
    elsewhere.metadata["environment"]["cpu_capability"] = "a CPU this machine is not"
    report = elsewhere.replay()
    assert report.passed and report.mode == "tolerance", report
    assert any("recorded with a CPU this machine is not CPU kernels" in note for note in report.notes), report.notes
    assert elsewhere.replay(exact=True).mode == "bit-exact"

    older_torch = modulelens.load(cap.saved[0].ref, repo=repo)
    older_torch.metadata["environment"]["torch"] = "2.4.0"
    report = older_torch.replay()
    assert report.mode == "tolerance" and any("recorded with torch 2.4.0" in note for note in report.notes)


def test_dtype_override_tolerances(repo: modulelens.Repo) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16))
    with modulelens.capture(model, targets=["Sequential"], repo=repo, name="mlp") as cap:
        model(torch.randn(8, 16))
    ref = cap.saved[0].ref
    exact = modulelens.load(ref, repo=repo, device="cpu").replay()
    assert exact.passed and exact.mode == "bit-exact"

    wide = modulelens.load(ref, repo=repo, dtype=torch.float64)
    report = wide.replay()
    leaf = report.calls[0].leaves[0]
    assert report.passed and report.mode == "tolerance" and report.dtype == "float64", report
    assert leaf.rtol == pytest.approx(1.3e-6) and leaf.max_abs_error > 0  # float32 rounding is real
    assert not wide.replay(rtol=0.0, atol=0.0).passed  # and zero tolerance (rightly) fails

    narrow = modulelens.load(ref, repo=repo, dtype=torch.bfloat16)
    assert narrow.module[0].weight.dtype == torch.bfloat16
    report = narrow.replay()
    leaf = report.calls[0].leaves[0]
    assert report.passed, report
    assert leaf.rtol == pytest.approx(1.6e-2) and leaf.atol >= 1.6e-2 * 1.0  # scaled to |output| ~ O(1)
    assert leaf.max_abs_error > 1e-3  # bf16 really ran
    assert not narrow.replay(rtol=1e-6, atol=1e-6).passed


# ============================================================================================
# 9. Wrapped models: torch.compile and DDP
# ============================================================================================


class Tower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Sequential(nn.Linear(8, 8), nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_torch_compile_model(repo: modulelens.Repo) -> None:
    model = Tower()
    compiled = torch.compile(model, backend="eager")
    compiled(torch.randn(3, 8))  # compiled before the capture exists
    with modulelens.capture(compiled, targets=["_orig_mod.b", "a"], repo=repo, name="compiled",
                            record=modulelens.Recording(max_calls=2)) as cap:
        compiled(torch.randn(3, 8))
        compiled(torch.randn(5, 8))
    assert sorted(info.name for info in cap.saved) == ["compiled/a", "compiled/b"]
    assert cap.tracer.active_hooks == 0
    for info in cap.saved:
        loaded = modulelens.load(info.ref, repo=repo)
        assert [c.args[0].shape[0] for c in loaded.calls] == [3, 5]
        assert loaded.metadata["module"]["qualified_name"] in ("a", "b")
        assert loaded.replay().passed
    assert compiled(torch.randn(2, 8)).shape == (2, 8)  # the job goes on


def test_ddp_wrapped_model(repo: modulelens.Repo, tmp_path: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(Tower())
        with modulelens.capture(ddp, targets=["module.a", "b.0"], repo=repo, name="ddp", record=modulelens.Recording(backward=True)) as cap:
            ddp(torch.randn(4, 8)).sum().backward()
    finally:
        dist.destroy_process_group()
    assert sorted(info.name for info in cap.saved) == ["ddp/a", "ddp/b.0"]
    for info in cap.saved:
        loaded = modulelens.load(info.ref, repo=repo)
        assert loaded.environment["world_size"] == 1
        report = loaded.replay(backward=True)
        assert report.passed and report.calls[0].grad_leaves, report


# ============================================================================================
# 10. Many calls with different shapes
# ============================================================================================


def test_variable_sequence_lengths_each_recorded_and_replayed(repo: modulelens.Repo) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, use_cache=False)
    model = transformers.LlamaModel(config).eval()
    lengths = [5, 11, 3]
    with modulelens.capture(model, targets=["layers.1"], repo=repo, name="llama", record=modulelens.Recording(max_calls=3)) as cap:
        for n in lengths:
            model(input_ids=torch.randint(0, 32, (2, n)))
    loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    assert [c.args[0].shape[1] for c in loaded.calls] == lengths
    assert [c.kwargs["position_embeddings"][0].shape[1] for c in loaded.calls] == lengths
    report = loaded.replay()
    assert report.passed and len(report.calls) == 3, report
