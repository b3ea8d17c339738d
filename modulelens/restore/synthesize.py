"""Synthetic stand-ins for tensors stored shape-only (``load(..., synthesize=True)``).

A stand-in has the recorded dtype and shape and follows the recorded statistics: integer tensors
are drawn uniformly from the recorded ``[min, max]`` (so synthetic indices are valid indices),
booleans with the recorded fraction of ``True``, floating tensors from a normal distribution with
the recorded mean and std, clipped to ``[min, max]``, with the recorded fraction of zeros. Values
are deterministic per tensor (seeded from its id), so two replays see the same inputs.

:func:`random_like` draws the same way from a live tensor's own statistics; it is the one random
input generator of modulelens (kernel verification's random samples, profiling at other batch sizes).
"""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Mapping, Sequence

import torch

from modulelens.errors import RestoreError
from modulelens.format.human import human_bytes
from modulelens.format.spec import TensorEntry
from modulelens.format.tensors import dtype_from_name


def synthesize(entry: TensorEntry, seed_text: str) -> torch.Tensor:
    """A stand-in for a shape-only tensor record ``entry`` (dtype, shape, stats), seeded by ``seed_text``.

    Raises:
        RestoreError: drawing it needs more memory than this machine has available (a shape is
            whatever the capture says: one of ``[2**40, 4]`` asked torch for 32 TiB and failed with
            its allocator's own error, or, within overcommit, got the process killed; issue 35).
    """
    dtype, shape = dtype_from_name(entry["dtype"]), list(entry["shape"])
    needed = _draw_bytes(dtype, shape)
    available = _available_bytes()
    if available is not None and needed > available:
        raise RestoreError(f"{seed_text}: a synthetic {entry['dtype']} tensor of shape {shape} needs about "
                           f"{human_bytes(needed)} of memory to draw; {human_bytes(available)} is available")
    generator = torch.Generator().manual_seed(zlib.crc32(seed_text.encode()))
    return _draw(dtype, shape, entry.get("stats", {}), generator)


def _draw_bytes(dtype: torch.dtype, shape: list[int]) -> int:
    """The peak memory of :func:`_draw`: its float64 (int64) working copy and one more of its size
    (the clamp, the zero mask), and the result."""
    numel = math.prod(shape)
    work = 16 if dtype.is_complex else 8
    return numel * (2 * work + dtype.itemsize)


def _available_bytes() -> int | None:
    """Memory this process can still take without swapping (``MemAvailable``), ``None`` where it
    cannot be read."""
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def random_like(value: torch.Tensor, generator: torch.Generator, *,
                shape: Sequence[int] | None = None) -> tuple[torch.Tensor, str]:
    """Random values with the dtype (and shape, unless ``shape`` is given) of ``value`` and its statistics.

    Floating/complex tensors: normal with the tensor's mean and std (of the finite values);
    integer tensors: uniform in the tensor's ``[min, max]`` (so indices stay valid indices), except a
    sorted 1-D integer tensor at its own shape (offsets), which is kept; bool tensors: Bernoulli with
    the tensor's fraction of ``True``; empty tensors are kept. The result is on the CPU.

    Args:
        value: the recorded tensor to imitate.
        generator: a CPU ``torch.Generator`` (seed it for reproducible draws).
        shape: the shape to draw (default: ``value.shape``).

    Returns:
        ``(tensor, how)``: the drawn tensor and a short description of the distribution.

    Example::

        x, how = random_like(torch.arange(10), torch.Generator().manual_seed(0))  # how: "kept (sorted ...)"
    """
    t = value.detach().to("cpu")
    out_shape = list(t.shape if shape is None else shape)
    if t.numel() == 0:
        return (t.clone() if shape is None else torch.zeros(out_shape, dtype=t.dtype)), "kept (empty)"
    if t.dtype == torch.bool:
        p = float(t.to(torch.float64).mean())
        return _draw(t.dtype, out_shape, {"fraction_true": p}, generator), f"bernoulli(p={p:.3g})"
    if not (t.dtype.is_floating_point or t.dtype.is_complex):
        flat = t.reshape(-1)
        if shape is None and t.dim() == 1 and t.numel() > 1 and bool((flat[1:] >= flat[:-1]).all()):
            return t.clone(), "kept (sorted integers: offsets-like)"
        lo, hi = int(flat.min()), int(flat.max())
        return _draw(t.dtype, out_shape, {"min": lo, "max": hi}, generator), f"uniform integers in [{lo}, {hi}]"
    work = t.to(torch.complex128 if t.dtype.is_complex else torch.float64)
    finite = work.reshape(-1) if t.dtype.is_complex else work[torch.isfinite(work)]
    mean = float(finite.real.mean()) if finite.numel() else 0.0
    std = float(finite.real.std()) if finite.numel() > 1 else abs(mean)
    if not math.isfinite(std) or std == 0.0:
        std = abs(mean) or 1.0
    return _draw(t.dtype, out_shape, {"mean": mean, "std": std}, generator), f"normal(mean={mean:.4g}, std={std:.4g})"


def _draw(dtype: torch.dtype, shape: list[int], stats: Mapping[str, float], generator: torch.Generator) -> torch.Tensor:
    """Random values of ``dtype``/``shape`` following ``stats`` (``fraction_true``; ``min``/``max``;
    ``mean``/``std``, floats clipped to ``min``/``max`` when given, ``zero_fraction``)."""
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) < float(stats.get("fraction_true", 0.5))
    if not (dtype.is_floating_point or dtype.is_complex):
        low, high = int(stats.get("min", 0)), int(stats.get("max", 0))
        return torch.randint(low, high + 1, shape, generator=generator, dtype=torch.int64).to(dtype)
    work = torch.float64
    real_shape = [*shape, 2] if dtype.is_complex else shape
    mean, std = float(stats.get("mean", 0.0)), float(stats.get("std", 1.0))
    values = torch.randn(real_shape, generator=generator, dtype=work) * std + mean
    if "min" in stats and "max" in stats:
        values = values.clamp(float(stats["min"]), float(stats["max"]))
    zero_fraction = float(stats.get("zero_fraction", 0.0))
    if zero_fraction > 0:
        values = torch.where(torch.rand(real_shape, generator=generator) < zero_fraction, 0.0, values)
    if dtype.is_complex:
        return torch.view_as_complex(values.contiguous()).to(dtype)
    return values.to(dtype)
