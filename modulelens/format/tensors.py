"""Tensors <-> raw payload bytes, and the content hash that names a payload.

A payload is the tensor's elements in row-major order, little-endian, with no header: the
safetensors idea without the container, so one tensor is one content-addressed blob that can be
shared by many captures and memory-mapped on load. dtype, shape and strides live in the JSON
metadata, never in the blob.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from modulelens.errors import UnsupportedValueError
from modulelens.format.dtypes import DTYPE_SIZES
from modulelens.format.hashing import HASH_ALGORITHM, hash_bytes
from modulelens.format.layouts import layout_name
from modulelens.format.layouts import parts as layout_parts
from modulelens.format.spec import ADDRESS_ALIGNMENT

__all__ = ["HASH_ALGORITHM", "check_storable", "contiguous_strides", "dtype_from_name", "dtype_name", "dtype_names",
           "hash_bytes", "quantization", "quantized", "tensor_bytes"]

# The dtypes of format/dtypes.py that this torch build has.
_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name) for name in DTYPE_SIZES if isinstance(getattr(torch, name, None), torch.dtype)
}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}

if sys.byteorder != "little":  # pragma: no cover - no big-endian torch builds are in use
    raise ImportError("modulelens payloads are little-endian; big-endian hosts are not supported")


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise UnsupportedValueError(f"tensor dtype {dtype} has no modulelens encoding") from None


def dtype_names() -> list[str]:
    """The dtype names the format stores (``float32``, ``bfloat16``...), sorted."""
    return sorted(_DTYPES)


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise UnsupportedValueError(f"unknown dtype {name!r} in capture metadata") from None


_QSCHEMES = (torch.per_tensor_affine, torch.per_channel_affine)


def check_storable(tensor: torch.Tensor, what: str) -> None:
    """Fail loudly for tensors whose bytes are not plain strided memory (quantized tensors with an
    affine scheme are stored as their integer representation)."""
    if tensor.layout != torch.strided or tensor.is_nested:  # as call data, stored by format/layouts.py
        raise UnsupportedValueError(f"{what}: a {layout_name(tensor)} tensor is stored as a value (call data, a "
                                    "constructor argument), not as a parameter or buffer")
    if tensor.is_quantized and tensor.qscheme() not in _QSCHEMES:
        raise UnsupportedValueError(f"{what}: quantized tensors with scheme {tensor.qscheme()} are not supported yet")
    if tensor.device.type == "meta":
        raise UnsupportedValueError(f"{what}: a meta tensor has no data to store")
    dtype_name(tensor.dtype)


def quantization(tensor: torch.Tensor, add_tensor: Callable[[torch.Tensor, str], str], what: str) -> dict[str, object]:
    """The ``quantized`` field of a quantized tensor's entry: its scheme and parameters (per-channel
    scales and zero points are tensors of their own, added with ``add_tensor``)."""
    if tensor.qscheme() == torch.per_tensor_affine:
        return {"scheme": "per_tensor_affine", "scale": float(tensor.q_scale()), "zero_point": int(tensor.q_zero_point())}
    return {"scheme": "per_channel_affine", "axis": int(tensor.q_per_channel_axis()),
            "scales": add_tensor(tensor.q_per_channel_scales(), f"{what}.scales"),
            "zero_points": add_tensor(tensor.q_per_channel_zero_points(), f"{what}.zero_points")}


def quantized(values: torch.Tensor, quantized: dict[str, Any], get_tensor: Callable[[str], torch.Tensor]) -> torch.Tensor:
    """A quantized tensor from its integer representation ``values`` and its ``quantized`` field."""
    if quantized["scheme"] == "per_tensor_affine":
        return torch._make_per_tensor_quantized_tensor(values, quantized["scale"], quantized["zero_point"])
    return torch._make_per_channel_quantized_tensor(values, get_tensor(quantized["scales"]),
                                                    get_tensor(quantized["zero_points"]), quantized["axis"])


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's elements as a read-only byte view (a copy only when it is not contiguous)."""
    flat = tensor.detach()
    if flat.is_quantized:
        flat = flat.int_repr()
    if not flat.is_cpu:
        flat = flat.cpu()
    if flat.numel() == 0:
        return memoryview(b"")
    if not flat.is_contiguous():
        flat = flat.contiguous()
    # One view as bytes, whatever the dtype (numpy has no bfloat16): a save of many small tensors
    # makes one of these per tensor, so every intermediate tensor saved shows (bench_repo.py).
    # numpy's stubs declare the buffer protocol (__buffer__) for Python 3.12+ only; ndarray has it on every version
    return memoryview(flat.view(-1).view(torch.uint8).numpy()).toreadonly()  # type: ignore[arg-type]


def address_offset(tensor: torch.Tensor) -> int:
    """Where ``tensor``'s data starts past a 64-byte boundary (0 for no data)."""
    return tensor.data_ptr() % ADDRESS_ALIGNMENT if tensor.numel() else 0


def at_address_offset(tensor: torch.Tensor, offset: int) -> torch.Tensor:
    """``tensor`` itself when its data starts ``offset`` bytes past a 64-byte boundary, or a copy
    that does (a CPU tensor that is contiguous; anything else is returned as it is)."""
    size = tensor.element_size()
    if (address_offset(tensor) == offset or tensor.device.type != "cpu" or not tensor.is_contiguous()
            or tensor.layout != torch.strided or tensor.is_quantized or offset % size):
        return tensor
    nbytes = tensor.numel() * size
    room = torch.empty(nbytes + ADDRESS_ALIGNMENT, dtype=torch.uint8)
    start = (offset - room.data_ptr()) % ADDRESS_ALIGNMENT
    # set_ rather than a slice: the result is no view (a view of a parameter refuses in-place ops)
    placed = torch.empty(0, dtype=tensor.dtype).set_(room.untyped_storage(), start // size, tensor.shape,
                                                     tensor.stride())
    placed.copy_(tensor)
    return placed


def contiguous_strides(shape: list[int] | tuple[int, ...]) -> list[int]:
    strides: list[int] = []
    acc = 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return list(reversed(strides))


def layout_digest(tensor: torch.Tensor) -> str:
    """A content hash of a non-strided tensor: its layout, size and every part's dtype, shape and
    bytes (a COO tensor coalesced first). A non-persistent sparse buffer is not stored but rebuilt by
    its module's constructor; the load checks the rebuilt one against this (docs/fidelity.md)."""
    found = layout_parts(tensor.coalesce() if tensor.layout == torch.sparse_coo else tensor)
    chunks: list[bytes] = []
    for key in sorted(found):
        value = found[key]
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, torch.Tensor):
                chunks += [f"{key}:{item.dtype}:{list(item.shape)}:".encode(), bytes(tensor_bytes(item.contiguous()))]
            else:
                chunks.append(f"{key}={item!r};".encode())
    return hash_bytes(b"".join(chunks), threads=False)
