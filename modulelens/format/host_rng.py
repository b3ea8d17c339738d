"""The host's random generators outside torch, as tensors a capture stores with torch's RNG state.

Library code draws from numpy's global generator in ``forward`` (transformers: LayerDrop and the
SpecAugment masks of wav2vec2-style audio models, ``np.random.random()``) and from Python's
``random`` module. A recorded call keeps their states next to torch's (``call.rng["numpy"]``,
``call.rng["python"]``), so a replay in train mode draws what the job drew. numpy is recorded only
where the job has imported it (modulelens never imports it for this).
"""

from __future__ import annotations

import array
import random
import struct
import sys
from collections.abc import Callable
from typing import Any

import torch

NUMPY, PYTHON = "numpy", "python"

# Per generator: the state last packed and its tensor. Most recorded calls draw nothing from
# numpy or ``random``, so their state is the one the previous call saw: that call's tensor is
# handed out again, one tensor (one payload) for all of them. Packing each call's state anew cost
# ~0.25 ms a call (a Python int per key), more than the rest of a small module's recording.
_last_packed: dict[str, tuple[Any, torch.Tensor]] = {}


def _pack(keys: torch.Tensor, position: int, gauss: float | None) -> torch.Tensor:
    (bits,) = struct.unpack("=q", struct.pack("=d", gauss or 0.0))
    return torch.cat((keys, torch.tensor([position, int(gauss is not None), bits], dtype=torch.int64)))


def _unpack(packed: torch.Tensor, count: int) -> tuple[list[int], int, float | None]:
    values = packed.tolist()
    gauss = float(packed[count + 2:count + 3].clone().view(torch.float64)) if values[count + 1] else None
    return values[:count], values[count], gauss


def _packed_once(kind: str, state: Any, pack: Callable[[], torch.Tensor]) -> torch.Tensor:
    last = _last_packed.get(kind)
    if last is not None and last[0] == state:
        return last[1]
    tensor = pack()
    _last_packed[kind] = (state, tensor)
    return tensor


def host_states() -> dict[str, torch.Tensor]:
    """numpy's global MT19937 state (if numpy is imported) and Python ``random``'s, packed as int64
    tensors: the 624 keys, the position, whether a Gaussian is cached, and its bits. A state the
    previous call saw unchanged comes back as the same tensor (never written to)."""
    states = {}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, position, has_gauss, gauss = numpy.random.get_state()
        if kind == "MT19937":
            gauss_value = float(gauss) if has_gauss else None
            states[NUMPY] = _packed_once(
                NUMPY, (keys.tobytes(), int(position), gauss_value),
                lambda: _pack(torch.from_numpy(keys.astype(numpy.int64)), int(position), gauss_value))
    state = random.getstate()
    version, internal, gauss_next = state
    if version == 3:
        states[PYTHON] = _packed_once(
            PYTHON, state,
            lambda: _pack(torch.frombuffer(array.array("q", internal[:-1]), dtype=torch.int64), internal[-1], gauss_next))
    return states


def set_host_states(states: dict[str, torch.Tensor]) -> dict[str, object]:
    """Set the recorded states; returns the states they replaced (for :func:`restore_host_states`)."""
    previous: dict[str, object] = {}
    if PYTHON in states:
        previous[PYTHON] = random.getstate()
        keys, position, gauss = _unpack(states[PYTHON], 624)
        random.setstate((3, (*keys, position), gauss))
    if NUMPY in states:
        import numpy

        previous[NUMPY] = numpy.random.get_state()
        keys, position, gauss = _unpack(states[NUMPY], 624)
        numpy.random.set_state(("MT19937", numpy.array(keys, dtype=numpy.uint32), position,
                                int(gauss is not None), gauss or 0.0))
    return previous


def restore_host_states(previous: dict[str, object]) -> None:
    if PYTHON in previous:
        random.setstate(previous[PYTHON])  # type: ignore[arg-type]
    if NUMPY in previous:
        import numpy

        numpy.random.set_state(previous[NUMPY])  # type: ignore[arg-type]  # what get_state() returned, kept as object
