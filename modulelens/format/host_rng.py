"""The host's random generators outside torch, as tensors a capture stores with torch's RNG state.

Library code draws from numpy's global generator in ``forward`` (transformers: LayerDrop and the
SpecAugment masks of wav2vec2-style audio models, ``np.random.random()``) and from Python's
``random`` module. A recorded call keeps their states next to torch's (``call.rng["numpy"]``,
``call.rng["python"]``), so a replay in train mode draws what the job drew. numpy is recorded only
where the job has imported it (modulelens never imports it for this).

Reading them costs more than a small module's recording: ``numpy.random.get_state()`` takes ~36 µs
and ``random.getstate()`` ~9 µs (a 624-key array and a 625-int tuple built each time), about 0.2 ms
of the demo RecModel's 2.5 ms forward with 4 targets (benchmarks/bench_recording.py). So where the
layout is confirmed, each generator's whole state is read as raw bytes from its memory instead
(about 1 µs a read, 3–4 µs for both states and the check that they are unchanged): numpy's
MT19937 keys and position through the bit generator's public ``ctypes.state_address``, its cached
Gaussian and Python's keys and index at offsets into the generator objects. Those offsets are
private to numpy and CPython, so they are found once per process on private generators and
checked against ``get_state()`` / ``getstate()`` through draws that cache, consume and cache again
a Gaussian; where anything does not match (another layout, another generator type), the states
are read through the public calls, as before.
"""

from __future__ import annotations

import ctypes
import functools
import random
import struct
import sys
import types
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


def _packed_once(kind: str, state: object, pack: Callable[[], torch.Tensor]) -> torch.Tensor:
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
        packed = _numpy_from_memory(numpy)
        if packed is None:
            packed = _numpy_from_get_state(numpy)
        if packed is not None:
            states[NUMPY] = packed
    packed = _python_from_memory()
    states[PYTHON] = packed if packed is not None else _python_from_getstate()
    return states


_KEYS = 624  # MT19937's state words, numpy's and Python's alike
_KEY_BYTES = 4 * _KEYS


def _keys_as_int64(raw: bytes, offset: int) -> torch.Tensor:
    """624 native uint32 keys from ``raw`` at ``offset``, widened to int64."""
    keys = torch.frombuffer(bytearray(raw[offset:offset + _KEY_BYTES]), dtype=torch.int32)
    return keys.to(torch.int64).bitwise_and_(0xFFFFFFFF)


def _numpy_from_get_state(numpy: types.ModuleType) -> torch.Tensor | None:
    state = numpy.random.get_state(legacy=False)  # a dict whatever the generator (set_bit_generator)
    if state.get("bit_generator") != "MT19937":
        return None
    keys, position = state["state"]["key"], state["state"]["pos"]
    gauss_value = float(state["gauss"]) if state["has_gauss"] else None
    return _packed_once(NUMPY, (keys.tobytes(), int(position), gauss_value),
                        lambda: _pack(torch.from_numpy(keys.astype(numpy.int64)), int(position), gauss_value))


def _python_from_getstate() -> torch.Tensor:
    state = random.getstate()
    _version, internal, gauss_next = state
    return _packed_once(PYTHON, state, lambda: _pack(torch.tensor(internal[:-1], dtype=torch.int64),
                                                     internal[-1], gauss_next))


_MT_STATE_BYTES = _KEY_BYTES + 4  # numpy's mt19937_state: the keys, then the int position


def _numpy_from_memory(numpy: types.ModuleType) -> torch.Tensor | None:
    layout = _numpy_layout(numpy)
    if layout is None:
        return None
    state_type, generator_type, gauss_at = layout
    legacy = numpy.random.mtrand._rand  # what np.random.seed/randn/get_state act on
    generator = legacy._bit_generator  # np.random.set_bit_generator may have replaced it
    if type(legacy) is not state_type or type(generator) is not generator_type:
        return None
    keys = ctypes.string_at(generator.ctypes.state_address, _MT_STATE_BYTES)
    gauss = ctypes.string_at(id(legacy) + gauss_at, 16)  # int has_gauss, padding, double gauss
    raw = keys + gauss[:4] + gauss[8:]

    def pack() -> torch.Tensor:
        (position,) = struct.unpack_from("=i", raw, _KEY_BYTES)
        has_gauss, value = struct.unpack_from("=id", raw, _MT_STATE_BYTES)
        return _pack(_keys_as_int64(raw, 0), position, value if has_gauss else None)

    return _packed_once(NUMPY, raw, pack)


@functools.cache  # looked for once per process
def _numpy_layout(numpy: types.ModuleType) -> tuple[Any, Any, int] | None:
    """numpy's generator types and where a RandomState keeps its cached Gaussian, found on a
    private one and checked, with the bit generator's keys and position, against ``get_state()``
    through three draws. ``None``: not confirmed here, so the public calls are used."""
    if sys.implementation.name != "cpython":  # id() is an object's address only in CPython
        return None
    try:
        state_type, generator_type = numpy.random.RandomState, numpy.random.MT19937
        probe = state_type(generator_type(20261202))
        size = type(probe).__basicsize__
        offsets = set(range(8, size - 16 + 1, 4))
        for _ in range(3):  # a Gaussian cached, then consumed (0, 0.0), then cached again
            probe.standard_normal()
            _kind, keys, position, has_gauss, gauss = probe.get_state()
            if ctypes.string_at(probe._bit_generator.ctypes.state_address, _MT_STATE_BYTES) != \
                    keys.astype(numpy.uint32).tobytes() + struct.pack("=i", position):
                return None
            memory = ctypes.string_at(id(probe), size)
            offsets = {at for at in offsets if struct.unpack_from("=i", memory, at)[0] == has_gauss
                       and struct.unpack_from("=d", memory, at + 8)[0] == gauss}
        if len(offsets) != 1 or type(numpy.random.mtrand._rand) is not state_type:
            return None
        return state_type, generator_type, offsets.pop()
    except Exception:  # another numpy: the public calls are used
        return None


def _python_from_memory() -> torch.Tensor | None:
    offset = _python_offset()
    generator = getattr(random, "_inst", None)  # what random.random/seed/getstate act on
    if offset is None or type(generator) is not random.Random:
        return None
    raw = ctypes.string_at(id(generator) + offset, 4 + _KEY_BYTES)
    gauss_next = generator.gauss_next  # type: ignore[attr-defined]  # random.Random's own attribute

    def pack() -> torch.Tensor:
        (index,) = struct.unpack_from("=i", raw)
        return _pack(_keys_as_int64(raw, 4), index, gauss_next)

    return _packed_once(PYTHON, (raw, gauss_next), pack)


@functools.cache  # looked for once per process
def _python_offset() -> int | None:
    """Where a random.Random keeps its index and keys (CPython's RandomObject: an int, then 624
    uint32), found on a private one and checked against ``getstate()`` after draws. ``None``: not
    confirmed here, so ``getstate()`` is used."""
    if sys.implementation.name != "cpython":
        return None
    try:
        probe = random.Random(20261202)
        size, limit = 4 + _KEY_BYTES, type(probe).__basicsize__  # never read past the object
        offsets: set[int] | None = None
        for _ in range(3):
            probe.random()
            _version, internal, _gauss = probe.getstate()
            expected = struct.pack(f"={1 + _KEYS}I", internal[-1], *internal[:-1])
            found = {at for at in range(8, min(65, limit - size + 1), 4)
                     if ctypes.string_at(id(probe) + at, size) == expected}
            offsets = found if offsets is None else offsets & found
        if offsets is None or len(offsets) != 1:
            return None
        return offsets.pop()
    except Exception:  # another Python: getstate() is used
        return None


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
