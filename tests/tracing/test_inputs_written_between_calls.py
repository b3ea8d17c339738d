"""An input the job writes between two recorded calls without moving its version counter (a write
through ``.data``, numpy writing into the array a ``torch.from_numpy`` tensor shares) is recorded
with its values at each call: the snapshot's memo of copies holds for one outermost call only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import modulelens


def _write_through_data(x: torch.Tensor, _array: np.ndarray) -> None:
    x.data.mul_(2.0)


def _write_through_numpy(_x: torch.Tensor, array: np.ndarray) -> None:
    array *= 2.0


@pytest.mark.parametrize("write", [_write_through_data, _write_through_numpy], ids=["data", "numpy"])
def test_each_call_records_the_values_it_received(tmp_path: Path,
                                                   write: Callable[[torch.Tensor, np.ndarray], None]) -> None:
    tracking = modulelens.track_init()
    try:
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    finally:
        tracking.stop()
    array = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    x = torch.from_numpy(array)  # one tensor, fed at every step
    seen = []
    with modulelens.capture(model, targets=["0", "1"], repo=tmp_path, name="reused",
                            record=modulelens.Recording(max_calls=2)) as cap:
        for _ in range(2):
            version = x._version
            seen.append(x.clone())
            model(x)
            write(x, array)
            assert x._version == version  # the write the version counter does not show
    first = modulelens.load(cap.saved[0].ref, repo=tmp_path)
    for call, values in zip(first.calls, seen, strict=True):
        assert torch.equal(call.args[0], values)
    report = first.replay()
    assert report.passed, report
    # the output of "0" is the input of "1": copied at each call, one payload in the repo (content-addressed)
    second = modulelens.load(cap.saved[1].ref, repo=tmp_path)
    out = first.metadata["calls"][0]["output"]["leaves"][0]["id"]
    into = second.metadata["calls"][0]["inputs"]["leaves"][0]["id"]
    assert first.metadata["tensors"][out]["payload"] == second.metadata["tensors"][into]["payload"]
