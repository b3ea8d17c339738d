"""ULPs of every floating dtype torch has (modulelens/restore/ulp.py): spacings checked against the
values each 8- and 16-bit dtype can hold, enumerated; the special values by the documented rules."""

from __future__ import annotations

import math

import pytest
import torch

from modulelens.restore.ulp import MANTISSA_BITS, supported, ulp, ulp_distance, ulp_error

SMALL = [d for d in MANTISSA_BITS if d.itemsize <= 2]


def _every_value(dtype: torch.dtype) -> torch.Tensor:
    """Every bit pattern of an 8- or 16-bit dtype, as that dtype."""
    patterns = torch.arange(1 << (8 * dtype.itemsize))
    return (patterns.to(torch.uint8) if dtype.itemsize == 1 else patterns.to(torch.int16)).view(dtype)


@pytest.mark.parametrize("dtype", SMALL, ids=str)
def test_spacing_is_the_distance_to_the_next_value_for_every_value_of_small_dtypes(dtype: torch.dtype) -> None:
    values = _every_value(dtype).to(torch.float64)
    ordered = torch.unique(values[torch.isfinite(values)])
    positive = ordered[ordered >= 0]
    assert torch.equal(ulp(positive[:-1], dtype), positive[1:] - positive[:-1])
    # and each value is exactly one ULP from its neighbour, counted both ways
    neighbours = _every_value(dtype)
    finite = torch.isfinite(neighbours.to(torch.float64))
    sorted_values = neighbours[finite][torch.argsort(neighbours[finite].to(torch.float64))]
    distinct = sorted_values[torch.cat([torch.tensor([True]), sorted_values[1:].to(torch.float64)
                                        != sorted_values[:-1].to(torch.float64)])]
    assert set(ulp_distance(distinct[1:], distinct[:-1]).tolist()) == {1.0}
    assert set(ulp_error(distinct[1:][distinct[:-1].to(torch.float64) >= 0],
                         distinct[:-1][distinct[:-1].to(torch.float64) >= 0]).tolist()) == {1.0}


def test_spacing_of_float32_and_float64_at_known_points() -> None:
    assert ulp(torch.tensor([1.0, 1.5, 2.0]), torch.float32).tolist() == [2**-23, 2**-23, 2**-22]
    assert ulp(torch.tensor([1.0], dtype=torch.float64)).item() == 2**-52
    assert ulp(torch.tensor([0.0]), torch.float32).item() == 2**-149  # the smallest subnormal
    assert ulp(torch.tensor([0.0], dtype=torch.float64)).item() == 2**-1074
    assert ulp(torch.tensor([16.0, 31.0]), torch.bfloat16).tolist() == [0.125, 0.125]  # issue 36's example
    assert math.isnan(ulp(torch.tensor([float("inf")])).item())


def test_torch_finfo_eps_is_not_used_for_float8_e5m2fnuz() -> None:
    """torch 2.13 says eps 0.125 for float8_e5m2fnuz; its two mantissa bits make 1.0's spacing 0.25."""
    one = torch.tensor([1.0], dtype=torch.float8_e5m2fnuz)
    after = torch.tensor([1.25], dtype=torch.float8_e5m2fnuz)
    assert after.to(torch.float32).item() == 1.25  # representable: the next value after 1.0
    assert ulp(one).item() == 0.25 and ulp_distance(one, after).item() == 1.0


def test_ulp_error_in_the_units_of_the_narrower_dtype() -> None:
    oracle = torch.tensor([20.0, 1.0, -3.0], dtype=torch.float64)
    candidate = torch.tensor([20.125, 1.0078125, -3.0], dtype=torch.bfloat16)
    assert ulp_error(candidate, oracle).tolist() == [1.0, 1.0, 0.0]  # bf16 ULPs: the narrower of the two
    assert ulp_error(candidate, oracle, torch.float32).tolist() == [2**-3 / 2**-19, 2**-7 / 2**-23, 0.0]
    # a fixed atol of 1e-2 would fail the first (0.125 off) and pass a 1e-3-off fp32 result: ULPs judge both alike
    off = torch.tensor([1.0 + 1e-3])
    assert ulp_error(off, torch.tensor([1.0])).item() == pytest.approx(1e-3 / 2**-23, rel=1e-3)


def test_special_values() -> None:
    nan, inf = float("nan"), float("inf")
    a = torch.tensor([nan, nan, 1.0, inf, inf, -inf, -0.0, 0.0, 3.4e38])
    b = torch.tensor([-nan, 1.0, nan, inf, 3.4e38, inf, 0.0, -0.0, inf])
    for measure in (ulp_error, ulp_distance):
        assert measure(a, b).tolist() == [0.0, inf, inf, 0.0, inf, inf, 0.0, 0.0, inf], measure.__name__


def test_distance_across_zero_and_at_the_ends_of_float64() -> None:
    tiny = torch.tensor([-5e-324, 5e-324], dtype=torch.float64)
    assert ulp_distance(tiny[:1], tiny[1:]).item() == 2.0  # -min, (both zeros), +min
    huge = torch.tensor([-1.7e308], dtype=torch.float64)
    far = ulp_distance(huge, -huge).item()
    assert math.isfinite(far) and far > 2**63  # counted in float64, no int64 overflow
    assert ulp_distance(torch.tensor([-1.0]), torch.tensor([1.0])).item() == 2 * 0x3F800000


def test_fnuz_and_e8m0_dtypes() -> None:
    for dtype in (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz):  # no negative zero: 0x80 is NaN
        bits = torch.tensor([0x80, 0x00], dtype=torch.uint8).view(dtype)
        assert math.isnan(bits[0].to(torch.float32).item())
        assert ulp_distance(bits[:1], bits[:1]).item() == 0.0 and ulp_distance(bits[:1], bits[1:]).item() == math.inf
    e8m0 = torch.tensor([1.0, 2.0, 8.0]).to(torch.float8_e8m0fnu)  # powers of two only
    assert ulp_distance(e8m0[:1], e8m0[1:2]).item() == 1.0 and ulp_distance(e8m0[:1], e8m0[2:]).item() == 3.0
    assert ulp(e8m0.to(torch.float64), torch.float8_e8m0fnu).tolist() == [1.0, 2.0, 8.0]


def test_complex_per_component() -> None:
    a = torch.tensor([complex(1.0, 2.0)], dtype=torch.complex64)
    b = torch.tensor([complex(1.0 + 2**-23, 2.0)], dtype=torch.complex64)
    assert ulp_error(b, a).tolist() == [1.0] and ulp_distance(a, b).tolist() == [1.0]
    assert supported(torch.complex128) and not supported(torch.int64)


def test_refused_arguments() -> None:
    with pytest.raises(TypeError, match="floating dtypes"):
        ulp_error(torch.tensor([1]), torch.tensor([1]))
    with pytest.raises(TypeError, match="one dtype"):
        ulp_distance(torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="shapes"):
        ulp_error(torch.zeros(2), torch.zeros(3))
    packed = getattr(torch, "float4_e2m1fn_x2", None)
    if packed is not None:
        assert not supported(packed)
