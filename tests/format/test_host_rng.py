"""numpy's and Python's generator states, as a recorded call keeps them (format/host_rng.py).

The packed layout is part of the format (624 keys, the position, whether a Gaussian is cached, its
bits); a state the previous call saw unchanged is handed out as the same tensor, so a capture of
many calls that draw nothing from them stores one payload for all. The states are read from the
generators' memory where their layout was confirmed, and through the public calls elsewhere: both
give the same tensors.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import modulelens
from modulelens.format import host_rng
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


def _through_the_public_calls() -> dict[str, torch.Tensor]:
    numpy_state = host_rng._numpy_from_get_state(np)
    assert numpy_state is not None
    return {NUMPY: numpy_state, PYTHON: host_rng._python_from_getstate()}


def _same_as_the_public_calls(states: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(states[kind], state) for kind, state in _through_the_public_calls().items())


def test_states_read_from_memory_are_the_public_calls_states() -> None:
    host_states()
    # On this CPython and numpy the layouts are confirmed (the fast path: ~4 µs a call instead of
    # ~50); a numpy or Python that changes them falls back to the public calls (the test below).
    assert host_rng._numpy_layout(np) is not None and host_rng._python_offset() is not None
    np.random.seed(11)
    random.seed(13)
    assert _same_as_the_public_calls(host_states())
    np.random.randn()
    cached = np.random.get_state()
    assert cached[3] == 1
    with_gaussian = host_states()
    assert _same_as_the_public_calls(with_gaussian)
    np.random.randn()  # consumes the cached Gaussian: the keys and the position do not move
    consumed = host_states()
    assert consumed[NUMPY] is not with_gaussian[NUMPY] and _same_as_the_public_calls(consumed)
    np.random.set_state(cached)  # the same keys again, with the Gaussian cached
    restored = host_states()
    assert restored[NUMPY] is not consumed[NUMPY] and torch.equal(restored[NUMPY], with_gaussian[NUMPY])
    random.gauss(0.0, 1.0)
    python_gaussian = host_states()
    assert python_gaussian[PYTHON] is not restored[PYTHON] and _same_as_the_public_calls(python_gaussian)
    random.setstate((*random.getstate()[:2], None))  # the cached Gaussian dropped, the keys unchanged
    dropped = host_states()
    assert dropped[PYTHON] is not python_gaussian[PYTHON] and _same_as_the_public_calls(dropped)


def test_without_a_confirmed_layout_the_public_calls_give_the_same_states(monkeypatch: pytest.MonkeyPatch) -> None:
    np.random.seed(17)
    random.seed(19)
    np.random.randn()
    random.gauss(0.0, 1.0)
    from_memory = host_states()
    monkeypatch.setattr(host_rng, "_numpy_layout", lambda numpy: None)
    monkeypatch.setattr(host_rng, "_python_offset", lambda: None)
    public = host_states()
    assert public[NUMPY] is not from_memory[NUMPY] and public[PYTHON] is not from_memory[PYTHON]
    assert torch.equal(public[NUMPY], from_memory[NUMPY]) and torch.equal(public[PYTHON], from_memory[PYTHON])


def test_a_bit_generator_other_than_mt19937_is_not_recorded() -> None:
    legacy = np.random.get_bit_generator()
    np.random.set_bit_generator(np.random.PCG64(1))  # np.random.* draw from PCG64 from here on
    try:
        assert NUMPY not in host_states() and PYTHON in host_states()
    finally:
        np.random.set_bit_generator(legacy)
    assert NUMPY in host_states()
