"""The writer never writes what the reader rejects (issue 22, defect 4: ``dtype=torch.qint8`` was
saved, and load said "unknown dtype 'qint8'"). Every ``torch.dtype`` in torch, as a value and as a
tensor, and every value kind the encoder has (each ``$type`` tag and each registered codec) goes
through a real capture and load: it comes back equal, or the capture refuses it with an error
naming it. Nothing is written that a load then rejects."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import functools
import json
import math

import pytest
import torch
from torch import nn

import modulelens
from modulelens.format import validate, values

ALL_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}


class Holds(nn.Module):
    """Keeps its constructor arguments; forward passes its input through."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__()
        self.held = (args, kwargs)

    def forward(self, x: object) -> object:
        return x


class Color(enum.Enum):
    RED = "red"


Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass
class Settings:
    width: int
    scale: float = 1.0


def _capture(repo: modulelens.Repo, module: nn.Module, call_input: object, name: str) -> modulelens.Capture:
    with modulelens.capture(module, targets=[""], repo=repo, name=name, strict=True) as cap:
        module(call_input)
    return modulelens.load(cap.saved[0].ref, repo=repo)


def test_every_torch_dtype_as_a_value_round_trips(repo: modulelens.Repo) -> None:
    assert len(ALL_DTYPES) > 40  # every dtype object torch has, quantized and sub-byte ones included
    cap = _capture(repo, Holds(tuple(ALL_DTYPES), dtype=torch.qint8), tuple(ALL_DTYPES), "dtypes")
    args, kwargs = cap.init_arguments
    assert args == (tuple(ALL_DTYPES),) and kwargs == {"dtype": torch.qint8}
    assert cap.calls[0].output == tuple(ALL_DTYPES)
    assert cap.replay().passed


def _tensor_of(dtype: torch.dtype) -> torch.Tensor:
    if dtype in QUANTIZED:
        return torch.quantize_per_tensor(torch.linspace(0, 1, 6).reshape(2, 3), 0.1, 1, dtype)
    try:  # distinct values where torch can convert to the dtype, zeros for the shell dtypes (bits16, uint3...)
        return torch.arange(6, dtype=torch.float32).reshape(2, 3).to(dtype)
    except (RuntimeError, NotImplementedError):
        return torch.zeros(2, 3, dtype=dtype)


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch deprecates quantized tensor creation
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_torch_dtype_as_a_tensor_round_trips_or_is_refused_when_captured(repo, dtype) -> None:
    tensor = _tensor_of(dtype)
    with pytest.warns(modulelens.CaptureWarning) if _unstorable(dtype) else contextlib.nullcontext():
        cap = _capture(repo, Holds(), tensor, "tensor")
    loaded = cap.calls[0].args[0]
    if isinstance(loaded, modulelens.Unrecorded):  # refused by the writer, naming the dtype: never written
        assert str(dtype).removeprefix("torch.") in loaded.reason, loaded.reason
        assert [u["path"] for u in cap.metadata["unrecorded"]] == ["call0.inputs[0][0]", "call0.output"]
        return
    assert loaded.dtype == dtype and loaded.shape == tensor.shape
    if dtype.is_quantized if hasattr(dtype, "is_quantized") else dtype in QUANTIZED:
        assert torch.equal(loaded.int_repr(), tensor.int_repr()) and loaded.q_scale() == tensor.q_scale()
    else:
        assert torch.equal(loaded.view(torch.uint8), tensor.view(torch.uint8))
    assert cap.replay().passed


def _unstorable(dtype: torch.dtype) -> bool:
    from modulelens.format.tensors import dtype_names

    return str(dtype).removeprefix("torch.") not in dtype_names()


def test_the_storable_dtypes_include_the_common_and_quantized_ones() -> None:
    from modulelens.format.tensors import dtype_names

    assert {"float32", "bfloat16", "float8_e4m3fn", "bool", "uint64", "qint8", "quint8", "qint32"} <= set(dtype_names())


def _every_kind() -> dict[str, object]:
    """One value of each kind the encoder accepts, keyed by what it is."""
    return {
        "none": None, "bool": True, "int": 3, "float": 2.5, "str": "s", "list": [1, [2]],
        "tuple": (1, 2), "dict": {1: "a", (2, 3): "b"}, "set": {1, 2}, "frozenset": frozenset({3}),
        "nan": float("nan"), "inf": float("-inf"), "complex": 1 + 2j, "bytes": b"\x00\xff",
        "slice": slice(1, None, 2), "ellipsis": ..., "dtype": torch.quint4x2, "device": torch.device("cpu"),
        "size": torch.Size([2, 3]), "tensor": torch.arange(3.0), "module": nn.ReLU(),
        "import": torch.nn.functional.gelu, "class": nn.Linear, "namedtuple": Pair(1, 2),
        "dataclass": Settings(4), "enum": Color.RED, "partial": functools.partial(torch.nn.functional.softmax, dim=-1),
        "sparse_coo": torch.eye(3).to_sparse(), "sparse_csr": torch.eye(3).to_sparse_csr(),
        "sparse_bsc": torch.eye(4).to_sparse_bsc((2, 2)),
        "nested_jagged": torch.nested.nested_tensor([torch.ones(2, 3), torch.zeros(1, 3)], layout=torch.jagged),
        "nested_strided": torch.nested.nested_tensor([torch.ones(2, 3), torch.zeros(1, 3)], layout=torch.strided),
    }


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and a.is_nested:
        return isinstance(b, torch.Tensor) and b.is_nested and a.layout == b.layout and all(
            torch.equal(x, y) for x, y in zip(a.unbind(), b.unbind(), strict=True))
    if isinstance(a, torch.Tensor) and a.layout != torch.strided:
        return isinstance(b, torch.Tensor) and a.layout == b.layout and torch.equal(a.to_dense(), b.to_dense())
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, nn.Module):
        return type(a) is type(b)
    if isinstance(a, functools.partial):
        return isinstance(b, functools.partial) and (a.func, a.args, a.keywords) == (b.func, b.args, b.keywords)
    return type(a) is type(b) and a == b


def test_every_value_kind_and_codec_round_trips_through_a_capture(repo: modulelens.Repo) -> None:
    kinds = _every_kind()
    cap = _capture(repo, Holds(**kinds), torch.ones(2), "kinds")
    _, kwargs = cap.init_arguments
    assert set(kwargs) == set(kinds)
    for name, value in kinds.items():
        assert _same(value, kwargs[name]), name
    meta = json.loads((repo.root / "names" / "kinds" / "versions" / "1" / "capture.json").read_text())
    tags = {found["$type"] for found in _tagged(meta["constructions"])}
    # every tag the format defines, but the call-data-only marker, was written and read back
    assert set(validate._TAGS_WITH) - {"unrecorded"} <= tags
    # and every codec registered out of the box (optional libraries' codecs have their own tests)
    codecs = {found["codec"] for found in _tagged(meta["constructions"]) if found["$type"] == "codec"}
    assert {name for name, codec in values._CODECS.items() if codec.type.__module__ in ("enum", "functools")} <= codecs


def test_an_unrecorded_value_in_call_data_round_trips_as_a_marker(repo: modulelens.Repo) -> None:
    class Opaque:
        pass

    module = Holds()
    with pytest.warns(modulelens.CaptureWarning, match=r"2 call value\(s\) not recorded, stored as 'unrecorded'"):
        with modulelens.capture(module, targets=[""], repo=repo, name="opaque") as cap:
            module((torch.ones(1), Opaque()))
    loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    assert isinstance(loaded.calls[0].output[1], modulelens.Unrecorded)
    assert [u["path"] for u in loaded.metadata["unrecorded"]] == ["call0.inputs[0][0][1]", "call0.output[1]"]


def _tagged(data: object) -> list[dict]:
    found, pending = [], [data]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if "$type" in item:
                found.append(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return found
