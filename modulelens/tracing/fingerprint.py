"""Which weights a recorded call saw: parameters, buffers, and a fingerprint of their bits.

The tracer snapshots a target's state only when it changed since the last recorded call. Version
counters miss writes through ``.data``, so each recorded call also fingerprints every weight; this
is the cost that dominates a small module's recording overhead (benchmarks/bench_recording.py).
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch
import xxhash

from modulelens.format.layouts import is_plain, is_wrapper_subclass, subclass_parts
from modulelens.tracing.distributed import dtensor_type
from modulelens.tracing.offload import offloaded
from modulelens.tracing.snapshot import outside_functorch, unwrap_functorch

LiveState = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], tuple[Any, ...]]


def live_state(module: torch.nn.Module) -> LiveState:
    """Parameters, buffers and the key that tells whether they changed since the last recorded call.

    Version counters alone miss writes through ``.data`` (``p.data.add_(...)``, the update of many
    hand-written training loops, does not bump ``p._version``), and a snapshot shared by calls
    that saw different weights makes replay, ``verify`` and ``export`` wrong. So the key also holds
    each tensor's storage address and a fingerprint of its bits (see :func:`fingerprints`).
    """
    params: dict[str, torch.Tensor] = {}
    buffers: dict[str, torch.Tensor] = {}
    _collect(module, "", params, buffers)
    tensors = [*params.values(), *buffers.values()]
    try:
        key, prints = _plain_key_and_fingerprints(tensors)
    except RuntimeError:  # no storage: weights wrapped by torch.func (functional_call under grad or vmap), sparse weights
        tensors = [unwrap_functorch(t, stacked=True) for t in tensors]
        dtensor = dtensor_type()
        key = tuple((id(t), t._version, t.data_ptr() if is_plain(t) and not is_wrapper_subclass(t)
                     and not (dtensor and isinstance(t, dtensor)) else 0) for t in tensors)
        with outside_functorch():  # a sparse or nested weight is not fingerprinted (and is refused when saved)
            return params, buffers, (key, fingerprints([t if is_plain(t) else _NOTHING for t in tensors]))
    return params, buffers, (key, prints)


def _collect(module: torch.nn.Module, prefix: str, params: dict[str, torch.Tensor],
             buffers: dict[str, torch.Tensor]) -> None:
    """What ``named_parameters()``/``named_buffers()`` yield with duplicates kept, in their order
    (``named_modules(remove_duplicate=False)``'s), read straight from each submodule's own dicts:
    the generator walks cost a third of :func:`live_state`'s time, which runs at every recorded call.
    An ``nn.DataParallel`` replica holds its device's copies of the weights as plain attributes,
    listed in ``_former_parameters`` (its ``_parameters`` is empty)."""
    own: dict[str, torch.Tensor | None] = module._parameters  # type: ignore[assignment]  # Parameter is a Tensor
    attributes = vars(module)  # (getattr of a name a module lacks goes through Module.__getattr__ and raises)
    if attributes.get("_is_replica", False):
        own = attributes.get("_former_parameters", own)
    for name, param in own.items():
        if param is not None:
            # a meta tensor is an offloaded one (accelerate) or has no data: tracing/offload.py decides
            params[prefix + name] = param if not param.is_meta else offloaded(module, name, param)
    for name, buffer in module._buffers.items():
        if buffer is not None:
            buffers[prefix + name] = buffer if not buffer.is_meta else offloaded(module, name, buffer)
    for name, sub in module._modules.items():
        if sub is not None:
            _collect(sub, f"{prefix}{name}.", params, buffers)


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _plain_key_and_fingerprints(tensors: list[torch.Tensor]) -> tuple[tuple[Any, ...], tuple[int, ...]]:
    """:func:`live_state`'s key (identity, version counter, storage address of each tensor) and
    :func:`fingerprints`, in one pass: the common weight (a plain, contiguous CPU tensor of at most
    :data:`_HASH_IN_PLACE_MAX_BYTES`) is keyed and hashed inline, the rest go through
    :func:`fingerprints` together. A tensor listed twice (tied weights) is fingerprinted once.
    Raises ``RuntimeError`` for a tensor without storage, as ``data_ptr()`` does."""
    dtensor = dtensor_type()
    key: list[tuple[int, int, int]] = []
    prints: list[int] = []
    first: dict[int, int] = {}  # id(tensor) -> the position of its first listing
    tied: list[tuple[int, int]] = []  # (position, position of the same tensor's first listing)
    rest: list[int] = []
    for position, tensor in enumerate(tensors):
        identity = id(tensor)
        if type(tensor) in _PLAIN_TYPES and tensor.is_cpu:
            address = tensor.data_ptr()
            key.append((identity, tensor._version, address))
        else:
            key.append((identity, tensor._version,
                        0 if dtensor is not None and isinstance(tensor, dtensor) else tensor.data_ptr()))
            address = 0
        prints.append(0)
        if identity in first:
            tied.append((position, first[identity]))
            continue
        first[identity] = position
        size = tensor.nbytes if address else 0
        if 0 < size <= _HASH_IN_PLACE_MAX_BYTES and tensor.is_contiguous():
            prints[position] = xxhash.xxh3_64_intdigest((ctypes.c_char * size).from_address(address))
        else:
            rest.append(position)
    if rest:
        for position, value in zip(rest, fingerprints([tensors[i] for i in rest]), strict=True):
            prints[position] = value
    for position, original in tied:
        prints[position] = prints[original]
    return tuple(key), tuple(prints)


_NOTHING = torch.empty(0)


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# Below this many bytes a CPU tensor is fingerprinted by hashing its memory in place (xxh3, ~3 us
# a tensor); above it summing on its own device is faster (~11 vs ~9 GB/s here).
_HASH_IN_PLACE_MAX_BYTES = 1 << 20


def fingerprints(tensors: list[torch.Tensor]) -> tuple[int, ...]:
    """A fingerprint of each tensor's bits: any change of a single element changes it.

    Small plain CPU tensors are hashed in place with xxh3 (every change shows, a permutation
    included); the rest are summed as integers of the same width, in int64 on their own device (a
    change that keeps the integer sum, such as a permutation or two edits that cancel exactly, does
    not show). Per-tensor torch reductions cost ~15 us each, which made fingerprinting most of a
    small module's recording overhead (benchmarks/bench_recording.py). One pass over the weights per
    recorded call (never during warm-up or after early stop), one device sync per device. DTensors
    are fingerprinted by their local shard, so no rank waits for another.
    """
    dtensor = dtensor_type()
    sums: dict[torch.device, list[torch.Tensor]] = {}
    order: list[tuple[torch.device | None, int]] = []  # (device, index into its sums) or (None, fingerprint)
    for tensor in tensors:
        local = tensor.to_local() if dtensor is not None and isinstance(tensor, dtensor) else tensor
        if is_wrapper_subclass(local):  # torchao's quantized weights: the fingerprints of their parts
            order.append((None, hash(fingerprints(list(subclass_parts(local)[0].values())))))
            continue
        hashed = _hash_in_place(local)
        if hashed is not None:
            order.append((None, hashed))
            continue
        width = _SAME_SIZE_INT.get(local.element_size())
        if local.device.type == "meta" or local.numel() == 0 or width is None:
            order.append((None, 0))
            continue
        on_device = sums.setdefault(local.device, [])
        order.append((local.device, len(on_device)))
        on_device.append(_bit_sum(local.detach(), width))
    values = {device: torch.stack(found).tolist() for device, found in sums.items()}
    return tuple(values[device][i] if device is not None else i for device, i in order)


def sums_bits(tensor: torch.Tensor) -> bool:
    """Whether :func:`fingerprints` sums ``tensor``'s bits (then :func:`bit_sum_width` says as
    what) rather than hashing them in place: a streamed weight is checked against it
    (tracing/weights.py)."""
    return not (type(tensor) in (torch.Tensor, torch.nn.Parameter) and tensor.is_cpu and tensor.is_contiguous()
                and 0 < tensor.nbytes <= _HASH_IN_PLACE_MAX_BYTES and tensor.data_ptr())


def bit_sum_width(tensor: torch.Tensor) -> torch.dtype:
    """The integer type :func:`_bit_sum` reads ``tensor``'s bits as."""
    if tensor.is_contiguous() and (tensor.numel() * tensor.element_size()) % 8 == 0:
        try:
            tensor.reshape(-1).view(torch.int64)
            return torch.int64
        except RuntimeError:
            pass
    return _SAME_SIZE_INT[tensor.element_size()]


def _hash_in_place(tensor: torch.Tensor) -> int | None:
    """xxh3 of a small, contiguous, plain CPU tensor's bytes, read where they are; ``None`` for
    anything else (a subclass, a view with gaps, another device, a large tensor)."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or not tensor.is_cpu:
        return None
    size = tensor.nbytes
    if not 0 < size <= _HASH_IN_PLACE_MAX_BYTES or not tensor.is_contiguous():
        return None
    address = tensor.data_ptr()
    if not address:
        return None
    return xxhash.xxh3_64_intdigest((ctypes.c_char * size).from_address(address))


def _bit_sum(tensor: torch.Tensor, width: torch.dtype) -> torch.Tensor:
    """The sum of ``tensor``'s bits read as integers, in int64 (wrapping). Read as int64 when the
    bytes allow it: summing int64 natively is ~8x faster than widening each int32 of a float32
    weight (benchmarks/bench_recording.py), and a change of any element still changes the sum."""
    if tensor.is_contiguous() and (tensor.numel() * tensor.element_size()) % 8 == 0:
        try:
            return tensor.reshape(-1).view(torch.int64).sum()
        except RuntimeError:  # an offset into its storage that int64 cannot start at
            pass
    return tensor.view(width).sum(dtype=torch.int64)
