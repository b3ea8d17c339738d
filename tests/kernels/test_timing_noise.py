"""The speedup spread and the noise rule (docs/kernels.md "Timing and noise"), on fixed timing series.

No test here times anything: the series are made up so the verdict is deterministic. Timed runs of
the rule are in the report of a real ``kernel verify`` on a GPU.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from modulelens.kernels.verify import _timing
from modulelens.tools.timing import (
    NOISY_SPREAD,
    SAME_SHAPES_AGREEMENT,
    compare_timings,
    timing_noise,
    timing_stats,
)

STEADY_REF = [2.00, 2.01, 2.02, 1.99, 2.00, 2.03, 1.98, 2.00, 2.01, 2.00]  # ms, spread ~2%
STEADY_CAND = [1.00, 1.01, 0.99, 1.00, 1.02, 1.00, 0.98, 1.00, 1.01, 1.00]


def test_stats_give_p10_median_p90_and_the_spread() -> None:
    stats = timing_stats(list(range(1, 11)), warmup=2)
    assert (stats["p10_ms"], stats["median_ms"], stats["p90_ms"]) == pytest.approx((1.9, 5.5, 9.1))
    assert stats["spread"] == pytest.approx((9.1 - 1.9) / 5.5)
    assert stats["trials"] == 10 and stats["warmup"] == 2


def test_steady_timings_give_a_tight_speedup_that_can_be_trusted() -> None:
    result = compare_timings(timing_stats(STEADY_REF, 10), timing_stats(STEADY_CAND, 10))
    assert result["speedup"] == pytest.approx(2.0, rel=0.01)
    assert result["speedup_low"] <= result["speedup"] <= result["speedup_high"] < 2.1
    assert result["noisy"] is False and result["noise"] == []


def test_one_outlier_moves_the_mean_but_not_the_median_speedup() -> None:
    """The old report divided means: one 50 ms stall in 100 reference trials read as 1.5x more."""
    stalled = STEADY_REF * 10
    stalled[37] = 102.0
    result = compare_timings(timing_stats(stalled, 10), timing_stats(STEADY_CAND * 10, 10))
    assert result["speedup"] == pytest.approx(2.0, rel=0.01)
    assert timing_stats(stalled, 10)["mean_ms"] / timing_stats(STEADY_CAND * 10, 10)["mean_ms"] > 2.9
    assert result["noisy"] is False  # one trial in a hundred does not widen p10-p90


def test_a_wide_series_is_too_noisy() -> None:
    wide = [1.0, 3.0, 1.2, 2.8, 1.1, 2.9, 1.0, 3.1, 1.3, 2.7]  # a shared machine's other jobs
    result = compare_timings(timing_stats(wide, 10), timing_stats(STEADY_CAND, 10))
    assert result["noisy"] is True
    assert result["noise"][0].startswith("reference times spread") and f"more than {NOISY_SPREAD:.0%}" in result["noise"][0]
    assert result["speedup_high"] / result["speedup_low"] > 2


def _row(reference: list[float], candidate: list[float]) -> dict[str, Any]:
    return compare_timings(timing_stats(reference, 10), timing_stats(candidate, 10))


def test_samples_with_the_same_shapes_must_agree() -> None:
    """Issue 23: 22.6x and 1.14x reported for the same shapes. Each series alone is steady (a
    reference sample that ran while something else held the GPU), so only the disagreement shows it."""
    slow = [22.6 * t for t in STEADY_CAND]
    rows = [("call 0", "float32[8, 64]", _row(slow, STEADY_CAND)),
            ("random 0", "float32[8, 64]", _row([1.14 * t for t in STEADY_CAND], STEADY_CAND)),
            ("call 1", "float32[1, 64]", _row([5 * t for t in STEADY_CAND], STEADY_CAND))]
    reasons = timing_noise(rows)
    assert len(reasons) == 1 and "call 0 22.6x, random 0 1.14x" in reasons[0]
    assert f"more than {SAME_SHAPES_AGREEMENT:g}x apart" in reasons[0]
    assert timing_noise(rows[1:]) == []  # different shapes may differ


def test_the_kernel_report_carries_the_spread_and_the_verdict() -> None:
    """kernels.verify's summary on a fake reference/candidate exchange (what the workers write)."""
    stats = lambda series: timing_stats(series, 10)  # noqa: E731
    info = {"l2_flush_bytes": 1 << 26, "samples": [
        {"id": "call 0", "shapes": "float32[8, 64]", "reference": {"timing": stats([22.6 * t for t in STEADY_CAND])}},
        {"id": "random 0", "shapes": "float32[8, 64]", "reference": {"timing": stats([1.14 * t for t in STEADY_CAND])}},
    ]}
    result = {"samples": [{"id": "call 0", "timing": stats(STEADY_CAND)}, {"id": "random 0", "timing": stats(STEADY_CAND)}]}
    report: dict[str, Any] = {"settings": {"warmup": 10, "trials": 10}, "samples": [{"passed": True}, {"passed": True}],
                              "notes": [], "review_required": False, "review_reasons": []}
    _timing(report, info, result)
    timing = report["timing"]
    assert timing["trusted"] is False and "disagree" in timing["noise"][0]
    assert any(n.startswith("timings too noisy to trust") for n in report["notes"])
    row = timing["samples"][0]
    assert row["reference"]["p10_ms"] < row["reference"]["median_ms"] < row["reference"]["p90_ms"]
    assert row["speedup"] == pytest.approx(22.6, rel=0.01) and row["speedup_low"] < row["speedup_high"]
    assert timing["speedup_geomean"] == pytest.approx(math.sqrt(22.6 * 1.14), rel=0.01)
    assert timing["speedup_p10"] < timing["speedup_median"] < timing["speedup_p90"]
    assert report["review_required"] is True  # above 10x on one sample


def test_steady_kernel_report_is_trusted() -> None:
    stats = lambda series: timing_stats(series, 10)  # noqa: E731
    info = {"samples": [{"id": f"call {i}", "shapes": "float32[8, 64]", "reference": {"timing": stats(STEADY_REF)}}
                        for i in range(3)]}
    result = {"samples": [{"id": f"call {i}", "timing": stats(STEADY_CAND)} for i in range(3)]}
    report: dict[str, Any] = {"settings": {"warmup": 10, "trials": 10}, "samples": [{"passed": True}] * 3,
                              "notes": [], "review_required": False, "review_reasons": []}
    _timing(report, info, result)
    assert report["timing"]["trusted"] is True and report["timing"]["noise"] == [] and report["notes"] == []
    assert report["timing"]["speedup_median"] == pytest.approx(2.0, rel=0.01)
