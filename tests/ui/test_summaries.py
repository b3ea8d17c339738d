"""What the pages compute from payloads and metadata: sampled statistics and histograms, values as
Python-like text, leaf paths read from the stored structure."""

from __future__ import annotations

from pathlib import Path

import torch

import modulelens
from modulelens.interfaces.tensor_info import SAMPLE_ELEMENTS, histogram, tensor_summary, value_sample
from modulelens.interfaces.ui import pages
from modulelens.interfaces.ui.repo_view import RepoView
from modulelens.interfaces.ui.shown import PAGE_SAMPLE_ELEMENTS
from modulelens.interfaces.value_text import construction_text, python_like, spec_leaf_paths


class _Recorded:
    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors
        self.metadata = {"tensors": {tid: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                                          "nbytes": t.nbytes} for tid, t in tensors.items()}}

    def tensor(self, tid: str) -> torch.Tensor:
        return self.tensors[tid]


def test_value_sample_takes_runs_of_a_big_tensor_and_all_of_a_small_one() -> None:
    small = torch.arange(1000.0)
    assert torch.equal(value_sample(small), small)
    big = torch.arange(float(SAMPLE_ELEMENTS * 8))
    sample = value_sample(big)
    assert sample.numel() == SAMPLE_ELEMENTS
    runs = sample.view(64, -1)
    assert all(bool((row[1:] - row[:-1] == 1).all()) for row in runs)  # consecutive elements: pages read, not strided
    assert runs[0, 0] == 0 and runs[-1, -1] == big[-1]  # from the first to the last element
    view = big.view(4096, -1).t()  # not contiguous: sampled row by row
    assert 0 < value_sample(view, 1000).numel() <= 1000


def test_summary_of_a_big_tensor_is_sampled_and_says_so() -> None:
    big = torch.randn(SAMPLE_ELEMENTS * 4, generator=torch.Generator().manual_seed(0))
    summary = tensor_summary(_Recorded({"t": big}), "t")
    assert summary["sampled"] == SAMPLE_ELEMENTS and summary["stats"]["numel"] == big.numel()
    assert abs(summary["stats"]["mean"]) < 0.01 and abs(summary["stats"]["std"] - 1) < 0.01
    assert sum(summary["histogram"]["counts"]) == SAMPLE_ELEMENTS
    exact = tensor_summary(_Recorded({"t": big[:1000]}), "t")
    assert exact["sampled"] is None and exact["stats"]["numel"] == 1000


def test_histograms_of_floats_integers_booleans_and_non_finite_values() -> None:
    floats = histogram(torch.tensor([0.0, 0.5, 1.0, float("nan"), float("inf")]), bins=2)
    assert floats["counts"] == [1, 2] and floats["total"] == 3 and (floats["min"], floats["max"]) == (0.0, 1.0)
    ids = histogram(torch.tensor([3, 3, 4, 7]))
    assert ids["counts"] == [2, 1, 0, 0, 1]  # one bin per integer value
    flags = histogram(torch.tensor([True, False, True]))
    assert flags["counts"] == [1, 2] and flags["labels"] == ["False", "True"]
    assert histogram(torch.tensor([float("nan")])) is None
    assert histogram(torch.full((5,), 2.0))["counts"] == [5]


def test_values_read_as_python() -> None:
    meta = {"tensors": {"t0": {"dtype": "float32", "shape": [4, 8], "nbytes": 128, "payload": "blake3:" + "ab" * 32},
                        "t1": {"dtype": "int64", "shape": [9], "nbytes": 72, "shape_only": True}},
            "constructions": {"m0": {"class": "torch.nn.modules.linear:Linear", "args": [4, 8], "kwargs": {"bias": False}}}}
    value = {"$type": "dict", "items": [
        ["w", {"$type": "tensor", "id": "t0"}], ["ids", {"$type": "tensor", "id": "t1"}],
        ["layer", {"$type": "module", "ref": "m0"}], ["act", {"$type": "import", "path": "torch.nn.functional:gelu"}],
        ["pair", {"$type": "tuple", "items": [1]}], ["inf", {"$type": "float", "value": "inf"}],
        ["dt", {"$type": "dtype", "value": "bfloat16"}], ["cfg", {"$type": "dataclass", "class": "m:Cfg",
                                                                   "fields": {"$type": "dict", "items": [["a", 1]]}}],
        ["s", {"$type": "frozenset", "items": []}], ["b", {"$type": "bytes", "hex": "6869"}], ["x", "<b>'q'</b>"]]}
    assert python_like(value, meta, max_items=20) == (
        "{'w': tensor(float32[4, 8]), 'ids': tensor(int64[9], shape-only), "
        "'layer': Linear(4, 8, bias=False), 'act': gelu, 'pair': (1,), 'inf': float('inf'), "
        "'dt': torch.bfloat16, 'cfg': Cfg(a=1), 's': frozenset(), 'b': b'hi', 'x': \"<b>'q'</b>\"}")
    assert construction_text({"class": "pkg.mod:MLP", "args": [[1, 2]], "kwargs": {"p": None}}) == "MLP([1, 2], p=None)"
    assert python_like(list(range(10_000)), limit=20) == "[0, 1, 2, 3, 4, 5, …"
    assert python_like({"$type": "no-such-tag"}) == "<no-such-tag>"


def test_leaf_paths_come_from_the_stored_structure_alone() -> None:
    dict_inputs = {"spec": {"type": "builtins:tuple", "context": {"value": None}, "children": [
        {"type": "builtins:tuple", "context": {"value": None}, "children": [
            {"type": "builtins:dict", "context": {"value": ["user", "item"]}, "children": [
                {"type": "builtins:tuple", "context": {"value": None}, "children": ["*", "*"]}, "*"]}]},
        {"type": "builtins:dict", "context": {"value": ["mask"]}, "children": ["*"]}]}, "leaves": [1, 2, 3, 4]}
    assert spec_leaf_paths(dict_inputs, "inputs") == [
        "args[0]['user'][0]", "args[0]['user'][1]", "args[0]['item']", "kwargs['mask']"]
    hostile = {"spec": {"type": "os:system", "context": {"value": "rm -rf /"}, "children": ["*", "*"]}, "leaves": [1, 2]}
    assert spec_leaf_paths(hostile, "output") == ["output[0]", "output[1]"]  # named by position, nothing imported
    broken = {"spec": {"type": "builtins:tuple", "children": "nope"}, "leaves": [1]}
    assert spec_leaf_paths(broken, "output") == ["output[0]"]


def test_a_capture_page_shares_one_sample_budget_among_its_tensors(tmp_path: Path) -> None:
    # 40 layers: 80 parameters, each weight as big as one tensor's whole sample (SAMPLE_ELEMENTS)
    model = torch.nn.Sequential(*(torch.nn.Linear(512, 512) for _ in range(40)))
    repo = modulelens.Repo(tmp_path / "repo")
    with torch.no_grad(), modulelens.capture(model, targets=".", repo=repo, name="deep") as cap:
        model(torch.randn(2, 512))
    view = RepoView(repo, scan_jobs=False)
    capture = view.capture("deep", 1)
    rows = pages.capture_page(view, capture)["parameters"]
    assert len(rows) == 80
    share = PAGE_SAMPLE_ELEMENTS // 80
    weights = [row for row in rows if row["shape"] == [512, 512]]
    assert len(weights) == 40 and all(0 < row["sampled"] <= share for row in weights)
    read = sum(row["sampled"] or row["stats"]["numel"] for row in rows)
    assert read <= PAGE_SAMPLE_ELEMENTS
    # the sample says what it is: the mean of a Linear's uniform init stays near 0, the count is the weight's own
    assert all(row["stats"]["numel"] == 512 * 512 and abs(row["stats"]["mean"]) < 0.01 for row in weights)
    # one tensor's own view (a click) reads its full sample, not the page's share
    one = pages.histogram_of(view, capture, weights[0]["id"])["row"]
    assert one["sampled"] is None and one["stats"]["numel"] == SAMPLE_ELEMENTS
    assert cap.saved[0].ref == "deep:v1"


def test_a_capture_page_of_few_tensors_samples_each_in_full(tmp_path: Path) -> None:
    model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(4)))
    repo = modulelens.Repo(tmp_path / "repo")
    with torch.no_grad(), modulelens.capture(model, targets=".", repo=repo, name="wide"):
        model(torch.randn(2, 1024))
    view = RepoView(repo, scan_jobs=False)
    rows = pages.capture_page(view, view.capture("wide", 1))["parameters"]
    weights = [row for row in rows if row["shape"] == [1024, 1024]]
    assert len(weights) == 4 and all(row["sampled"] == SAMPLE_ELEMENTS for row in weights)
