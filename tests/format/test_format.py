"""Typed JSON values and pytree call data round-trip without pickle."""

from __future__ import annotations

import collections
import enum
import functools
import math
from dataclasses import dataclass

import pytest
import torch

import modulelens
from modulelens.format.tree import (
    Flattened,
    decode_tree,
    deep_flatten,
    deep_leaves,
    encode_tree,
    map_leaves,
    mutable_leaves,
)
from modulelens.format.values import DecodeContext, EncodeContext, decode_value, encode_value

Point = collections.namedtuple("Point", "x y")


class Color(enum.Enum):
    RED = "red"


@dataclass
class Settings:
    width: int
    act: str = "relu"


def _roundtrip(value: object, lenient: bool = False) -> object:
    tensors: dict[str, torch.Tensor] = {}

    def add(t: torch.Tensor, _path: str) -> str:
        tensors[f"t{len(tensors)}"] = t
        return f"t{len(tensors) - 1}"

    ctx = EncodeContext(add_tensor=add, lenient=lenient)
    encoded = encode_value(value, ctx, "value")
    import json

    encoded = json.loads(json.dumps(encoded, allow_nan=False))  # must be strict JSON
    return decode_value(encoded, DecodeContext(get_tensor=tensors.__getitem__))


@pytest.mark.parametrize("value", [
    None, True, 3, 2.5, "s", [1, (2, 3)], (1, [2]), {"a": 1, 2: "b", (1, 2): None}, torch.float16,
    torch.device("cpu"), torch.Size([2, 3]), {1, 2}, frozenset({"a"}), complex(1, 2), b"\x00\x01", slice(1, None, 2),
    Point(1, 2), Color.RED, Settings(3), torch.nn.GELU, math.sqrt, torch.relu,
])
def test_values_round_trip(value: object) -> None:
    assert _roundtrip(value) == value


def test_partial_round_trips() -> None:
    out = _roundtrip(functools.partial(torch.nn.functional.gelu, approximate="tanh"))
    assert out.func is torch.nn.functional.gelu and out.keywords == {"approximate": "tanh"}


def test_special_floats_round_trip() -> None:
    out = _roundtrip([math.inf, -math.inf, math.nan])
    assert out[0] == math.inf and out[1] == -math.inf and math.isnan(out[2])


def test_unsupported_value_names_its_path() -> None:
    with pytest.raises(modulelens.UnsupportedValueError, match=r"value\[1\]\['k'\].*object"):
        _roundtrip([1, {"k": object()}])


def test_lenient_mode_records_an_explicit_marker() -> None:
    out = _roundtrip([1, object()], lenient=True)
    assert isinstance(out[1], modulelens.Unrecorded) and out[1].type_name == "builtins.object"


def test_local_functions_are_refused() -> None:
    def local() -> None: ...
    with pytest.raises(modulelens.UnsupportedValueError, match="import path"):
        _roundtrip(local)


def test_pytree_structure_round_trips_with_namedtuples_and_int_keys() -> None:
    tree = ((torch.ones(2), Point(torch.zeros(1), 3)), {"a": [None, "x"], 4: torch.arange(3)})
    tensors: dict[str, torch.Tensor] = {}

    def add(t: torch.Tensor, _path: str) -> str:
        tensors[f"t{len(tensors)}"] = t
        return f"t{len(tensors) - 1}"

    encoded = encode_tree(tree, EncodeContext(add_tensor=add), "in")
    out = decode_tree(encoded, DecodeContext(get_tensor=tensors.__getitem__))
    assert isinstance(out[0][1], Point) and out[0][1].y == 3
    assert torch.equal(out[1][4], torch.arange(3)) and out[1]["a"] == [None, "x"]


def test_registered_codec(repo: modulelens.Repo) -> None:
    class Scale:
        def __init__(self, factor: float) -> None:
            self.factor = factor

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Scale) and other.factor == self.factor

    Scale.__qualname__ = "Scale"
    globals()["Scale"] = Scale
    Scale.__module__ = __name__
    modulelens.register_codec(Scale, lambda s: {"factor": s.factor}, lambda cls, d: cls(**d))
    assert _roundtrip(Scale(2.0)) == Scale(2.0)


def test_dtypes_round_trip_through_payloads(repo: modulelens.Repo) -> None:
    class Many(torch.nn.Module):
        def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(x.clone() for x in xs)

    globals()["Many"] = Many
    Many.__qualname__ = "Many"
    module = Many()
    xs = [torch.randn(3, 2).to(d) for d in (torch.float16, torch.bfloat16, torch.float64)]
    xs += [torch.tensor([True, False]), torch.tensor(7), torch.randn(4, 3).t(), torch.zeros(0, 3),
           torch.randint(0, 9, (5,), dtype=torch.int8), torch.complex(torch.randn(2), torch.randn(2))]
    with modulelens.capture(module, targets="Many", repo=repo, name="many"):
        module(*xs)
    call = modulelens.load("many", repo=repo).calls[0]
    for original, restored in zip(xs, call.args, strict=False):
        assert restored.dtype == original.dtype and restored.shape == original.shape
        assert torch.equal(restored, original)
    assert call.args[5].stride() == xs[5].stride()  # the transposed layout came back


def test_class_source_hash_follows_the_file_on_disk(tmp_path, monkeypatch) -> None:
    """Loads compare each captured class with its current source; the hash is cached per file
    state, so an edit of the file after import is still seen (as inspect.getsource sees it)."""
    import importlib
    import os

    from modulelens.format.sources import class_source, class_source_hash, source_hash

    module_file = tmp_path / "edited_model.py"
    module_file.write_text("class Edited:\n    factor = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = importlib.import_module("edited_model").Edited
    first = class_source_hash(cls)
    assert first == source_hash(class_source(cls)) and class_source_hash(cls) == first
    module_file.write_text("class Edited:\n    factor = 30\n")
    stamp = os.stat(module_file).st_mtime_ns + 5_000_000_000
    os.utime(module_file, ns=(stamp, stamp))  # a later mtime, whatever the filesystem's clock granularity
    assert class_source_hash(cls) == source_hash("class Edited:\n    factor = 30\n") != first
    assert class_source_hash(int) is None  # a builtin has no source file


class _Stats:
    """A state object (register_state_codec): walked attribute by attribute."""

    def __init__(self) -> None:
        self.total, self.count, self.history = torch.zeros(2), 3, [torch.ones(1), None]


@dataclass
class _Batch:
    ids: torch.Tensor
    note: str


def test_deep_flatten_gives_the_leaves_and_rebuild_of_map_leaves() -> None:
    """deep_flatten, the snapshot's walk, recurses through plain containers itself: its leaves
    must be map_leaves' in the same order, and its rebuild what map_leaves gives, node types and
    all (a state object a new object)."""
    modulelens.register_state_codec(_Stats)
    point = collections.namedtuple("point", "x y")
    tree = ((torch.ones(2), point(torch.zeros(1), 2.5)), {"stats": _Stats(), "batch": _Batch(torch.arange(3), "a"),
            "nested": [{"k": (None, True)}, collections.OrderedDict(z=torch.ones(1))], 4: "four"})

    def double(_path: str, leaf: object) -> object:
        return leaf * 2 if isinstance(leaf, torch.Tensor) else leaf

    leaves, rebuild = deep_flatten(tree)
    assert [path for path, _ in deep_leaves(tree)][:3] == ["[0][0]", "[0][1].x", "[0][1].y"]
    assert [id(leaf) for leaf in leaves] == [id(leaf) for _, leaf in deep_leaves(tree)]
    with_paths, without = map_leaves(double, tree), rebuild([double("", leaf) for leaf in leaves])
    flat_a, flat_b = deep_leaves(with_paths), deep_leaves(without)
    assert len(flat_a) == len(flat_b) == len(leaves)
    for (path_a, a), (path_b, b) in zip(flat_a, flat_b, strict=True):
        assert path_a == path_b and type(a) is type(b)
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    assert type(without[0][1]) is point and type(without[1]["nested"][1]) is collections.OrderedDict
    assert type(without[1]["stats"]) is _Stats and without[1]["stats"] is not tree[1]["stats"]
    assert torch.equal(without[1]["batch"].ids, torch.arange(3) * 2)
    assert [id(leaf) for leaf in deep_flatten(Flattened.of(tree))[0]] == [id(leaf) for leaf in leaves]  # flattened already
    with pytest.raises(ValueError, match="leaves for a tree of"):
        rebuild(leaves[:-1])


def test_paths_of_changed_inputs_are_the_same_when_memoised() -> None:
    tree = ((torch.ones(1), {"a": torch.zeros(1), "b": [1, torch.ones(2)]}), {"cache": _Stats()})
    modulelens.register_state_codec(_Stats)
    first = mutable_leaves(tree)
    again = mutable_leaves(tree)
    assert [path for path, _ in first] == [path for path, _ in again] == \
        ["[0][0]", "[0][1]['a']", "[0][1]['b'][1]", "[1]['cache']"]


@pytest.mark.parametrize("tree", [
    ((torch.ones(1), [2, {"b": torch.zeros(2), 7: None}]), {"a": (True, "s"), "c": []}),
    ((torch.ones(1),), {"named": collections.namedtuple("pair", "x y")(torch.zeros(1), 3)}),  # pytree's walk
    (torch.ones(1), collections.OrderedDict(k=[torch.zeros(1)])),
    torch.ones(2),
])
def test_flattened_agrees_with_pytree(tree: object) -> None:
    """Flattened walks plain containers itself: leaves, rebuilt structure and paths as pytree's."""
    import torch.utils._pytree as pytree

    flat = Flattened.of(tree)
    leaves, spec = pytree.tree_flatten(tree)
    assert len(flat.leaves) == len(leaves) and all(a is b for a, b in zip(flat.leaves, leaves, strict=True))
    rebuilt = flat.unflatten(list(range(len(leaves))))
    assert pytree.tree_structure(rebuilt) == spec
    every = tuple(range(len(leaves)))
    assert flat.paths(every) == [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(tree)[0]]
