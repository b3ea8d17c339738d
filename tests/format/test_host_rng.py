"""numpy's and Python's generator states, as a recorded call keeps them (format/host_rng.py).

The packed layout is part of the format (624 keys, the position, whether a Gaussian is cached, its
bits); a state the previous call saw unchanged is handed out as the same tensor, so a capture of
many calls that draw nothing from them stores one payload for all.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import numpy as np
import torch

import modulelens
from modulelens.format.host_rng import NUMPY, PYTHON, host_states, restore_host_states, set_host_states


def _expected(keys: list[int], position: int, gauss: float | None) -> list[int]:
    (bits,) = struct.unpack("=q", struct.pack("=d", gauss or 0.0))
    return [*keys, position, int(gauss is not None), bits]


def test_the_packed_layout_is_keys_position_and_the_cached_gaussian() -> None:
    np.random.seed(3)
    random.seed(5)
    np.random.randn(3)  # leaves a Gaussian cached in numpy's legacy generator
    random.gauss(0.0, 1.0)  # and in Python's
    states = host_states()
    _kind, keys, position, has_gauss, gauss = np.random.get_state()
    assert has_gauss
    assert states[NUMPY].dtype == torch.int64
    assert states[NUMPY].tolist() == _expected([int(k) for k in keys], int(position), float(gauss))
    _version, internal, gauss_next = random.getstate()
    assert gauss_next is not None
    assert states[PYTHON].tolist() == _expected(list(internal[:-1]), internal[-1], gauss_next)


def test_an_unchanged_state_is_the_same_tensor_and_a_draw_makes_a_new_one() -> None:
    first = host_states()
    again = host_states()
    assert again[NUMPY] is first[NUMPY] and again[PYTHON] is first[PYTHON]
    drawn = random.random()
    after = host_states()
    assert after[PYTHON] is not first[PYTHON] and after[NUMPY] is first[NUMPY]
    previous = set_host_states(first)  # back to before the draw: the same number comes out
    try:
        assert random.random() == drawn
    finally:
        restore_host_states(previous)
    np.random.random()
    assert host_states()[NUMPY] is not first[NUMPY]


def test_calls_that_draw_nothing_share_one_stored_state(tmp_path: Path) -> None:
    module = torch.nn.Linear(2, 2)
    with modulelens.capture(module, targets="Linear", repo=tmp_path, name="m",
                            record=modulelens.Recording(max_calls=3)):
        for _ in range(3):
            module(torch.randn(1, 2))  # torch draws (randn); numpy and random do not
    calls = modulelens.Repo(tmp_path).read_metadata("m", 1)["calls"]
    rngs = [call["rng"] for call in calls]
    assert len(rngs) == 3
    assert len({rng["cpu"] for rng in rngs}) == 3  # torch's state moved with every randn
    assert len({rng[PYTHON] for rng in rngs}) == 1 and len({rng[NUMPY] for rng in rngs}) == 1
    loaded = modulelens.load("m", repo=tmp_path)
    assert all(torch.equal(call.rng[PYTHON], host_states()[PYTHON]) for call in loaded.calls)
