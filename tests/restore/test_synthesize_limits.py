"""A shape-only tensor's recorded shape is whatever its capture says: drawing a synthetic stand-in
that needs more memory than the machine has is a one-line refusal, never torch's raw allocator
error or a process killed for memory (issue 35, item 8)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import modulelens
from modulelens.errors import RestoreError


def _shape_only_capture(root: Path, shape: list[int]) -> None:
    module = torch.nn.Linear(4, 4)
    with modulelens.capture(module, targets="", repo=root, name="lin", payload=modulelens.PayloadPolicy(shape_only_over=0)):
        module(torch.randn(2, 4))
    path = root / "names/lin/versions/1/capture.json"
    meta = json.loads(path.read_bytes())
    tid = meta["calls"][0]["inputs"]["leaves"][0]["id"]  # the call's input
    assert meta["tensors"][tid]["shape_only"]
    meta["tensors"][tid]["shape"] = shape
    meta["tensors"][tid]["stride"] = [*[4] * (len(shape) - 1), 1][-len(shape):]
    os.chmod(path, 0o644)
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize("shape", [[1 << 40, 4], [1 << 49]])
def test_a_gigantic_shape_only_input_is_a_one_line_refusal(shape: list[int], tmp_path: Path) -> None:
    _shape_only_capture(tmp_path / "repo", shape)
    cap = modulelens.load("lin", repo=tmp_path / "repo", synthesize=True)
    with pytest.raises(RestoreError) as refused:
        cap.calls[0].args  # noqa: B018 - draws the synthetic input
    message = str(refused.value)
    assert "\n" not in message and message.startswith("lin:v1/t")
    assert f"a synthetic float32 tensor of shape {shape} needs about" in message and "is available" in message


def test_a_shape_only_input_that_fits_is_drawn(tmp_path: Path) -> None:
    _shape_only_capture(tmp_path / "repo", [2, 4])
    [x] = modulelens.load("lin", repo=tmp_path / "repo", synthesize=True).calls[0].args
    assert x.shape == (2, 4) and x.dtype == torch.float32
