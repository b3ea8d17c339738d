"""Leaf-by-leaf comparison of outputs: bit-exact, or within per-dtype tolerances."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from modulelens.format.shape_only import ShapeOnly, tensor_stats
from modulelens.format.tree import expand_dataclasses, flatten_with_paths
from modulelens.format.values import Unrecorded

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
                    purpose: str = "kernel") -> dict[str, dict[str, Any]]:
    """``{dtype name: {"rtol", "atol", "exact"}}`` for output dtypes, from :func:`default_tolerance`;
    ``rtol``/``atol`` override it for every floating dtype (exact dtypes stay exact).

    Example::

        tolerance_table(["float32", "int64"])
        # {"float32": {"rtol": 0.0001, "atol": 0.0001, "exact": False}, "int64": {"rtol": 0.0, "atol": 0.0, "exact": True}}
    """
    table = {}
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

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("max_abs_error", "max_rel_error"):
            if not math.isfinite(data[key]):
                data[key] = str(data[key])
        return data


def compare(
    expected: Any,
    actual: Any,
    *,
    exact: bool,
    rtol: float | None = None,
    atol: float | None = None,
    cross_device: bool = False,
    synthetic: bool = False,
    root: str = "output",
) -> list[LeafResult]:
    """Compare two output trees. ``exact`` demands identical bits; otherwise ``rtol``/``atol``
    (default: per dtype) bound ``|a - e| <= atol + rtol * |e|`` elementwise, NaN matching NaN.
    When the replay ran in another dtype than the recording, the default ``atol`` grows to
    ``rtol * max|e|``: rounding errors of the lower precision scale with the values' magnitude.
    ``synthetic=True`` (the replay ran on synthetic inputs) checks shapes only: no leaf counts as
    compared. ``root`` names the compared tree in leaf paths and messages."""
    expected_leaves, expected_spec = flatten_with_paths(expand_dataclasses(expected))
    actual_leaves, actual_spec = flatten_with_paths(expand_dataclasses(actual))
    if expected_spec != actual_spec:
        return [LeafResult(
            path=f"<{root}>", passed=False, kind="structure",
            message=f"{root} structure differs: expected {_describe(expected_spec)}, got {_describe(actual_spec)}",
        )]
    results = []
    for (key, want), (_, got) in zip(expected_leaves, actual_leaves, strict=False):
        path = root + key
        if synthetic:
            results.append(_compare_synthetic(path, want, got))
        elif isinstance(want, ShapeOnly):
            results.append(_compare_shape_only(path, want, got, rtol, atol, cross_device))
        else:
            results.append(_compare_leaf(path, want, got, exact, rtol, atol, cross_device))
    return results


def _describe(spec: pytree.TreeSpec) -> str:
    text = str(spec)
    return text if len(text) < 120 else text[:117] + "..."


def _compare_leaf(
    path: str, want: Any, got: Any, exact: bool, rtol: float | None, atol: float | None, cross_device: bool
) -> LeafResult:
    if isinstance(want, Unrecorded):
        return LeafResult(path, True, "unrecorded", message=f"not recorded ({want.type_name}); NOT compared",
                          compared=False)
    if not isinstance(want, torch.Tensor):
        if isinstance(got, torch.Tensor):
            return LeafResult(path, False, "value", message=f"expected {type(want).__name__}, got a tensor")
        same = want == got or (isinstance(want, float) and isinstance(got, float) and math.isnan(want) and math.isnan(got))
        return LeafResult(path, bool(same), "value", message="" if same else f"expected {want!r}, got {got!r}")
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
    if exact and want.dtype != got.dtype:
        exact = False
    if want.numel() == 0:
        return result
    if want.dtype.is_floating_point or want.dtype.is_complex:
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
        if exact:
            equal = _bitwise_equal(want, got) | both_nan
            result.mismatched = int((~equal).sum())
        else:
            # a run in lower precision than recorded is judged by the lower precision's tolerance
            judged = got.dtype if got.dtype != want.dtype and _lower(got.dtype, want.dtype) else want.dtype
            default_rtol, default_atol = tolerance_for(judged, cross_device)
            if got.dtype != want.dtype:  # another precision: its rounding errors scale with the magnitude
                default_atol = max(default_atol, default_rtol * float(w.abs().max()))
            result.rtol = default_rtol if rtol is None else rtol
            result.atol = default_atol if atol is None else atol
            bad = diff > (result.atol + result.rtol * w.abs())
            bad = bad | (torch.isnan(w) ^ torch.isnan(g))
            result.mismatched = int(bad.sum())
    else:
        equal = want == got.to(want.dtype)
        result.mismatched = int((~equal).sum())
        if result.mismatched:
            diff = (want.to(torch.float64) - got.to(torch.float64)).abs()
            result.max_abs_error = float(diff.max())
    if result.mismatched:
        result.passed = False
        mode = "bit-exact" if exact else f"rtol={result.rtol:g}, atol={result.atol:g}"
        result.message = (f"{result.mismatched}/{result.numel} elements differ ({mode}); "
                          f"max abs error {result.max_abs_error:.3g}, max rel error {result.max_rel_error:.3g}")
    return result


def _compare_synthetic(path: str, want: Any, got: Any) -> LeafResult:
    if isinstance(want, torch.Tensor):
        want = ShapeOnly(want.dtype, tuple(want.shape), tensor_stats(want))
    if isinstance(want, ShapeOnly):  # its statistics are of other inputs' outputs: not checked
        result = _compare_shape_only(path, want, got, check_statistics=False)
        result.message = result.message.replace("stored shape-only", "computed from synthetic inputs")
        return result
    return LeafResult(path, True, "synthetic", compared=False,
                      message="computed from synthetic inputs: NOT compared")


def _compare_shape_only(path: str, want: ShapeOnly, got: Any, rtol: float | None = None, atol: float | None = None,
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


def _number(value: Any) -> float | None:
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
