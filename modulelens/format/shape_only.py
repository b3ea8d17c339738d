"""Shape-only tensor records: dtype, shape and summary statistics instead of the payload.

Huge call tensors (a batch of token ids, a giant activation) can be stored this way (see
``capture(payload=PayloadPolicy(shape_only_over=..., max_bytes=...))``). The statistics are what a replay needs to build
a plausible stand-in (``load(..., synthesize=True)``): integer tensors keep their exact value
range, so synthetic indices stay valid indices.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

QUANTILES = (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99)
_SAMPLE = 1 << 20  # elements used for quantiles (a strided sample of bigger tensors)
_CHUNK = 1 << 22  # elements per step when accumulating sums
_SCRATCH = 1 << 20  # elements: chunks up to this size are converted into a per-thread buffer (8 MiB at most)
_scratch = threading.local()
# dtypes whose zeros, minimum and maximum are read in the dtype itself (float8 has no such kernels)
_NATIVE = frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                     torch.int16, torch.int8, torch.uint8})


def tensor_stats(tensor: torch.Tensor, *, quantiles: bool = True) -> dict[str, Any]:
    """Summary statistics of ``tensor`` as plain JSON: the one statistics function of modulelens.

    Stored with shape-only tensors, shown by the Jupyter tables and the MCP ``show_capture`` tool.

    Args:
        tensor: any tensor (complex as real pairs; bool gives ``fraction_true`` only).
        quantiles: also compute ``quantiles`` (a sort of up to 1M sampled elements; summaries for
            display skip it).

    Returns:
        ``numel``, ``zero_fraction``, ``nonfinite`` (when any), and over the finite values ``min``,
        ``max``, ``mean``, ``std`` (integers keep exact ``min``/``max``) and ``quantiles``.

    Example::

        >>> tensor_stats(torch.tensor([1.0, 3.0]), quantiles=False)["mean"]
        2.0
    """
    flat = tensor.detach().reshape(-1)
    numel = flat.numel()
    stats: dict[str, Any] = {"numel": numel}
    if numel == 0:
        return stats
    if flat.dtype == torch.bool:
        stats["fraction_true"] = float(flat.sum()) / numel
        return stats
    if flat.dtype.is_complex:
        flat = torch.view_as_real(flat).reshape(-1)
    integer = not flat.dtype.is_floating_point
    total = total_sq = 0.0
    zeros = nonfinite = 0
    low = high = None
    for start in range(0, numel, _CHUNK):
        chunk = _float64(flat[start:start + _CHUNK])
        own = flat[start:start + _CHUNK] if flat.dtype in _NATIVE else chunk
        # Five passes over a chunk of finite values (the usual one), none selecting by a mask: the op
        # trace takes the statistics of every op's output (format/op_trace.py, bench_op_trace.py), and
        # isfinite() alone cost more than the rest. A finite sum means every value is finite (a NaN or
        # an infinity makes it non-finite); only a non-finite one pays for selecting the finite values.
        # Zeros, minimum and maximum are exact in the tensor's own dtype, where they are read faster
        # (aminmax of float32 ~10x faster than of its float64 copy).
        chunk_total = float(chunk.sum())
        if not math.isfinite(chunk_total):
            finite = torch.isfinite(chunk)
            nonfinite += chunk.numel() - int(finite.sum())
            own = chunk = chunk[finite]
            chunk_total = float(chunk.sum())
        zeros += own.numel() - int(torch.count_nonzero(own))
        if chunk.numel():
            total += chunk_total
            total_sq += float(torch.dot(chunk, chunk))
            chunk_low, chunk_high = (float(v) for v in torch.aminmax(own))
            low = chunk_low if low is None else min(low, chunk_low)
            high = chunk_high if high is None else max(high, chunk_high)
    finite_count = numel - nonfinite
    stats["zero_fraction"] = zeros / numel
    if nonfinite:
        stats["nonfinite"] = nonfinite
    if finite_count == 0:
        return stats
    mean = total / finite_count
    variance = max(total_sq / finite_count - mean * mean, 0.0)
    stats.update(min=_number(low, integer), max=_number(high, integer), mean=mean, std=variance ** 0.5)
    if not quantiles:
        return stats
    sample = flat[:: max(1, numel // _SAMPLE)][:_SAMPLE].to(torch.float64)
    sample = sample[torch.isfinite(sample)]
    if sample.numel():
        values = torch.quantile(sample, torch.tensor(QUANTILES, dtype=torch.float64)).tolist()
        stats["quantiles"] = {str(q): _number(v, integer) for q, v in zip(QUANTILES, values, strict=True)}
    return stats


def _float64(values: torch.Tensor) -> torch.Tensor:
    """``values`` as float64, up to ``_SCRATCH`` elements in a buffer this thread reuses: a fresh
    3 MB float64 copy per call cost 0.72 ms against 0.26 ms copied into a kept buffer (the op trace
    takes the statistics of every op's output; the new memory is faulted in each time)."""
    if values.numel() > _SCRATCH:
        return values.to(torch.float64)
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None or buffer.numel() < values.numel():
        buffer = _scratch.buffer = torch.empty(max(values.numel(), 1 << 16), dtype=torch.float64)
    return buffer[:values.numel()].copy_(values)


def _number(value: float | None, integer: bool) -> float | int | None:
    if value is None:
        return None
    return round(value) if integer else value


@dataclass(frozen=True)
class ShapeOnly:
    """Stands in for a tensor stored shape-only: no values, only dtype, shape and statistics."""

    __modulelens_marker__: ClassVar[bool] = True
    dtype: torch.dtype
    shape: tuple[int, ...]
    stats: dict[str, Any] = field(default_factory=dict, compare=False)
    tensor_id: str = ""

    def describe(self) -> str:
        return f"{str(self.dtype).removeprefix('torch.')}{list(self.shape)}"

    def __repr__(self) -> str:
        return f"<shape-only {self.describe()}>"
