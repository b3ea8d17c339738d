"""Capture fidelity, feature by feature (issue #3): codecs, call structures, stored source,
shape-only records, shared tensors, state that decides the result, backward, dtype overrides,
wrapped models and repeated calls."""

from __future__ import annotations

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
from modulelens.restore.source import definitions_only

PACKAGE_ROOT = Path(modulelens.__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _tracking() -> Any:
    with modulelens.track_init():
        yield


@pytest.fixture
def repo(tmp_path: Path) -> modulelens.Repo:
    return modulelens.Repo(tmp_path / "repo")


def run_python(code: str, *args: str, cwd: Path, extra_path: list[Path] | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that imports modulelens from this checkout."""
    path = [str(PACKAGE_ROOT), *(str(p) for p in extra_path or [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def capture_one(model: nn.Module, target: str, repo: modulelens.Repo, drive: Any, **options: Any) -> modulelens.Capture:
    with modulelens.capture(model, targets=[target], repo=repo, name="t", **options) as cap:
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
    with pytest.warns(modulelens.CaptureWarning, match=r"kwargs\['lock'\]"):
        with modulelens.capture(model, targets=["0"], repo=repo, name="lenient") as cap:
            model(torch.randn(1, 3))
    loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    with pytest.raises(modulelens.RestoreError, match=r"kwargs\['lock'\]"):
        _ = loaded.module


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
    with torch.no_grad():
        cap.module.lin.bias.add_(1e-3)
    report = cap.replay()
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
                          max_calls=2)
    assert not [w for w in caught if issubclass(w.category, modulelens.CaptureWarning)]
    unrecorded = {u["path"]: u for u in cap.metadata["unrecorded"]}
    assert "call0.inputs[1]['cache']" in unrecorded and unrecorded["call0.inputs[1]['cache']"]["type"].endswith(
        "OpaqueCache")
    assert "call0.output[1]" in unrecorded
    assert unrecorded["call1.inputs[1]['cache']"]["type"] == "collections.namedtuple"  # the container, as a whole
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
