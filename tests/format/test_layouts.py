"""Sparse and nested tensor values (format/layouts.py): stored as their strided parts, and damaged
or hostile parts refused with a CorruptCaptureError, never a tensor whose indices point outside its
values (a kernel would read out of bounds)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import modulelens


class Takes(torch.nn.Module):
    def forward(self, coo: torch.Tensor, csr: torch.Tensor, jagged: torch.Tensor, strided: torch.Tensor) -> torch.Tensor:
        return coo.to_dense().sum() + csr.to_dense().sum() + jagged.values().sum() + strided.unbind()[0].sum()


@pytest.fixture
def layouts_capture(repo: modulelens.Repo) -> tuple[modulelens.Repo, str, Path]:
    model = torch.nn.Sequential(Takes())
    inputs = (torch.eye(3).to_sparse(), torch.eye(3).to_sparse_csr(),
              torch.nested.nested_tensor([torch.ones(2, 2), torch.ones(3, 2)], layout=torch.jagged),
              torch.nested.nested_tensor([torch.ones(2, 2), torch.ones(1, 2)], layout=torch.strided))
    with modulelens.capture(model, targets=["0"], repo=repo, name="layouts") as cap:
        model[0](*inputs)
    name, version = repo.resolve(cap.saved[0].ref)
    return repo, cap.saved[0].ref, repo.version_path(name, version) / "capture.json"


def _leaf(meta: dict[str, Any], index: int) -> dict[str, Any]:
    return meta["calls"][0]["inputs"]["leaves"][index]


def test_the_stored_form_is_parts_of_the_tensor_table(layouts_capture: tuple[modulelens.Repo, str, Path]) -> None:
    _, _, path = layouts_capture
    meta = json.loads(path.read_text())
    coo, csr, jagged, strided = (_leaf(meta, i) for i in range(4))
    assert (coo["$type"], coo["layout"], coo["size"], coo["coalesced"]) == ("sparse", "sparse_coo", [3, 3], True)
    assert {key for key, value in coo.items() if isinstance(value, dict)} == {"indices", "values"}
    assert {key for key, value in csr.items() if isinstance(value, dict)} == {"crow_indices", "col_indices", "values"}
    assert (jagged["$type"], jagged["layout"], jagged["ragged_idx"], jagged["lengths"]) == ("nested", "jagged", 1, None)
    assert meta["tensors"][jagged["offsets"]["id"]]["shape"] == [3]
    assert strided["layout"] == "strided" and len(strided["components"]) == 2


def _set(index: int, **fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda meta: _leaf(meta, index).update(fields)


def _point(index: int, part: str, other: int, other_part: str) -> Callable[[dict[str, Any]], None]:
    """Make a part reference another value's part (a real, stored tensor of the wrong kind or size)."""
    return lambda meta: _leaf(meta, index).update({part: _leaf(meta, other)[other_part]})


VALIDATION = {
    "unknown sparse layout": _set(0, layout="sparse_magic"),
    "unknown nested layout": _set(2, layout="ragged"),
    "missing part": lambda meta: _leaf(meta, 1).pop("col_indices"),
    "part that is not a tensor": _set(0, values=[1.0, 2.0]),
    "negative size": _set(0, size=[-3, 3]),
    "components that are not tensors": _set(3, components=[{"$type": "tuple", "items": []}]),
    "ragged dimension that is not an int": _set(2, ragged_idx="1"),
}
REBUILD = {
    "indices outside the size": _set(0, size=[1, 1]),
    "offsets past the packed values": _point(2, "values", 0, "values"),  # 3 values, offsets up to 5
    "float offsets": _point(2, "offsets", 0, "values"),
    "ragged dimension out of range": _set(2, ragged_idx=7),
    "compressed indices of another tensor": _point(1, "crow_indices", 2, "offsets"),
}


def _load_inputs(repo: modulelens.Repo, ref: str) -> None:
    cap = modulelens.load(ref, repo=repo)
    _ = cap.calls[0].args


@pytest.mark.parametrize("label", list(VALIDATION))
def test_a_damaged_layout_is_refused_when_read(layouts_capture: tuple[modulelens.Repo, str, Path], label: str) -> None:
    repo, ref, path = layouts_capture
    meta = json.loads(path.read_text())
    VALIDATION[label](meta)
    path.write_text(json.dumps(meta))
    with pytest.raises(modulelens.CorruptCaptureError, match=r"capture\.json"):
        _load_inputs(repo, ref)


@pytest.mark.parametrize("label", list(REBUILD))
def test_parts_that_do_not_make_a_tensor_are_refused(layouts_capture: tuple[modulelens.Repo, str, Path],
                                                      label: str) -> None:
    repo, ref, path = layouts_capture
    meta = json.loads(path.read_text())
    REBUILD[label](meta)
    path.write_text(json.dumps(meta))
    with pytest.raises(modulelens.CorruptCaptureError, match=r"tensor does not rebuild"):
        _load_inputs(repo, ref)


def test_layouts_replay_in_this_process(layouts_capture: tuple[modulelens.Repo, str, Path]) -> None:
    repo, ref, _ = layouts_capture
    report = modulelens.load(ref, repo=repo).replay()
    assert report.passed and report.mode == "bit-exact", report


def test_a_sparse_parameter_is_refused_naming_it(repo: modulelens.Repo) -> None:
    class SparseWeight(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.eye(3).to_sparse())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sparse.mm(self.weight, x)

    model = torch.nn.Sequential(SparseWeight())
    with pytest.warns(modulelens.CaptureWarning) as seen:
        with modulelens.capture(model, targets=["0"], repo=repo, name="sparse_weight"):
            model(torch.ones(3, 2))  # the job runs on
    [message] = [str(w.message) for w in seen]
    assert "saving the captures failed" in message and "state0.weight: a sparse_coo tensor is stored as a value" in message
