"""Verdicts in ULPs (restore/oracle.py, restore/compare.py): both directions, on real modules.

A correct low-precision rewrite (one rounding where the reference rounds after every op) fails
today's fixed tolerances and passes the oracle rule; outputs biased by one ULP (up, or away from
zero), all zeros and a constant pass fixed tolerances and fail it. Float64 outputs, random ops and
modules that leave float64 get no oracle, and say why.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from modulelens.errors import UsageError
from modulelens.restore.compare import check_ulps, compare, parse_ulps
from modulelens.restore.oracle import Float64Oracle, OracleRun, judge, oracle_factor, small_sample_allowance


class Block(nn.Module):
    """LayerNorm, a GELU MLP and the residual: run in bfloat16 or float16, it rounds after every op."""

    def __init__(self, features: int = 64, hidden: int = 256) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(features)
        self.up = nn.Linear(features, hidden)
        self.down = nn.Linear(hidden, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


def _runs(dtype: torch.dtype, seed: int = 0, scale: float = 4.0) -> tuple[torch.Tensor, torch.Tensor, OracleRun]:
    """The reference's output in ``dtype``, a correct rewrite's (float32 inside, rounded once), and the oracle."""
    torch.manual_seed(seed)
    reference = Block().to(dtype)
    x = (torch.randn(8, 64) * scale).to(dtype)
    with torch.no_grad():
        expected = reference(x)
        fused = Block()
        fused.load_state_dict({k: v.float() for k, v in reference.state_dict().items()})
        rewrite = fused(x.float()).to(dtype)
    oracle = Float64Oracle(reference).run((x,), {})
    assert oracle.outputs is not None and oracle.outputs.dtype == torch.float64, oracle.reason
    return expected, rewrite, oracle


def _one_ulp_up(values: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(values, torch.full_like(values, math.inf))


def _one_ulp_away_from_zero(values: torch.Tensor) -> torch.Tensor:
    """Every magnitude one ULP larger (the bit pattern's magnitude plus one)."""
    bits = values.contiguous().view(torch.int16)
    return torch.where(values == 0, values, (bits + 1).view(values.dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_correct_low_precision_rewrite_passes_the_oracle_where_fixed_tolerances_fail_it(dtype: torch.dtype,
                                                                                       seed: int) -> None:
    expected, rewrite, oracle = _runs(dtype, seed)
    fixed = compare(expected, rewrite, exact=False)[0]  # assert_close's per-dtype tolerances, as verify uses them
    assert not fixed.passed and fixed.rule == "tolerance" and fixed.max_ulps >= 2, fixed
    judged = compare(expected, rewrite, exact=False, oracle=oracle)[0]
    assert judged.passed and judged.rule == "oracle", judged.oracle
    verdict = judged.oracle
    assert verdict["error_rms"] <= verdict["reference_rms"] * 1.2  # rounding once is as accurate as the reference, or more
    assert verdict["factor"] == 3.0 and verdict["numel"] == 512 and not verdict["failed"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("bias", "direction"), [(_one_ulp_up, "up"), (_one_ulp_away_from_zero, "away from zero")])
def test_one_ulp_of_bias_passes_fixed_tolerances_and_fails_the_oracle(dtype: torch.dtype, bias, direction: str) -> None:
    expected, _, oracle = _runs(dtype)
    biased = bias(expected)
    assert compare(expected, biased, exact=False)[0].passed  # within rtol: one ULP is at most 0.78% (bf16), 0.1% (fp16)
    assert compare(expected, biased, exact=False, rtol=1e-2, atol=1e-2)[0].passed  # KernelBench's
    judged = compare(expected, biased, exact=False, oracle=oracle)[0]
    assert not judged.passed and "bias" in judged.oracle["failed"], judged.oracle
    assert judged.oracle["bias_direction"] == direction and 0.9 < judged.oracle["bias"] < 1.1
    assert f"biased {direction}: median error +" in judged.message and judged.max_ulps == 1.0
    assert judged.message.startswith("not within the oracle rule: ")


def test_all_zeros_and_a_constant_pass_loose_fixed_tolerances_and_fail_the_oracle() -> None:
    torch.manual_seed(3)  # small outputs, as a residual branch or a loss term has: all within atol=1e-2 of zero
    small = Block().to(torch.bfloat16)
    x = (torch.randn(8, 64) * 1e-3).to(torch.bfloat16)
    with torch.no_grad():
        for parameter in small.parameters():
            parameter.mul_(1e-2)
        expected = small(x)
    oracle = Float64Oracle(small).run((x,), {})
    assert float(expected.abs().max()) < 1e-2
    for degenerate in (torch.zeros_like(expected), torch.full_like(expected, float(expected.float().mean()))):
        assert compare(expected, degenerate, exact=False, rtol=1e-2, atol=1e-2)[0].passed
        judged = compare(expected, degenerate, exact=False, oracle=oracle)[0]
        assert not judged.passed and {"rms", "max"} <= set(judged.oracle["failed"]), judged.oracle
        assert judged.oracle["error_rms"] > 100 * judged.oracle["reference_rms"]


def test_float32_uses_a_factor_of_four_and_no_bias_test() -> None:
    expected, rewrite, oracle = _runs(torch.float32)
    judged = compare(expected, _one_ulp_up(expected), exact=False, oracle=oracle)[0]
    # a float32 reference is several ULPs off already (accumulation): one more ULP is not a defect
    assert judged.passed and judged.oracle["factor"] == 4.0 and judged.oracle["bias"] is None
    wrong = compare(expected, rewrite * (1 + 1e-4), exact=False, oracle=oracle)[0]  # passes rtol=1e-4 tolerances
    assert compare(expected, rewrite * (1 + 1e-4), exact=False, rtol=1e-4, atol=1e-4)[0].passed
    assert not wrong.passed and "rms" in wrong.oracle["failed"]


def test_nan_and_infinities_must_be_the_references() -> None:
    x = torch.tensor([1.0, -2.0, 3.0, 4.0] * 8, dtype=torch.float64)
    expected = x.to(torch.float16)
    oracle = OracleRun(outputs=x)
    nan_where_number = expected.clone()
    nan_where_number[3] = float("nan")
    judged = compare(expected, nan_where_number, exact=False, oracle=oracle)[0]
    assert not judged.passed and judged.oracle["specials"] == 1 and judged.max_ulps == math.inf
    overflowed = torch.full((32,), 70000.0, dtype=torch.float64)  # beyond float16's largest value: the reference is inf
    same_inf = judge(torch.full((32,), math.inf, dtype=torch.float16), torch.full((32,), math.inf, dtype=torch.float16),
                     overflowed)
    assert same_inf.passed and same_inf.numel == 0


def test_no_oracle_for_float64_random_ops_or_a_module_that_leaves_float64() -> None:
    x = torch.randn(4, 8)
    expected64 = torch.randn(4, 8, dtype=torch.float64)
    leaf = compare(expected64, expected64 + 1e-3, exact=False, oracle=OracleRun(outputs=expected64))[0]
    assert leaf.rule == "tolerance" and leaf.oracle == {"available": False,
                                                        "reason": "the oracle rule does not judge float64 outputs"}
    assert oracle_factor(torch.float64) is None and oracle_factor(torch.int64) is None

    dropout = Float64Oracle(nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))).run((x,), {}, training=True)
    assert dropout.outputs is None and "draws random numbers (bernoulli_)" in (dropout.reason or "")
    assert Float64Oracle(nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))).run((x,), {}).outputs is not None  # eval

    class CastsBack(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * 2).float()

    run = Float64Oracle(CastsBack()).run((x,), {})
    leaf = compare(x * 2, x * 2 + 1e-3, exact=False, oracle=run)[0]
    assert leaf.rule == "tolerance" and not leaf.passed
    assert "no float64 oracle: the module returns float32 when run in float64" in leaf.message


def test_integer_and_bool_leaves_stay_exact_under_every_rule() -> None:
    expected = (torch.arange(6), torch.tensor([True, False]))
    leaves = compare(expected, (torch.arange(6) + torch.tensor([0, 0, 0, 0, 0, 1]), torch.tensor([True, True])),
                     exact=False, ulps=1000, oracle=OracleRun(outputs=expected))
    assert [leaf.rule for leaf in leaves] == ["exact", "exact"] and not any(leaf.passed for leaf in leaves)
    assert all(leaf.max_ulps is None for leaf in leaves)


def test_ulp_tolerances_per_dtype() -> None:
    expected = torch.linspace(1, 100, 64).to(torch.bfloat16)
    two_up = _one_ulp_up(_one_ulp_up(expected))
    leaf = compare(expected, two_up, exact=False, ulps={"bfloat16": 2})[0]
    assert leaf.passed and leaf.rule == "ulps" and leaf.ulps == 2.0 and leaf.max_ulps == 2.0
    leaf = compare(expected, two_up, exact=False, ulps=1)[0]
    assert not leaf.passed and leaf.message.startswith("64/64 elements differ by more than 1 ULPs of bfloat16, max 2 ULPs")
    # a mapping without this dtype falls back to the fixed tolerances
    assert compare(expected, two_up, exact=False, ulps={"float32": 0})[0].rule == "tolerance"
    assert parse_ulps("bfloat16=2, float32=64") == {"bfloat16": 2.0, "float32": 64.0} and parse_ulps("3") == 3.0
    for bad in ("two", "int64=2", "bfloat16=-1"):
        with pytest.raises(UsageError):
            parse_ulps(bad)
    with pytest.raises(UsageError, match="must be >= 0"):
        check_ulps(-1)


def test_every_floating_leaf_reports_its_error_in_ulps_and_bit_exact_stays_bit_exact() -> None:
    expected = torch.tensor([1.0, 2.0, 3.0])
    assert compare(expected, expected.clone(), exact=True)[0].max_ulps == 0.0
    leaf = compare(expected, expected + torch.tensor([0.0, 2 ** -22, 0.0]), exact=True)[0]
    assert not leaf.passed and leaf.rule == "exact" and leaf.max_ulps == 1.0 and "max 1 ULPs of float32" in leaf.message
    assert compare(expected, expected + 1e-3, exact=False)[0].max_ulps == pytest.approx(8389, rel=1e-3)


def test_the_small_sample_allowance() -> None:
    assert small_sample_allowance(1) == pytest.approx(math.exp(3.1))
    assert small_sample_allowance(1000) == pytest.approx(1.103, abs=1e-3)
    # a scalar computed in two orders of summation: equally accurate, so it passes
    values = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    oracle = values.double().sum()
    forward, backward = values.sum(), values.flip(0).sum()
    assert judge(backward, forward, oracle).passed
