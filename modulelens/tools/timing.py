"""The timing loop every tool uses: per-iteration latencies, so a distribution comes out.

Timing is measured per iteration so a distribution (median, p10, p90) comes out, not a mean that
one slow outlier can drag: on CUDA with a pair of CUDA events around each iteration (device time,
no host sync inside the loop), on the CPU with ``time.perf_counter`` (CPU kernels are synchronous,
so the wall clock around the call is the kernel time plus Python overhead).

:class:`CudaTimer` is the stricter loop of ``kernel verify``: an L2 flush before each trial and the
end event recorded after a device-wide synchronize. The kernel candidate worker loads this file by
path before it runs any candidate code, so it imports nothing from modulelens at module level
(``tests/kernels/test_worker_helpers.py`` keeps it so).

:func:`compare_timings` turns a reference and a candidate series into a speedup with its spread, and
:func:`timing_noise` says when a set of them is too noisy to trust (the rule is in docs/kernels.md,
"Timing and noise").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np
import torch


@dataclass
class Timing:
    """Per-iteration latencies of one timed loop, in milliseconds."""

    samples_ms: list[float] = field(default_factory=list)
    warmup: int = 0
    method: str = ""

    @property
    def iterations(self) -> int:
        return len(self.samples_ms)

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.samples_ms, q)) if self.samples_ms else math.nan

    @property
    def median_ms(self) -> float:
        return self.percentile(50)

    def to_dict(self, samples: bool = False) -> dict[str, object]:
        data: dict[str, Any] = {
            "median_ms": self.median_ms,
            "p10_ms": self.percentile(10),
            "p90_ms": self.percentile(90),
            "mean_ms": float(np.mean(self.samples_ms)) if self.samples_ms else math.nan,
            "min_ms": min(self.samples_ms, default=math.nan),
            "max_ms": max(self.samples_ms, default=math.nan),
            "iterations": self.iterations,
            "warmup": self.warmup,
            "method": self.method,
        }
        if samples:
            data["samples_ms"] = list(self.samples_ms)
        from modulelens.tools.reports import json_safe  # lazy: this module imports no modulelens code

        return json_safe(data)


@dataclass(frozen=True)
class TimingConfig:
    """How long to time: ``warmup`` untimed runs, then ``iters`` timed ones, or (``iters=None``) as
    many as fill about ``target_seconds``, clamped to ``[min_iters, max_iters]``.

    Example::

        modulelens.profile(cap, timing=TimingConfig(warmup=3, iters=50))
    """

    warmup: int = 5
    iters: int | None = None
    target_seconds: float = 1.0
    min_iters: int = 10
    max_iters: int = 1000

    def __post_init__(self) -> None:
        if self.warmup < 0 or (self.iters is not None and self.iters < 1) or self.target_seconds <= 0:
            from modulelens.errors import ToolError  # lazy: this module imports no modulelens code

            raise ToolError(f"timing needs warmup >= 0, iters >= 1 (or None) and target_seconds > 0, got {self}")


def time_iterations(
    step: Callable[[], object],
    device: torch.device,
    config: TimingConfig = TimingConfig(),
    *,
    before_each: Callable[[], object] | None = None,
) -> Timing:
    """Time ``step()`` once per iteration after ``warmup`` untimed runs.

    ``config.iters=None`` picks the count from the warm-up speed so the timed loop lasts about
    ``config.target_seconds``. ``before_each`` runs before every iteration outside the timed region
    (e.g. clearing gradients).

    Example::

        timing = time_iterations(lambda: model(x), torch.device("cpu"), TimingConfig(warmup=3, iters=50))
        print(timing.median_ms, timing.percentile(90))
    """
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    warmup, iters = config.warmup, config.iters
    start = time.perf_counter()
    for _ in range(max(warmup, 1)):
        if before_each is not None:
            before_each()
        step()
    sync()
    per_iter = (time.perf_counter() - start) / max(warmup, 1)
    if iters is None:
        iters = int(min(max(config.target_seconds / max(per_iter, 1e-7), config.min_iters), config.max_iters))
    iters = max(int(iters), 1)
    timing = Timing(warmup=max(warmup, 1))
    if cuda:
        timing.method = "CUDA events around each iteration"
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for begin, end in events:
            if before_each is not None:
                before_each()
            begin.record()
            step()
            end.record()
        sync()
        timing.samples_ms = [begin.elapsed_time(end) for begin, end in events]
    else:
        timing.method = f"time.perf_counter around each iteration ({device.type}, synchronous)"
        samples = []
        clock = time.perf_counter
        for _ in range(iters):
            if before_each is not None:
                before_each()
            t0 = clock()
            step()
            samples.append((clock() - t0) * 1e3)
        timing.samples_ms = samples
    return timing


def time_pair(
    reference: Callable[[], object],
    candidate: Callable[[], object],
    device: torch.device,
    config: TimingConfig = TimingConfig(),
) -> tuple[Timing, Timing]:
    """Time two steps that do the same work, interleaved: one iteration of each in turn (the order
    alternating), so that a machine whose speed drifts -- other jobs on a shared CPU, clocks, a
    warming GPU -- slows both alike. Timing all of one, then all of the other, reported speedups of
    0.6x to 2.2x for identical code on a shared 2-core machine (and 112x in a notebook, issue 23).

    Example::

        ref, cand = time_pair(lambda: original(x), lambda: rewrite(x), torch.device("cpu"))
        print(ref.median_ms / cand.median_ms)
    """
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    warmup = max(config.warmup, 1)
    start = time.perf_counter()
    for _ in range(warmup):
        reference()
        candidate()
    sync()
    per_pair = (time.perf_counter() - start) / warmup
    iters = config.iters
    if iters is None:
        iters = int(min(max(config.target_seconds / max(per_pair, 1e-7), config.min_iters), config.max_iters))
    method = ("CUDA events around each iteration" if cuda
              else f"time.perf_counter around each iteration ({device.type}, synchronous)") + ", interleaved"
    timings = {"reference": Timing(warmup=warmup, method=method), "candidate": Timing(warmup=warmup, method=method)}
    steps = {"reference": reference, "candidate": candidate}
    events: list[tuple[str, Any, Any]] = []
    for i in range(max(int(iters), 1)):
        for name in (("reference", "candidate") if i % 2 == 0 else ("candidate", "reference")):
            if cuda:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                steps[name]()
                end.record()
                events.append((name, begin, end))
            else:
                t0 = time.perf_counter()
                steps[name]()
                timings[name].samples_ms.append((time.perf_counter() - t0) * 1e3)
    sync()
    for name, begin, end in events:
        timings[name].samples_ms.append(begin.elapsed_time(end))
    return timings["reference"], timings["candidate"]


def timing_summary(timing: Timing) -> TimingStats:
    """:func:`timing_stats` of a :class:`Timing` (the form :func:`compare_timings` takes)."""
    return timing_stats(timing.samples_ms, timing.warmup)


class CudaTimer:
    """CUDA-event timing with an L2 flush before every trial (``kernel verify``).

    The end event is recorded after a device-wide synchronize, so work a candidate queues on
    other streams is counted (this adds the same few microseconds to reference and candidate).
    The functions are bound when the timer is built, before any candidate code is imported, so a
    candidate that replaces ``torch.cuda.synchronize`` later cannot change what is measured.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.event = torch.cuda.Event
        self.record = torch.cuda.Event.record
        self.elapsed = torch.cuda.Event.elapsed_time
        self.synchronize = torch.cuda.synchronize
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 0) or (256 << 20)
        self.flush_buffer = torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device=device)
        self.flush_bytes = self.flush_buffer.numel() * 4

    def time(self, fn: Callable[[], object], warmup: int, trials: int) -> TimingStats:
        """``warmup`` untimed calls, then ``trials`` timed ones; :func:`timing_stats` of them."""
        for _ in range(warmup):
            fn()
        self.synchronize(self.device)
        times = []
        for _ in range(trials):
            self.flush_buffer.zero_()
            self.synchronize(self.device)
            start, end = self.event(enable_timing=True), self.event(enable_timing=True)
            self.record(start)
            fn()
            self.synchronize(self.device)
            self.record(end)
            self.synchronize(self.device)
            times.append(float(self.elapsed(start, end)))
        return timing_stats(times, warmup)


# The noise rule (docs/kernels.md, "Timing and noise"): a timed series whose middle 80% is wider
# than a quarter of its median, or samples with the same shapes whose speedups differ by more than
# 1.5x, make the speedups too noisy to trust (issue 23: 22.6x and 1.14x reported for one shape).
NOISY_SPREAD = 0.25
SAME_SHAPES_AGREEMENT = 1.5


def _percentile(ordered: list[float], q: float) -> float:
    """The ``q``-th percentile of sorted values, interpolated linearly (numpy's default)."""
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class TimingStats(TypedDict):
    """A timed series in milliseconds (:func:`timing_stats`); ``spread`` is ``(p90 - p10) / median``."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    spread: float
    trials: int
    warmup: int


class SpeedupComparison(TypedDict):
    """A candidate's speedup over a reference (:func:`compare_timings`)."""

    speedup: float
    speedup_low: float
    speedup_high: float
    noisy: bool
    noise: list[str]


def timing_stats(times_ms: list[float], warmup: int) -> TimingStats:
    """Median, p10, p90, mean, sample std, min, max (ms) of a list of trial times, and the
    ``spread``: ``(p90 - p10) / median``.

    Example::

        timing_stats([1.0, 2.0, 3.0], warmup=1)["median_ms"]   # 2.0
    """
    ordered = sorted(times_ms)
    n = len(ordered)
    mean = sum(ordered) / n
    median = _percentile(ordered, 50)
    p10, p90 = _percentile(ordered, 10), _percentile(ordered, 90)
    std = math.sqrt(sum((t - mean) ** 2 for t in ordered) / (n - 1)) if n > 1 else 0.0
    return {"median_ms": median, "p10_ms": p10, "p90_ms": p90, "mean_ms": mean, "std_ms": std, "min_ms": ordered[0],
            "max_ms": ordered[-1], "spread": (p90 - p10) / median if median > 0 else math.inf, "trials": n,
            "warmup": warmup}


def compare_timings(reference: TimingStats, candidate: TimingStats) -> SpeedupComparison:
    """The speedup of ``candidate`` over ``reference`` (two :func:`timing_stats`) with its spread.

    Returns:
        ``speedup`` (reference median / candidate median), ``speedup_low`` (reference p10 /
        candidate p90) and ``speedup_high`` (reference p90 / candidate p10): the range the middle 80%
        of both series allow; ``noisy`` and ``noise`` (the reasons) by the :data:`NOISY_SPREAD` rule.

    Example::

        compare_timings(timing_stats([2.0] * 9, 1), timing_stats([1.0] * 9, 1))["speedup"]   # 2.0
    """
    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else math.inf

    noise = [f"{side} times spread {stats['spread']:.0%} of their median (p10 {stats['p10_ms']:.4g} ms, "
             f"p90 {stats['p90_ms']:.4g} ms; more than {NOISY_SPREAD:.0%} is too noisy)"
             for side, stats in (("reference", reference), ("candidate", candidate)) if stats["spread"] > NOISY_SPREAD]
    return {"speedup": ratio(reference["median_ms"], candidate["median_ms"]),
            "speedup_low": ratio(reference["p10_ms"], candidate["p90_ms"]),
            "speedup_high": ratio(reference["p90_ms"], candidate["p10_ms"]),
            "noisy": bool(noise), "noise": noise}


def timing_noise(rows: list[tuple[str, Any, dict[str, Any]]]) -> list[str]:
    """Why a set of per-sample speedups is too noisy to trust (empty: it can be trusted).

    Args:
        rows: ``(sample label, shape key, compare_timings(...) result)``; samples with equal shape
            keys do the same work, so their speedups must agree within :data:`SAME_SHAPES_AGREEMENT`.

    Example::

        timing_noise([("call 0", "f32[4,8]", a), ("random 0", "f32[4,8]", b)])   # [] or reasons
    """
    reasons = [f"{label}: {why}" for label, _, result in rows for why in result["noise"]]
    groups: dict[Any, list[tuple[str, float]]] = {}
    for label, shapes, result in rows:
        if math.isfinite(result["speedup"]) and result["speedup"] > 0:
            groups.setdefault(shapes, []).append((label, result["speedup"]))
    for members in groups.values():
        low, high = min(members, key=lambda m: m[1]), max(members, key=lambda m: m[1])
        if high[1] / low[1] > SAME_SHAPES_AGREEMENT:
            reasons.append(f"samples with the same shapes disagree: {high[0]} {high[1]:.3g}x, {low[0]} {low[1]:.3g}x "
                           f"(more than {SAME_SHAPES_AGREEMENT:g}x apart)")
    return reasons
