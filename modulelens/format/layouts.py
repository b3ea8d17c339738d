"""Tensors that are not one strided block of memory, as the strided tensors torch builds them from.

A payload is one strided tensor's bytes (:mod:`modulelens.format.tensors`). A sparse tensor (COO,
CSR, CSC, BSR, BSC) is its index and value tensors, a nested tensor its components (``strided``
layout) or its packed values and offsets (``jagged`` layout); each part is stored as an ordinary
tensor and the whole as one encoded value (``$type`` ``sparse`` / ``nested``, docs/format.md), rebuilt
with torch's own constructors. Sparse tensors are rebuilt with torch's invariant checks on and jagged
offsets are checked against their values, so damaged or hostile parts are refused instead of being
indexed out of bounds by a kernel later.

A tensor subclass made of plain inner tensors (torchao's quantized weights) is its parts and the
context torch's ``__tensor_flatten__`` gives; as a parameter or buffer it is a ``subclass`` entry of
the tensor table (docs/format.md), rebuilt by the class's own ``__tensor_unflatten__``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from modulelens.errors import CorruptCaptureError, UntrustedCodeError
from modulelens.format.spec import SPARSE_PARTS

JSON = Any



def is_plain(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is one strided block of memory (what a payload holds)."""
    return tensor.layout == torch.strided and not tensor.is_nested


def version_counter(tensor: torch.Tensor) -> int | None:
    """``tensor``'s version counter (an in-place change bumps it); ``None`` for a tensor made under
    ``torch.inference_mode()`` (sentence-transformers' ``encode`` makes its inputs so), which has
    none: reading it raises."""
    return None if tensor.is_inference() else tensor._version


def layout_name(tensor: torch.Tensor) -> str:
    """``"sparse_csr"``, ``"nested jagged"``, ``"strided"``: for messages."""
    if tensor.is_nested:
        return f"nested {str(tensor.layout).removeprefix('torch.')}"
    return str(tensor.layout).removeprefix("torch.")


def parts(tensor: torch.Tensor) -> dict[str, object]:
    """The parts a non-strided tensor is stored as: strided tensors, plain numbers and lists.

    Keys besides the tensors: ``$type`` (``"sparse"`` or ``"nested"``), ``layout``, and ``size``
    and ``coalesced`` (sparse), ``ragged_idx``, ``min_seqlen`` and ``max_seqlen`` (jagged).
    """
    if tensor.is_nested:
        return _nested_parts(tensor)
    layout = str(tensor.layout).removeprefix("torch.")
    if layout not in SPARSE_PARTS:
        raise ValueError(f"a {layout} tensor has no stored form")
    found: dict[str, object] = {"$type": "sparse", "layout": layout, "size": list(tensor.shape)}
    if layout == "sparse_coo":
        coalesced = tensor.is_coalesced()
        found.update(indices=tensor._indices(), values=tensor._values(), coalesced=coalesced)
        return found
    for name in SPARSE_PARTS[layout]:
        found[name] = getattr(tensor, name)()
    return found


def _nested_parts(tensor: torch.Tensor) -> dict[str, object]:
    if tensor.layout == torch.jagged:
        cache = getattr(tensor, "_metadata_cache", None) or {}
        # offsets() and _ragged_idx are NestedTensor's: torch's stubs know only Tensor's methods
        return {"$type": "nested", "layout": "jagged", "values": tensor.values(),
                "offsets": tensor.offsets(),  # type: ignore[attr-defined]
                "lengths": tensor.lengths(), "ragged_idx": int(tensor._ragged_idx),  # type: ignore[attr-defined]
                # torch keeps these as the sizes of empty tensors (so that compile can trace them)
                "min_seqlen": _cached_int(cache.get("min_seqlen")), "max_seqlen": _cached_int(cache.get("max_seqlen"))}
    return {"$type": "nested", "layout": "strided", "components": list(tensor.unbind())}


def _cached_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return int(value.shape[0])
    return int(value)


def encode(tensor: torch.Tensor, encode_part: Callable[[object, str], JSON], path: str) -> JSON:
    """The encoded value of a non-strided tensor; ``encode_part(value, path)`` encodes each part."""
    return {key: value if key in ("$type", "layout") else encode_part(value, f"{path}.{key}")
            for key, value in parts(tensor).items()}


def decode(data: dict[str, Any], decode_part: Callable[[JSON], Any]) -> torch.Tensor:
    """A tensor from its encoded parts (``decode_part`` decodes one); a
    :class:`~modulelens.errors.CorruptCaptureError` when the parts do not make one."""
    layout = data["layout"]
    try:
        if data["$type"] == "sparse":
            return _sparse(data, layout, decode_part)
        if layout == "jagged":
            return _jagged(data, decode_part)
        components = [decode_part(c) for c in data["components"]]
        _all_tensors(components, "nested components")
        return torch.nested.as_nested_tensor(components, layout=torch.strided) if components else \
            torch.nested.nested_tensor([], layout=torch.strided)
    except (RuntimeError, ValueError, TypeError, IndexError) as error:
        raise CorruptCaptureError(f"a stored {data['$type']} {layout} tensor does not rebuild: "
                                  f"{type(error).__name__}: {str(error).splitlines()[0]}") from None


def _sparse(data: dict[str, Any], layout: str, decode_part: Callable[[JSON], Any]) -> torch.Tensor:
    found = [decode_part(data[name]) for name in SPARSE_PARTS[layout]]
    _all_tensors(found, f"{layout} parts")
    size = [int(s) for s in data["size"]]
    if layout == "sparse_coo":
        indices, values = found
        return torch.sparse_coo_tensor(indices, values, size, is_coalesced=bool(data.get("coalesced")),
                                       check_invariants=True)
    compressed, plain, values = found
    return torch.sparse_compressed_tensor(compressed, plain, values, size, layout=getattr(torch, layout),
                                          check_invariants=True)


def _jagged(data: dict[str, Any], decode_part: Callable[[JSON], Any]) -> torch.Tensor:
    values, offsets = decode_part(data["values"]), decode_part(data["offsets"])
    lengths = None if data.get("lengths") is None else decode_part(data["lengths"])
    _all_tensors([values, offsets] + ([lengths] if lengths is not None else []), "jagged parts")
    ragged_idx = int(data["ragged_idx"])
    _check_offsets(values, offsets, lengths, ragged_idx)
    return torch.nested.nested_tensor_from_jagged(values, offsets, lengths=lengths, jagged_dim=ragged_idx,
                                                  min_seqlen=data.get("min_seqlen"), max_seqlen=data.get("max_seqlen"))


def _check_offsets(values: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor | None, ragged_idx: int) -> None:
    """Offsets (and lengths) that stay inside the packed values: kernels index with them unchecked."""
    if not 1 <= ragged_idx <= values.dim():
        raise ValueError(f"ragged dimension {ragged_idx} of {values.dim()}-d values")
    if offsets.dim() != 1 or offsets.dtype.is_floating_point or offsets.dtype.is_complex or offsets.numel() == 0:
        raise ValueError("offsets must be a non-empty 1-d integer tensor")
    extent = values.shape[ragged_idx - 1]
    if bool((offsets[1:] < offsets[:-1]).any()) or int(offsets[0]) < 0 or int(offsets[-1]) > extent:
        raise ValueError(f"offsets are not increasing within the {extent} packed rows")
    if lengths is not None:
        if lengths.shape != (offsets.numel() - 1,) or bool((lengths < 0).any()) or \
                bool((offsets[:-1] + lengths > extent).any()):
            raise ValueError("lengths reach past the packed rows")


def _all_tensors(values: Sequence[object], what: str) -> None:
    if not all(isinstance(v, torch.Tensor) and is_plain(v) for v in values):
        raise ValueError(f"{what} are not all strided tensors")


def clone(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of any tensor, its memory layout kept (``preserve_format`` is refused by sparse
    tensors: ``unsupported memory format option Preserve``)."""
    if is_plain(tensor):
        return tensor.clone(memory_format=torch.preserve_format)
    return tensor.clone()


# --------------------------------------------------------------------------------------------
# Tensor subclasses that wrap plain tensors (torchao's quantized weights)
# --------------------------------------------------------------------------------------------


def is_wrapper_subclass(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a tensor subclass made of inner tensors that torch's
    ``__tensor_flatten__``/``__tensor_unflatten__`` protocol takes apart and puts back (torchao's
    ``AffineQuantizedTensor`` and ``Int8Tensor`` weights after ``quantize_``)."""
    cls = type(tensor)
    return (cls is not torch.Tensor and cls is not torch.nn.Parameter and hasattr(tensor, "__tensor_flatten__")
            and hasattr(cls, "__tensor_unflatten__"))


def subclass_parts(tensor: torch.Tensor) -> tuple[dict[str, torch.Tensor], object]:
    """The inner tensors of a wrapper subclass by attribute name, and its context (the
    non-tensor metadata ``__tensor_unflatten__`` takes back)."""
    names, context = tensor.__tensor_flatten__()  # type: ignore[attr-defined]  # the subclass protocol
    return {name: getattr(tensor, name) for name in names}, context


def rebuild_subclass(cls: type, parts: dict[str, torch.Tensor], context: object, shape: list[int],
                     stride: list[int]) -> torch.Tensor:
    """A wrapper subclass from its parts, by the class's own ``__tensor_unflatten__``; ``cls``
    must be a tensor subclass that has one (the caller resolved it under the import rules)."""
    if not (isinstance(cls, type) and issubclass(cls, torch.Tensor) and hasattr(cls, "__tensor_unflatten__")):
        raise UntrustedCodeError(f"{cls!r} is not a tensor subclass that rebuilds from its parts; refused")
    return cls.__tensor_unflatten__(parts, context, torch.Size(shape), tuple(stride))
