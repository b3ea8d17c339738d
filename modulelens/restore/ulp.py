"""Errors in units in the last place (ULPs) of a floating dtype: the one home of that measure.

A fixed ``atol`` is wrong both ways: one bf16 ULP on ``[16, 32)`` is 0.125, so ``atol=1e-2`` fails
a correct bf16 kernel, while the same ``atol`` passes an fp32 result that is thousands of ULPs
off. Counting ULPs of the dtype the result is stored in measures every dtype on its own scale.

Two measures, both returned as float64 tensors, elementwise:

* :func:`ulp_error` ``(actual, expected, dtype)``: ``|actual - expected| / ulp(expected)``, where
  ``ulp(x)`` is the spacing of ``dtype``'s values at ``|x|`` (:func:`ulp`). ``expected`` may be of a
  wider dtype than ``dtype`` (a float64 oracle of a bf16 kernel): the error is then in the units
  of the narrower dtype, as an accuracy claim ("within 1 ULP of the exact result") means.
* :func:`ulp_distance` ``(a, b)``: how many values of their (common) dtype lie between ``a`` and
  ``b``, counting one of the two ends: ``0`` for equal values, ``1`` for neighbours.

Special values, the same in both:

* NaN against NaN is ``0`` (any payload, any sign); NaN against a number is ``inf``;
* an infinity against the same infinity is ``0``; against anything else ``inf`` (never "one ULP
  past the largest finite value", which would call an overflow nearly right);
* ``-0.0`` against ``+0.0`` is ``0``: they are equal values (an exact fingerprint of the bits
  still tells them apart, see :mod:`modulelens.format.op_trace`);
* next to zero the spacing is the dtype's smallest subnormal (for float8_e8m0fnu, which has no
  zero and no subnormals, its smallest value), so a tiny absolute error can be many ULPs there.

Dtypes: float64, float32, float16, bfloat16 and the float8 formats torch has (``float8_e4m3fn``,
``float8_e4m3fnuz``, ``float8_e5m2``, ``float8_e5m2fnuz``, ``float8_e8m0fnu``); complex64 and
complex128 per component (the larger of the real and imaginary parts' errors). The spacings come
from each format's mantissa width and smallest normal exponent (:data:`MANTISSA_BITS`), not from
``torch.finfo(dtype).eps``: torch 2.13 reports ``eps = 0.125`` for float8_e5m2fnuz, which has two
mantissa bits (eps 0.25); ``tests/restore/test_ulp.py`` checks every spacing against the values
each 8- and 16-bit dtype can hold, enumerated. Packed sub-byte dtypes (``float4_e2m1fn_x2``) hold
two values per element and are refused.
"""

from __future__ import annotations

import functools

import torch

# Explicit mantissa bits of each floating format (the precision minus the implicit leading bit).
MANTISSA_BITS: dict[torch.dtype, int] = {
    torch.float64: 52, torch.float32: 23, torch.float16: 10, torch.bfloat16: 7,
    **{getattr(torch, name): bits for name, bits in (
        ("float8_e4m3fn", 3), ("float8_e4m3fnuz", 3), ("float8_e5m2", 2), ("float8_e5m2fnuz", 2),
        ("float8_e8m0fnu", 0)) if hasattr(torch, name)},
}
_COMPONENTS = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def supported(dtype: torch.dtype) -> bool:
    """Whether ULPs of ``dtype`` are defined here (every floating dtype torch has but packed ones).

    Example::

        supported(torch.bfloat16)   # True
        supported(torch.int32)      # False
    """
    return dtype in MANTISSA_BITS or dtype in _COMPONENTS


def _real_dtype(dtype: torch.dtype) -> torch.dtype:
    real = _COMPONENTS.get(dtype, dtype)
    if real not in MANTISSA_BITS:
        raise TypeError(f"ULPs are defined for floating dtypes ({', '.join(_names())}), not {dtype}")
    return real


def _names() -> list[str]:
    return [str(d).removeprefix("torch.") for d in (*MANTISSA_BITS, *_COMPONENTS)]


def ulp(values: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The spacing of ``dtype``'s values at each ``|value|``, as float64: ``2 ** (e - m)`` where
    ``e = floor(log2 |value|)`` (at least the smallest normal exponent) and ``m`` the mantissa bits.

    Args:
        values: any real floating tensor (converted to float64 to read its magnitudes).
        dtype: whose spacing (default: ``values.dtype``).

    Returns:
        A float64 tensor of ``values``' shape; NaN where a value is NaN or infinite.

    Raises:
        TypeError: ``dtype`` is not a floating dtype with ULPs (:func:`supported`).

    Example::

        ulp(torch.tensor([1.0, 16.0]), torch.bfloat16)   # tensor([0.0078, 0.1250], dtype=torch.float64)
    """
    dtype = _real_dtype(dtype or values.dtype)
    magnitude = values.detach().to(torch.float64).abs()
    _, exponent = torch.frexp(magnitude)  # magnitude = m * 2**exponent with m in [0.5, 1)
    smallest = _min_exponent(dtype)
    exponent = torch.where(magnitude == 0, smallest, (exponent - 1).clamp_min(smallest))
    spacing = torch.ldexp(torch.ones_like(magnitude), exponent - MANTISSA_BITS[dtype])
    return torch.where(torch.isfinite(magnitude), spacing, torch.full_like(magnitude, float("nan")))


@functools.cache
def _min_exponent(dtype: torch.dtype) -> int:
    """log2 of the smallest normal value of ``dtype``."""
    _, exponent = torch.frexp(torch.tensor(torch.finfo(dtype).smallest_normal, dtype=torch.float64))
    return int(exponent) - 1


def ulp_error(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``|actual - expected|`` in ULPs of ``dtype`` at ``expected``, elementwise (float64).

    Args:
        actual: the result to judge (any floating or complex dtype, the shape of ``expected``).
        expected: the reference values (may be wider than ``dtype``: a float64 oracle).
        dtype: whose ULPs count (default: ``actual``'s dtype when it is the narrower of the two,
            else ``expected``'s).

    Returns:
        A float64 tensor: 0 where the values are equal (``-0.0 == +0.0``, NaN against NaN, the same
        infinity), ``inf`` where one is NaN or infinite and the other is not the same.

    Raises:
        TypeError: a dtype without ULPs (integers, bool, packed float4).
        ValueError: the shapes differ.

    Example::

        ulp_error(torch.tensor([1.0 + 2**-23]), torch.tensor([1.0]))      # tensor([1.], dtype=torch.float64)
        ulp_error(candidate_bf16, oracle_fp64)                              # in bf16 ULPs
    """
    if actual.shape != expected.shape:
        raise ValueError(f"ulp_error: shapes {list(actual.shape)} and {list(expected.shape)} differ")
    dtype = dtype or _narrower(actual.dtype, expected.dtype)
    if actual.dtype.is_complex or expected.dtype.is_complex or dtype in _COMPONENTS:
        real = _real_dtype(dtype)
        a, e = _components(actual), _components(expected)
        return torch.maximum(ulp_error(a[..., 0], e[..., 0], real), ulp_error(a[..., 1], e[..., 1], real))
    dtype = _real_dtype(dtype)
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    errors = (a - e).abs() / ulp(e, dtype)
    return _special_values(a, e, errors)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many values of the tensors' dtype lie between ``a`` and ``b`` (one end counted), elementwise.

    Exact up to ``2**53`` (float64 tensors beyond that are rounded: they are that far apart).

    Args:
        a, b: tensors of one floating (or complex) dtype and one shape.

    Returns:
        A float64 tensor: ``0`` for equal values, ``1`` for neighbours; specials as :func:`ulp_error`.

    Raises:
        TypeError: the dtypes differ or have no ULPs.
        ValueError: the shapes differ.

    Example::

        ulp_distance(torch.tensor([1.0], dtype=torch.bfloat16), torch.tensor([1.0078125], dtype=torch.bfloat16))
        # tensor([1.], dtype=torch.float64)
    """
    if a.dtype != b.dtype:
        raise TypeError(f"ulp_distance needs one dtype, got {a.dtype} and {b.dtype} (ulp_error compares dtypes)")
    if a.shape != b.shape:
        raise ValueError(f"ulp_distance: shapes {list(a.shape)} and {list(b.shape)} differ")
    if a.dtype in _COMPONENTS:  # the parts in their own dtype (complex64: float32)
        ca, cb = torch.view_as_real(a.detach().to("cpu")), torch.view_as_real(b.detach().to("cpu"))
        return torch.maximum(ulp_distance(ca[..., 0], cb[..., 0]), ulp_distance(ca[..., 1], cb[..., 1]))
    dtype = _real_dtype(a.dtype)
    a, b = a.detach().to("cpu").contiguous(), b.detach().to("cpu").contiguous()
    if dtype.itemsize <= 2:  # every value of the dtype, ranked once: fnuz and e8m0 layouts need no rules
        table = _ranks(dtype)
        distance = (table[_bits(a)] - table[_bits(b)]).abs().to(torch.float64)
    else:
        distance = _ordered_distance(a, b)
    return _special_values(a.to(torch.float64), b.to(torch.float64), distance)


def _narrower(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    ra, rb = _real_dtype(a), _real_dtype(b)
    return a if MANTISSA_BITS[ra] <= MANTISSA_BITS[rb] else b


def _components(values: torch.Tensor) -> torch.Tensor:
    """``values`` as ``[..., 2]`` (real, imaginary) float64."""
    values = values.detach().to("cpu")
    if values.dtype.is_complex:
        return torch.view_as_real(values.to(torch.complex128))
    return torch.stack([values.to(torch.float64), torch.zeros_like(values, dtype=torch.float64)], dim=-1)


def _special_values(a: torch.Tensor, b: torch.Tensor, errors: torch.Tensor) -> torch.Tensor:
    """NaN and infinities by the rules of the module docstring; ``a``/``b`` as float64."""
    a_nan, b_nan = torch.isnan(a), torch.isnan(b)
    nonfinite = ~torch.isfinite(a) | ~torch.isfinite(b)
    same = (a_nan & b_nan) | (torch.isinf(a) & (a == b))
    errors = torch.where(nonfinite, torch.full_like(errors, float("inf")), errors)
    return torch.where(same, torch.zeros_like(errors), errors)


def _bits(values: torch.Tensor) -> torch.Tensor:
    """The bit patterns of an 8- or 16-bit float tensor as int64 indices (0 .. 2**bits - 1)."""
    flat = values.reshape(-1)
    if values.dtype.itemsize == 1:
        return flat.view(torch.uint8).to(torch.int64).reshape(values.shape)
    return (flat.view(torch.int16).to(torch.int64) & 0xFFFF).reshape(values.shape)


@functools.cache
def _ranks(dtype: torch.dtype) -> torch.Tensor:
    """Bit pattern -> position among the dtype's distinct finite values in increasing order
    (``-0.0`` and ``+0.0`` share one); NaN and infinities get 0 (:func:`_special_values` decides those)."""
    count = 1 << (8 * dtype.itemsize)
    patterns = torch.arange(count, dtype=torch.int64)
    raw = patterns.to(torch.uint8) if dtype.itemsize == 1 else patterns.to(torch.int16)  # wraps to the bit pattern
    values = raw.view(dtype).to(torch.float64)
    finite = torch.isfinite(values)
    distinct = torch.unique(values[finite])  # sorted; -0.0 == +0.0
    ranks = torch.zeros(count, dtype=torch.int64)
    ranks[finite] = torch.searchsorted(distinct, values[finite])
    return ranks


def _ordered_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """For 32- and 64-bit floats: the bit patterns as integers ordered like the values (negative
    values mirrored below zero, both zeros at 0), subtracted without overflowing int64."""
    int_type, magnitude_mask = (torch.int32, 0x7FFFFFFF) if a.dtype.itemsize == 4 else (torch.int64, 0x7FFFFFFFFFFFFFFF)

    def ordered(values: torch.Tensor) -> torch.Tensor:
        bits = values.view(int_type).to(torch.int64)
        return torch.where(bits < 0, -(bits & magnitude_mask), bits)

    oa, ob = ordered(a), ordered(b)
    same_side = (oa >= 0) == (ob >= 0)
    # across zero the distance is |oa| + |ob|, which may pass int64's range: add in float64
    across = oa.abs().to(torch.float64) + ob.abs().to(torch.float64)
    return torch.where(same_side, (oa - ob).abs().to(torch.float64), across)


__all__ = ["MANTISSA_BITS", "supported", "ulp", "ulp_distance", "ulp_error"]
