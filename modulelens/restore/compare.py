"""Leaf-by-leaf comparison of outputs: bit-exact, within per-dtype tolerances, within so many ULPs,
or against a float64 oracle (docs/tools.md, "Verdicts in ULPs").

Every floating leaf reports its largest error in ULPs of its dtype (``max_ulps``), whichever rule
judged it. The rule, per floating leaf, is the first that applies:

1. ``exact``: identical bits;
2. the **oracle rule** (:mod:`modulelens.restore.oracle`), when the caller ran the float64 oracle
   and it has this leaf: the candidate's error against the oracle within ``k`` times the
   reference's own;
3. **ULPs**: at most ``n`` ULPs apart elementwise (values of the dtype between them; a run in a
   narrower dtype: ``|actual - expected| <= n * ulp(expected)`` in that dtype), ``n`` per dtype;
4. **fixed tolerances**: ``|actual - expected| <= atol + rtol * |expected|`` (per-dtype tables).

Integer and bool leaves are compared exactly under every rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from modulelens.errors import UsageError
from modulelens.format.shape_only import ShapeOnly, tensor_stats
from modulelens.format.tensors import dtype_name
from modulelens.format.tree import expand_dataclasses, flatten_with_paths
from modulelens.format.values import Unrecorded
from modulelens.restore.oracle import OracleRun, judge, oracle_factor
from modulelens.restore.ulp import supported, ulp_distance, ulp_error

# ULP tolerances: one number for every floating dtype, or a number per dtype name ("bfloat16": 2)
UlpTolerance = float | Mapping[str, float]

# (rtol, atol) per dtype, as torch.testing.assert_close uses them.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}
# Different hardware (e.g. a CUDA capture replayed on CPU) reorders float reductions and may use
# TF32: fp32 results then agree to about 1e-4, not to the last bit.
CROSS_DEVICE_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    **DEFAULT_TOLERANCES,
    torch.float32: (1e-4, 1e-5),
    torch.complex64: (1e-4, 1e-5),
}


# Kernel candidates (``modulelens kernel verify``, exported problems): rtol = atol = KernelBench's
# per-precision tolerance (1e-4 for fp32, 1e-2 for half precision); a kernel reorders reductions
# and fuses ops, so replay's last-bit tolerances would fail every correct rewrite.
KERNEL_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4), torch.complex64: (1e-4, 1e-4),
    torch.float64: (1e-6, 1e-6), torch.complex128: (1e-6, 1e-6),
    torch.float16: (1e-2, 1e-2), torch.bfloat16: (1e-2, 1e-2),
    **{getattr(torch, name): (tol, tol) for name, tol in (
        ("float8_e4m3fn", 1.25e-1), ("float8_e5m2", 2.5e-1), ("float8_e4m3fnuz", 1.25e-1), ("float8_e5m2fnuz", 2.5e-1))
       if hasattr(torch, name)},
}
_TABLES = {"replay": DEFAULT_TOLERANCES, "cross_device": CROSS_DEVICE_TOLERANCES, "kernel": KERNEL_TOLERANCES}


def default_tolerance(dtype: torch.dtype, purpose: str = "replay") -> tuple[float, float] | None:
    """``(rtol, atol)`` for outputs of ``dtype``, or ``None`` when the dtype must match exactly.

    This is the one tolerance table of modulelens: ``purpose`` is ``"replay"`` (torch's
    ``assert_close`` defaults), ``"cross_device"`` (replay on other hardware: fp32 to 1e-4) or
    ``"kernel"`` (KernelBench's per-precision tolerances, for kernel candidates).

    Raises:
        ValueError: an unknown ``purpose``.

    Example::

        default_tolerance(torch.float32, "kernel")   # (0.0001, 0.0001)
        default_tolerance(torch.int64)               # None: exact
    """
    if purpose not in _TABLES:
        raise ValueError(f"purpose must be one of {sorted(_TABLES)}, not {purpose!r}")
    return _TABLES[purpose].get(dtype)


def tolerance_table(dtypes: Sequence[str], rtol: float | None = None, atol: float | None = None, *,
                    purpose: str = "kernel") -> dict[str, dict[str, object]]:
    """``{dtype name: {"rtol", "atol", "exact"}}`` for output dtypes, from :func:`default_tolerance`;
    ``rtol``/``atol`` override it for every floating dtype (exact dtypes stay exact).

    Example::

        tolerance_table(["float32", "int64"])
        # {"float32": {"rtol": 0.0001, "atol": 0.0001, "exact": False}, "int64": {"rtol": 0.0, "atol": 0.0, "exact": True}}
    """
    table: dict[str, dict[str, object]] = {}
    for name in sorted(set(dtypes)):
        dtype = getattr(torch, name, None)
        base = default_tolerance(dtype, purpose) if isinstance(dtype, torch.dtype) else None
        if base is None:
            table[name] = {"rtol": 0.0, "atol": 0.0, "exact": True}
        else:
            table[name] = {"rtol": base[0] if rtol is None else rtol, "atol": base[1] if atol is None else atol,
                           "exact": False}
    return table


def tolerance_for(dtype: torch.dtype, cross_device: bool = False) -> tuple[float, float]:
    return default_tolerance(dtype, "cross_device" if cross_device else "replay") or (0.0, 0.0)


def check_ulps(ulps: UlpTolerance | None) -> UlpTolerance | None:
    """``ulps`` validated: a number >= 0, or ``{dtype name: number >= 0}`` naming floating dtypes.

    Raises:
        UsageError: a negative count or a name that is not a floating dtype with ULPs.

    Example::

        check_ulps({"bfloat16": 2, "float32": 64})
        check_ulps(-1)        # UsageError
    """
    if ulps is None:
        return None
    if isinstance(ulps, Mapping):
        for name, count in ulps.items():
            dtype = getattr(torch, str(name), None)
            if not isinstance(dtype, torch.dtype) or not supported(dtype):
                raise UsageError(f"ULP tolerance for {name!r}: not a floating dtype (float32, bfloat16, float16, ...)")
            if not count >= 0:
                raise UsageError(f"ULP tolerance for {name}: must be >= 0, got {count}")
        return {str(name): float(count) for name, count in ulps.items()}
    if not ulps >= 0:
        raise UsageError(f"ULP tolerance must be >= 0, got {ulps}")
    return float(ulps)


def parse_ulps(text: str) -> UlpTolerance:
    """A ULP tolerance from the command line: ``"4"`` (every dtype) or ``"bfloat16=2,float32=64"``.

    Raises:
        UsageError: text that is neither.

    Example::

        parse_ulps("bfloat16=2,float32=64")   # {"bfloat16": 2.0, "float32": 64.0}
    """
    try:
        if "=" not in text:
            return check_ulps(float(text)) or 0.0
        pairs = [part.split("=", 1) for part in text.split(",") if part.strip()]
        return check_ulps({name.strip(): float(count) for name, count in pairs}) or {}
    except ValueError:
        raise UsageError(f"--ulps {text!r}: give a number, or dtype=number pairs (bfloat16=2,float32=64)") from None


def describe_ulps(ulps: UlpTolerance) -> str:
    """``"4 ULPs"``, or ``"bfloat16: 2, float32: 64 ULPs"``."""
    if isinstance(ulps, Mapping):
        return ", ".join(f"{name}: {count:g}" for name, count in ulps.items()) + " ULPs"
    return f"{ulps:g} ULPs"


def ulp_limit(ulps: UlpTolerance | None, dtype: torch.dtype) -> float | None:
    """The ULP tolerance ``ulps`` sets for ``dtype`` (``None``: none for it)."""
    if ulps is None or not supported(dtype):
        return None
    if isinstance(ulps, Mapping):
        limit = ulps.get(dtype_name(dtype))
        return None if limit is None else float(limit)
    return float(ulps)


@dataclass
class LeafResult:
    """How one output leaf compared."""

    path: str
    passed: bool  # nothing contradicts the recording (see ``compared``)
    kind: str  # "tensor", "value", "structure", "unrecorded", "shape-only", "synthetic"
    dtype: str | None = None
    shape: list[int] | None = None
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    mismatched: int = 0
    numel: int = 0
    rtol: float | None = None
    atol: float | None = None
    message: str = ""
    compared: bool = True  # False: the recorded leaf has no values (unrecorded, shape-only)
    max_ulps: float | None = None  # the largest elementwise error in ULPs of the judged dtype (floating leaves)
    ulps_dtype: str | None = None  # whose ULPs: the recorded dtype, or the narrower one a run was cast to
    rule: str | None = None  # what judged a tensor leaf: "exact", "oracle", "ulps", "tolerance"
    ulps: float | None = None  # the ULP tolerance (rule "ulps")
    oracle: dict[str, Any] | None = None  # the oracle verdict (OracleVerdict.to_dict), or why there was none

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        for key in ("max_abs_error", "max_rel_error", "max_ulps"):
            if isinstance(data[key], float) and not math.isfinite(data[key]):
                data[key] = str(data[key])
        return data


def compare(
    expected: object,
    actual: object,
    *,
    exact: bool,
    rtol: float | None = None,
    atol: float | None = None,
    cross_device: bool = False,
    synthetic: bool = False,
    root: str = "output",
    ulps: UlpTolerance | None = None,
    oracle: OracleRun | None = None,
    oracle_factor: float | None = None,
) -> list[LeafResult]:
    """Compare two output trees. ``exact`` demands identical bits; otherwise a floating leaf is
    judged by the float64 ``oracle`` when one is given and covers it (``k = oracle_factor``, default
    per dtype), else by ``ulps`` when it sets a tolerance for the leaf's dtype, else by
    ``rtol``/``atol`` (default: per dtype): ``|a - e| <= atol + rtol * |e|`` elementwise, NaN matching
    NaN. When the replay ran in another dtype than the recording, the default ``atol`` grows to
    ``rtol * max|e|``: rounding errors of the lower precision scale with the values' magnitude.
    ``synthetic=True`` (the replay ran on synthetic inputs) checks shapes only: no leaf counts as
    compared. ``root`` names the compared tree in leaf paths and messages.

    Example::

        leaves = compare(call.output, candidate_output, exact=False, ulps={"bfloat16": 2})
        leaves[0].max_ulps, leaves[0].rule          # 1.0, "ulps"
    """
    expected_leaves, expected_spec = flatten_with_paths(expand_dataclasses(expected))
    actual_leaves, actual_spec = flatten_with_paths(expand_dataclasses(actual))
    if expected_spec != actual_spec:
        return [LeafResult(
            path=f"<{root}>", passed=False, kind="structure",
            message=f"{root} structure differs: expected {_describe(expected_spec)}, got {_describe(actual_spec)}",
        )]
    rule = _Rule(exact, rtol, atol, cross_device, check_ulps(ulps), oracle_factor)
    oracles, references = _oracle_leaves(oracle, expected_spec, len(expected_leaves))
    results = []
    for position, ((key, want), (_, got)) in enumerate(zip(expected_leaves, actual_leaves, strict=False)):
        path = root + key
        if synthetic:
            results.append(_compare_synthetic(path, want, got))
        elif isinstance(want, ShapeOnly):
            results.append(_compare_shape_only(path, want, got, rtol, atol, cross_device))
        else:
            results.append(_compare_leaf(path, want, got, rule, (oracles[position], references[position])))
    return results


@dataclass(frozen=True)
class _Rule:
    """How :func:`compare` judges floating leaves (its keyword arguments, validated)."""

    exact: bool
    rtol: float | None
    atol: float | None
    cross_device: bool
    ulps: UlpTolerance | None
    oracle_factor: float | None


def _oracle_leaves(oracle: OracleRun | None, spec: pytree.TreeSpec, count: int) -> tuple[list[object], list[object]]:
    """Per expected leaf: its oracle (a tensor, or a string saying why there is none, or ``None``
    when no oracle was asked for) and the reference's leaf the oracle rule measures (``None``: the
    expected one)."""
    if oracle is None:
        return [None] * count, [None] * count
    if oracle.outputs is None:
        return [oracle.reason or "no float64 oracle"] * count, [None] * count
    leaves, oracle_spec = flatten_with_paths(expand_dataclasses(oracle.outputs))
    if oracle_spec != spec:
        return ["the float64 run returned another output structure"] * count, [None] * count
    references: list[object] = [None] * count
    if oracle.reference is not None:
        reference_leaves, reference_spec = flatten_with_paths(expand_dataclasses(oracle.reference))
        if reference_spec == spec:
            references = [leaf for _, leaf in reference_leaves]
    return [leaf for _, leaf in leaves], references


def _describe(spec: pytree.TreeSpec) -> str:
    text = str(spec)
    return text if len(text) < 120 else text[:117] + "..."


def _compare_leaf(path: str, want: object, got: object, rule: _Rule, oracle: tuple[object, object]) -> LeafResult:
    if isinstance(want, Unrecorded):
        return LeafResult(path, True, "unrecorded", message=f"not recorded ({want.type_name}); NOT compared",
                          compared=False)
    if not isinstance(want, torch.Tensor):
        if isinstance(got, torch.Tensor):
            return LeafResult(path, False, "value", message=f"expected {type(want).__name__}, got a tensor")
        try:
            same = bool(want == got) or (isinstance(want, float) and isinstance(got, float)
                                         and math.isnan(want) and math.isnan(got))
        except Exception as error:  # an == that is no truth value (element-wise, a codec's array): one leaf, not the report
            return LeafResult(path, True, "value", compared=False, message=f"{type(want).__name__} values have no "
                              f"true == ({type(error).__name__}: {error}); NOT compared")
        return LeafResult(path, same, "value", message="" if same else f"expected {want!r}, got {got!r}")
    if not isinstance(got, torch.Tensor):
        return LeafResult(path, False, "tensor", message=f"expected a tensor, got {type(got).__name__}")
    result = LeafResult(path, True, "tensor", dtype=str(want.dtype).removeprefix("torch."),
                        shape=list(want.shape), numel=want.numel())
    if want.shape != got.shape:
        result.passed = False
        result.message = f"shape {list(got.shape)} != recorded {list(want.shape)}"
        return result
    got = got.detach().to("cpu")
    want = want.detach().to("cpu")
    exact = rule.exact and want.dtype == got.dtype
    result.rule = "exact" if exact else "tolerance"
    if want.numel() == 0:
        return result
    if want.dtype.is_floating_point or want.dtype.is_complex:
        _compare_floating(result, want, got, exact, rule, oracle)
    else:
        equal = want == got.to(want.dtype)
        result.rule = "exact"
        result.mismatched = int((~equal).sum())
        if result.mismatched:
            diff = (want.to(torch.float64) - got.to(torch.float64)).abs()
            result.max_abs_error = float(diff.max())
    if result.mismatched or (result.rule == "oracle" and not result.passed):
        result.passed = False
        result.message = _mismatch_message(result)
    return result


def _compare_floating(result: LeafResult, want: torch.Tensor, got: torch.Tensor, exact: bool, rule: _Rule,
                      oracle: tuple[object, Any]) -> None:  # Any: the reference leaf, a tensor where the output's is
    """Errors of a floating leaf (absolute, relative, in ULPs) and its verdict by the first rule that applies."""
    w = want.to(torch.complex128 if want.dtype.is_complex else torch.float64)
    g = got.to(w.dtype)
    diff = (g - w).abs()
    both_nan = torch.isnan(w) & torch.isnan(g)
    diff = torch.where(both_nan, torch.zeros_like(diff), diff)
    if diff.dtype.is_complex:
        diff = diff.real
    rel = diff / w.abs().clamp_min(torch.finfo(torch.float64).tiny)
    if rel.dtype.is_complex:
        rel = rel.real
    result.max_abs_error = float(diff.max())
    result.max_rel_error = float(torch.where(diff == 0, torch.zeros_like(rel), rel).max())
    # a run in lower precision than recorded is judged by (and in ULPs of) the lower precision
    judged = got.dtype if got.dtype != want.dtype and _lower(got.dtype, want.dtype) else want.dtype
    nan_mismatch = torch.isnan(w) ^ torch.isnan(g)
    differ = (diff != 0) | nan_mismatch
    result.max_ulps = float(_ulps(got[differ], want[differ], judged).max()) if bool(differ.any()) else 0.0
    result.ulps_dtype = dtype_name(judged)
    if exact:
        equal = _bitwise_equal(want, got) | both_nan
        result.mismatched = int((~equal).sum())
        return
    oracle_value, reference = oracle
    if isinstance(oracle_value, torch.Tensor):
        reason = _usable_oracle(oracle_value, want)
        if reason is None and oracle_factor(judged, rule.oracle_factor) is not None:
            verdict = judge(got, want if reference is None else reference, oracle_value, dtype=judged,
                            factor=rule.oracle_factor)
            result.rule, result.oracle = "oracle", {**verdict.to_dict(), "summary": verdict.describe()}
            result.passed, result.mismatched = verdict.passed, verdict.beyond
            return
        oracle_value = reason or f"the oracle rule does not judge {dtype_name(judged)} outputs"
    if isinstance(oracle_value, str):
        result.oracle = {"available": False, "reason": oracle_value}
    limit = ulp_limit(rule.ulps, judged)
    if limit is not None:
        result.rule, result.ulps = "ulps", limit
        errors = _ulps(got, want, judged) if bool(differ.any()) else torch.zeros(1, dtype=torch.float64)
        result.mismatched = int((errors > limit).sum())
        return
    default_rtol, default_atol = tolerance_for(judged, rule.cross_device)
    if got.dtype != want.dtype:  # another precision: its rounding errors scale with the magnitude
        default_atol = max(default_atol, default_rtol * float(w.abs().max()))
    result.rtol = default_rtol if rule.rtol is None else rule.rtol
    result.atol = default_atol if rule.atol is None else rule.atol
    bad = diff > (result.atol + result.rtol * w.abs())
    result.mismatched = int((bad | nan_mismatch).sum())


def _ulps(got: torch.Tensor, want: torch.Tensor, judged: torch.dtype) -> torch.Tensor:
    """Elementwise errors in ULPs: in one dtype, how many values lie between (``ulp_distance``: two
    steps up are 2 ULPs, across a power of two too); a run in another dtype than the recording, its
    error in ULPs of the narrower dtype at the recorded value (``ulp_error``)."""
    if got.dtype == want.dtype:
        return ulp_distance(got, want)
    return ulp_error(got, want, judged)


def _usable_oracle(value: torch.Tensor, like: torch.Tensor) -> str | None:
    """Why ``value`` cannot be the oracle of the recorded leaf ``like`` (``None``: it can)."""
    if value.shape != like.shape:
        return f"the float64 run returned shape {list(value.shape)}, not {list(like.shape)}"
    if value.dtype not in (torch.float64, torch.complex128):
        return f"the module returns {dtype_name(value.dtype)} when run in float64 (it casts, or runs its own kernel)"
    return None


def _mismatch_message(result: LeafResult) -> str:
    dtype = result.ulps_dtype or result.dtype or ""
    ulps = "" if result.max_ulps is None else f", max {result.max_ulps:.3g} ULPs of {dtype}"
    if result.rule == "oracle" and result.oracle is not None:
        verdict = result.oracle
        return (f"not within the oracle rule: {verdict.get('summary', '')} (max abs error {result.max_abs_error:.3g} "
                f"against the reference{ulps})")
    if result.rule == "ulps":
        return (f"{result.mismatched}/{result.numel} elements differ by more than {result.ulps:g} ULPs of {dtype}"
                f"{ulps.replace(f' of {dtype}', '')}, max abs error {result.max_abs_error:.3g}")
    mode = "bit-exact" if result.rule == "exact" else f"rtol={result.rtol:g}, atol={result.atol:g}"
    text = (f"{result.mismatched}/{result.numel} elements differ ({mode}); "
            f"max abs error {result.max_abs_error:.3g}, max rel error {result.max_rel_error:.3g}{ulps}")
    if result.oracle is not None and not result.oracle.get("available", True):
        text += f" (no float64 oracle: {result.oracle['reason']})"
    return text


def _compare_synthetic(path: str, want: object, got: object) -> LeafResult:
    if isinstance(want, torch.Tensor):
        want = ShapeOnly(want.dtype, tuple(want.shape), tensor_stats(want))
    if isinstance(want, ShapeOnly):  # its statistics are of other inputs' outputs: not checked
        result = _compare_shape_only(path, want, got, check_statistics=False)
        result.message = result.message.replace("stored shape-only", "computed from synthetic inputs")
        return result
    return LeafResult(path, True, "synthetic", compared=False,
                      message="computed from synthetic inputs: NOT compared")


def _compare_shape_only(path: str, want: ShapeOnly, got: object, rtol: float | None = None, atol: float | None = None,
                        cross_device: bool = False, check_statistics: bool = True) -> LeafResult:
    """A shape-only recording has no values: check the shape and the recorded statistics, and say
    plainly that the values were not compared (``compared=False``: it can fail, never pass as checked)."""
    result = LeafResult(path, True, "shape-only", dtype=str(want.dtype).removeprefix("torch."),
                        shape=list(want.shape), compared=False)
    if not isinstance(got, torch.Tensor):
        result.passed = False
        result.message = f"expected a tensor ({want.describe()}), got {type(got).__name__}"
        return result
    result.numel = got.numel()
    if list(got.shape) != list(want.shape):
        result.passed = False
        result.message = f"shape {list(got.shape)} != recorded {list(want.shape)}"
        return result
    dtype_note = "" if got.dtype == want.dtype else f" (replayed as {str(got.dtype).removeprefix('torch.')})"
    if not check_statistics:
        result.message = f"stored shape-only: shape matches{dtype_note}, values NOT compared{_side_by_side(want, got)}"
        return result
    judged = got.dtype if got.dtype != want.dtype and _lower(got.dtype, want.dtype) else want.dtype
    default_rtol, default_atol = tolerance_for(judged, cross_device)
    result.rtol = default_rtol if rtol is None else rtol
    result.atol = default_atol if atol is None else atol
    contradiction = statistics_contradiction(want, got, result.rtol, result.atol)
    if contradiction:
        result.passed = False
        result.message = f"stored shape-only, and the values contradict its recorded statistics: {contradiction}"
        return result
    checked = "shape, dtype and recorded statistics match" if not dtype_note else f"shape and recorded statistics match{dtype_note}"
    result.message = f"stored shape-only: {checked}; values NOT compared (none were recorded)"
    return result


_STAT_KEYS = ("mean", "std", "min", "max")


def _side_by_side(want: ShapeOnly, got: torch.Tensor) -> str:
    """``; recorded mean .. std .., replayed mean .. std ..`` (what a synthetic replay can show)."""
    mean, std = _number(want.stats.get("mean")), _number(want.stats.get("std"))
    if mean is None or std is None or not got.numel() or got.dtype.is_complex:
        return ""
    values = got.detach().to("cpu", torch.float64)
    return (f"; recorded mean {mean:.4g} std {std:.4g}, "
            f"replayed mean {float(values.mean()):.4g} std {float(values.std(unbiased=False)):.4g}")


def statistics_contradiction(want: ShapeOnly, got: torch.Tensor, rtol: float, atol: float) -> str | None:
    """Why ``got`` cannot be the tensor whose statistics ``want`` recorded, or ``None`` when nothing
    contradicts it (which does not mean its values match: two different tensors can share them).

    The bound is sound for any tensor within tolerance of the recorded one: if every element obeys
    ``|g - e| <= atol + rtol * |e|``, then mean, min, max and standard deviation each move by at most
    ``B = atol + rtol * max|e|`` (each is 1-Lipschitz in the largest elementwise difference; for the
    standard deviation, ``|std(g) - std(e)| <= rms(g - e)``). ``max|e|`` comes from the recorded
    min and max. A statistic further than ``B`` (plus float64 rounding of sums over many elements)
    from its recorded value, a different count of non-finite elements, or a different fraction of
    ``True`` is a contradiction: the candidate is outside tolerance somewhere.

    Example::

        statistics_contradiction(ShapeOnly(torch.float32, (2, 512), stats), torch.zeros(2, 512), 1.3e-6, 1e-5)
        # 'mean 0 vs recorded -0.0031, std 0 vs recorded 0.711 (bound 2.97e-05)'
    """
    recorded = want.stats
    if not isinstance(recorded, dict) or not recorded or got.numel() == 0 or got.dtype.is_complex != want.dtype.is_complex:
        return None
    replayed = tensor_stats(got.detach(), quantiles=False)
    if "fraction_true" in recorded:
        same = _number(recorded["fraction_true"]) == replayed.get("fraction_true")
        return None if same else f"fraction true {replayed.get('fraction_true')} vs recorded {recorded['fraction_true']}"
    if _number(recorded.get("nonfinite", 0)) != replayed.get("nonfinite", 0):
        return f"{replayed.get('nonfinite', 0)} non-finite values vs recorded {recorded.get('nonfinite', 0)}"
    values = {key: _number(recorded.get(key)) for key in _STAT_KEYS}
    if any(value is None for value in values.values()):
        return None  # no finite value was recorded (or the statistics are incomplete): nothing to check
    magnitude = max(abs(values["min"] or 0.0), abs(values["max"] or 0.0))
    bound = atol + rtol * magnitude + 1e-6 * magnitude  # + float64 rounding of sums over many elements
    off = [f"{key} {replayed[key]:.4g} vs recorded {values[key]:.4g}" for key in _STAT_KEYS
           if key not in replayed or abs(replayed[key] - (values[key] or 0.0)) > bound]
    return f"{', '.join(off)} (bound {bound:.3g})" if off else None


def nothing_to_compare(want: object) -> str | None:
    """Why a recorded output holds nothing a candidate could get wrong by its values, or ``None``.

    Every leaf may have been compared and matched, yet prove nothing: ``None`` matches ``None``,
    an empty tensor matches any empty tensor, and NaN matches NaN (an output with no finite value
    is matched by any candidate that returns NaN). At least one leaf must hold a finite value or a
    non-``None`` plain value for a verdict to be PASS."""
    leaves, _ = flatten_with_paths(expand_dataclasses(want))
    kinds = set()
    for _, leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if leaf.numel() == 0:
                kinds.add("empty")
            elif leaf.is_floating_point() or leaf.is_complex():
                # torch has no isfinite for float8: widen one-byte floats first (exact for every value)
                values = leaf.detach().float() if leaf.element_size() == 1 else leaf.detach()
                if bool(torch.isfinite(values).any()):
                    return None
                kinds.add("non-finite")
            else:
                return None
        elif leaf is None or isinstance(leaf, (Unrecorded, ShapeOnly)):
            kinds.add("none")
        else:
            return None
    if not leaves or kinds == {"none"}:
        return "the recorded output is None: nothing to compare"
    if "non-finite" in kinds:
        return "every recorded output value is NaN or infinite: any candidate that returns them matches"
    return "the recorded output is empty (no elements): nothing to compare"


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _lower(a: torch.dtype, b: torch.dtype) -> bool:
    return torch.finfo(a).eps > torch.finfo(b).eps if a.is_floating_point and b.is_floating_point else False


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype.itemsize == 1:
        return a.contiguous().view(torch.uint8) == b.contiguous().view(torch.uint8)
    int_type = {2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}[a.dtype.itemsize]
    av = a.contiguous().view(int_type)
    bv = b.contiguous().view(int_type)
    if a.dtype.itemsize == 16:  # complex128: two int64 per element
        return (av == bv).reshape(*a.shape, 2).all(-1) if a.dim() else (av == bv).all()
    return av == bv
