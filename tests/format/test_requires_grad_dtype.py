"""A parameter that requires grad must have a dtype that can (issue 21, 7b): metadata re-typing it
to an integer dtype is a one-line CorruptCaptureError naming the parameter, not a torch error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import modulelens


def _retyped(repo: modulelens.Repo, dtype: str, requires_grad: bool) -> str:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with modulelens.capture(model, targets=["0"], repo=repo, name="grad") as cap:
        model(torch.randn(2, 4))
    ref = cap.saved[0].ref
    path: Path = repo.version_path(*repo.resolve(ref)) / "capture.json"
    meta = json.loads(path.read_text())
    weight = meta["states"][0]["parameters"]["weight"]
    weight["requires_grad"] = requires_grad
    meta["tensors"][weight["tensor"]]["dtype"] = dtype  # float32 -> int32: same bytes, so sizes still agree
    path.write_text(json.dumps(meta))
    return ref


def test_requires_grad_parameter_retyped_to_an_integer_dtype_is_refused(repo: modulelens.Repo) -> None:
    ref = _retyped(repo, "int32", requires_grad=True)
    with pytest.raises(modulelens.CorruptCaptureError) as error:
        modulelens.load(ref, repo=repo)
    message = str(error.value)
    assert "\n" not in message
    assert "states[0].parameters[weight]" in message and "requires_grad with dtype int32" in message


def test_an_integer_parameter_without_grad_still_loads(repo: modulelens.Repo) -> None:
    ref = _retyped(repo, "int32", requires_grad=False)
    module = modulelens.load(ref, repo=repo).module
    assert module.weight.dtype == torch.int32 and not module.weight.requires_grad
