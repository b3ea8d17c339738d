"""Synthetic stand-ins for tensors stored shape-only (``load(..., synthesize=True)``).

A stand-in has the recorded dtype and shape and follows the recorded statistics: integer tensors
are drawn uniformly from the recorded ``[min, max]`` (so synthetic indices are valid indices),
booleans with the recorded fraction of ``True``, floating tensors from a normal distribution with
the recorded mean and std, clipped to ``[min, max]``, with the recorded fraction of zeros. Values
are deterministic per tensor (seeded from its id), so two replays see the same inputs.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch

from modulelens.format.tensors import dtype_from_name


def synthesize(entry: dict[str, Any], seed_text: str) -> torch.Tensor:
    dtype = dtype_from_name(entry["dtype"])
    shape = list(entry["shape"])
    stats = entry.get("stats", {})
    generator = torch.Generator().manual_seed(zlib.crc32(seed_text.encode()))
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
