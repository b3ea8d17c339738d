"""Verdicts against a float64 oracle: tolerances derived from the data (docs/tools.md, "Verdicts in ULPs").

A fixed tolerance is wrong both ways. One bfloat16 ULP on ``[16, 32)`` is 0.125 and one float16 ULP
is about ``1e-3`` relative, so ``assert_close``'s float16 ``rtol=1e-3`` fails a correct rewrite that
rounds once where the original rounded every intermediate; while ``rtol=1e-2`` passes a bfloat16
output biased by one ULP everywhere, and ``atol=1e-2`` passes all zeros wherever the outputs are
small (KernelBench). The oracle rule compares *errors* instead of values:

* **the oracle**: the module run again in float64 on the same inputs (a float64 copy of it, inputs
  cast to float64, autocast off; :class:`Float64Oracle`);
* **the reference's own error**: the reference's output (the recorded one, or the reference module
  run here) against the oracle; **the candidate's error**: its output against the oracle;
* the candidate passes when its error is within ``k`` times the reference's (:func:`judge`), with
  ``k`` per dtype (:data:`ORACLE_FACTORS`: 4 for float32 and complex64, 3 for float16, bfloat16 and
  the float8 formats, as ``torch._dynamo.utils.same`` uses 2 and 3 against its float64 reference,
  with room for float32 kernels' fast ``exp`` and reordered sums).

Three measures, each against ``k`` times the reference's (or, when the reference is closer to the
oracle than correct rounding, against what correct rounding leaves: an RMS of ``ulp / sqrt(12)`` and
a worst element of ``ulp / 2``):

1. the RMS error (a candidate that is noisier everywhere);
2. the worst element (a candidate wrong in a few places: a mask off by one, an edge tile);
3. for dtypes of 10 mantissa bits or fewer (float16, bfloat16, float8), the median error in each
   element's own ULPs, upwards and away from zero (a candidate **biased** by one ULP everywhere is
   as far from the oracle in RMS as a deep bfloat16 reference that rounds every intermediate, but
   its median error is a whole ULP where the reference's is near zero; "away from zero" sees a bias
   of every magnitude, which leaves a symmetric output's signed median at zero). Not for float32:
   there a systematic ULP or two (a fast ``exp``) is harmless and below what any fixed tolerance
   can see.

Errors are absolute, so an output whose elements cancel near zero (a matmul's) does not blow up;
they are reported in ULPs of the dtype at the output's RMS magnitude. Small outputs get a
small-sample allowance: the limits are multiplied by ``exp(3.1 / sqrt(n))`` (1.1 for 1000 elements,
1.6 for 48, 22 for one), the spread of the ratio of two equally accurate results' RMS errors over
``n`` elements at about one in a thousand. NaN and infinities: where the reference is not finite the
candidate must be the same special value; a NaN or infinity where the reference has a number fails.

No oracle (the caller falls back to ULP or fixed tolerances, and says why): a float64 output (the
reference is already float64: there is nothing more exact to run), a module that draws random
numbers (dropout in training mode: a float64 run draws other numbers), a module that cannot run in
float64 or returns another dtype when it does (custom kernels, explicit casts), and integer or bool
outputs (compared exactly).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from modulelens.format.op_watch import OpCounter
from modulelens.format.tensors import dtype_name
from modulelens.restore.ulp import MANTISSA_BITS, ulp

# k: how many times the reference's own error against the oracle a candidate may have, by output dtype
ORACLE_FACTORS: dict[torch.dtype, float] = {
    torch.float32: 4.0, torch.complex64: 4.0, torch.float16: 3.0, torch.bfloat16: 3.0,
    **{getattr(torch, name): 3.0 for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
       if hasattr(torch, name)},
}
# The small-sample allowance exp(Z / sqrt(n)): log F(n, n) has a standard deviation of about 2 / sqrt(n),
# so two equally accurate results' RMS errors are within this factor of each other but about once in 1000.
SMALL_SAMPLE_Z = 3.1
BIAS_MANTISSA_BITS = 10  # the median-bias test: float16 and narrower, where the final rounding dominates
BIAS_MIN_ELEMENTS = 16  # fewer elements have no usable median
# The bias a candidate may always have, in ULPs: rounding toward zero (`__float2bfloat16_rz`, and the
# Triton interpreter's float32 -> bfloat16 conversion, which truncates) leaves a median error of half
# an ULP toward zero, and is accepted; a whole ULP in one direction is not.
BIAS_FLOOR_ULPS = 0.75
_COMPONENTS = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def oracle_factor(dtype: torch.dtype, factor: float | None = None) -> float | None:
    """``k`` for outputs of ``dtype`` (``factor`` overrides the default), or ``None`` when the oracle
    rule does not apply to it (float64 and complex128: the reference is the oracle; integers, bool).

    Example::

        oracle_factor(torch.bfloat16)        # 3.0
        oracle_factor(torch.float64)         # None
    """
    if dtype not in ORACLE_FACTORS:
        return None
    return ORACLE_FACTORS[dtype] if factor is None else float(factor)


def low_precision(dtypes: Iterable[torch.dtype]) -> bool:
    """Whether any of ``dtypes`` is a floating dtype of 10 mantissa bits or fewer (float16, bfloat16,
    float8): where fixed tolerances fail correct rewrites, so ``verify`` judges by the oracle unasked."""
    return any(MANTISSA_BITS.get(_COMPONENTS.get(dtype, dtype), 99) <= BIAS_MANTISSA_BITS for dtype in dtypes)


def small_sample_allowance(count: int) -> float:
    """How much further apart two equally accurate results' errors may be over ``count`` elements."""
    return math.exp(SMALL_SAMPLE_Z / math.sqrt(max(count, 1)))


@dataclass
class OracleVerdict:
    """How a candidate's error against the float64 oracle compares with the reference's (:func:`judge`).

    Errors are in ULPs of ``dtype`` at the output's RMS magnitude (``bias`` in each element's own ULPs)."""

    passed: bool
    dtype: str
    factor: float  # k
    allowance: float  # the small-sample allowance applied on top of k
    numel: int  # elements judged (finite in the oracle, the reference and the candidate)
    error_rms: float = 0.0
    reference_rms: float = 0.0  # the reference's own, at least what correct rounding leaves
    allowed_rms: float = 0.0
    error_max: float = 0.0
    reference_max: float = 0.0
    allowed_max: float = 0.0
    bias: float | None = None  # median error, upwards or away from zero (float16 and narrower)
    reference_bias: float | None = None
    allowed_bias: float | None = None
    bias_direction: str | None = None  # "up" or "away from zero": the direction of the larger bias
    specials: int = 0  # elements NaN or infinite where the reference is not the same
    beyond: int = 0  # elements beyond the worst-element limit, plus ``specials``
    failed: list[str] = field(default_factory=list)  # "rms", "max", "bias", "specials"

    def to_dict(self) -> dict[str, object]:
        return {key: (value if not isinstance(value, float) or math.isfinite(value) else str(value))
                for key, value in asdict(self).items()}

    def describe(self) -> str:
        """One line: the verdict and its numbers."""
        k = f"{self.factor:g}x"
        if self.passed:
            text = (f"within {k} the reference's error against the float64 oracle (error {self.error_rms:.3g} "
                    f"ULPs rms, the reference's {self.reference_rms:.3g}; worst {self.error_max:.3g}, the reference's "
                    f"{self.reference_max:.3g})")
            return text + (f"; median error {self.bias:+.2g} ULPs" if self.bias is not None else "")
        parts = []
        if "specials" in self.failed:
            parts.append(f"{self.specials} element(s) NaN or infinite where the reference is not the same")
        if "rms" in self.failed:
            parts.append(f"error {self.error_rms:.3g} ULPs rms against the float64 oracle, over {k} the reference's "
                         f"own {self.reference_rms:.3g} (allowed {self.allowed_rms:.3g} over {self.numel} elements)")
        if "max" in self.failed:
            parts.append(f"worst element {self.error_max:.3g} ULPs off the oracle, over {k} the reference's worst "
                         f"{self.reference_max:.3g} (allowed {self.allowed_max:.3g}; {self.beyond} element(s) beyond)")
        if "bias" in self.failed:
            parts.append(f"biased {self.bias_direction}: median error {self.bias:+.3g} ULPs, the reference's "
                         f"{self.reference_bias:+.3g} (allowed +-{self.allowed_bias:.3g})")
        return "; ".join(parts)


def judge(actual: torch.Tensor, reference: torch.Tensor, oracle: torch.Tensor, *, dtype: torch.dtype | None = None,
          factor: float | None = None) -> OracleVerdict:
    """Judge ``actual`` by its error against ``oracle``, allowing ``k`` times ``reference``'s own.

    Args:
        actual: the candidate's output.
        reference: the reference's output (the recorded one, or the reference module's run).
        oracle: the same output computed in float64 (:class:`Float64Oracle`).
        dtype: whose ULPs and ``k`` (default: the narrower of ``actual``'s and ``reference``'s dtypes).
        factor: ``k`` (default :data:`ORACLE_FACTORS`).

    Returns:
        An :class:`OracleVerdict`.

    Raises:
        ValueError: the shapes differ, or ``dtype`` has no oracle rule (:func:`oracle_factor`).

    Example::

        verdict = judge(kernel_out_bf16, reference_out_bf16, float64_out)
        assert verdict.passed, verdict.describe()
    """
    if not actual.shape == reference.shape == oracle.shape:
        raise ValueError(f"judge: shapes {list(actual.shape)}, {list(reference.shape)}, {list(oracle.shape)} differ")
    dtype = dtype or _narrower(actual.dtype, reference.dtype)
    k = oracle_factor(dtype, factor)
    if k is None:
        raise ValueError(f"the oracle rule does not judge {dtype} outputs (see oracle_factor)")
    real = _COMPONENTS.get(dtype, dtype)
    a, r, o = (_as_real(t) for t in (actual, reference, oracle))
    reference_finite = torch.isfinite(r)
    same_special = (torch.isnan(a) & torch.isnan(r)) | (a == r)
    bad = (~reference_finite & ~same_special) | (reference_finite & ~torch.isfinite(a))
    use = reference_finite & torch.isfinite(a) & torch.isfinite(o)
    count = int(use.sum())
    verdict = OracleVerdict(passed=True, dtype=dtype_name(dtype), factor=k, allowance=small_sample_allowance(count),
                            numel=count, specials=int(bad.sum()))
    if verdict.specials:
        verdict.failed.append("specials")
    if count:
        _measure(verdict, a[use], r[use], o[use], real)
    verdict.beyond += verdict.specials
    verdict.passed = not verdict.failed
    return verdict


def _measure(verdict: OracleVerdict, a: torch.Tensor, r: torch.Tensor, o: torch.Tensor, real: torch.dtype) -> None:
    """The RMS, worst-element and bias tests on the finite elements (float64 vectors)."""
    spacing = ulp(o, real)
    candidate_error, reference_error = a - o, r - o
    scale = float(ulp(o.pow(2).mean().sqrt().reshape(1), real)[0])  # one ULP at the output's RMS magnitude
    limit = verdict.factor * verdict.allowance
    error_rms, reference_rms = _rms(candidate_error), max(_rms(reference_error), _rms(spacing) / math.sqrt(12))
    error_max = float(candidate_error.abs().max())
    reference_max = max(float(reference_error.abs().max()), float(spacing.max()) / 2)
    verdict.error_rms, verdict.reference_rms, verdict.allowed_rms = (
        error_rms / scale, reference_rms / scale, limit * reference_rms / scale)
    verdict.error_max, verdict.reference_max, verdict.allowed_max = (
        error_max / scale, reference_max / scale, limit * reference_max / scale)
    verdict.beyond = int((candidate_error.abs() > limit * reference_max).sum())
    if error_rms > limit * reference_rms:
        verdict.failed.append("rms")
    if error_max > limit * reference_max:
        verdict.failed.append("max")
    if MANTISSA_BITS[real] <= BIAS_MANTISSA_BITS and verdict.numel >= BIAS_MIN_ELEMENTS:
        # two directions of bias: up (every element one ULP higher) and away from zero (every
        # magnitude one ULP larger, which leaves a symmetric output's signed median at zero)
        sign = torch.where(o < 0, -1.0, 1.0).to(torch.float64)
        for name, direction in (("up", torch.ones_like(sign)), ("away from zero", sign)):
            limit_bias, bias, reference_bias = _bias(candidate_error * direction / spacing,
                                                     reference_error * direction / spacing, verdict.factor)
            if verdict.bias is None or abs(bias) - limit_bias > abs(verdict.bias) - (verdict.allowed_bias or 0.0):
                verdict.bias, verdict.reference_bias, verdict.allowed_bias = bias, reference_bias, limit_bias
                verdict.bias_direction = name
        if abs(verdict.bias or 0.0) > (verdict.allowed_bias or 0.0):
            verdict.failed.append("bias")


def _bias(candidate: torch.Tensor, reference: torch.Tensor, factor: float) -> tuple[float, float, float]:
    """The allowed bias, the candidate's and the reference's: medians of errors in ULPs."""
    bias, reference_bias = float(candidate.median()), float(reference.median())
    spread = 1.4826 * float((candidate - bias).abs().median())  # a robust standard deviation (MAD)
    # the median of n values spreads by 1.2533 sigma / sqrt(n): the same z as the small-sample allowance
    allowed = max(factor * abs(reference_bias), BIAS_FLOOR_ULPS) + SMALL_SAMPLE_Z * 1.2533 * spread / math.sqrt(candidate.numel())
    return allowed, bias, reference_bias


def _rms(values: torch.Tensor) -> float:
    return float(values.pow(2).mean().sqrt())


def _as_real(values: torch.Tensor) -> torch.Tensor:
    """A flat float64 vector (complex: real and imaginary parts side by side)."""
    values = values.detach().to("cpu")
    if values.dtype.is_complex:
        return torch.view_as_real(values.to(torch.complex128)).reshape(-1)
    return values.to(torch.float64).reshape(-1)


def _narrower(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    bits = {dtype: MANTISSA_BITS.get(_COMPONENTS.get(dtype, dtype), 99) for dtype in (a, b)}
    return a if bits[a] <= bits[b] else b


@dataclass
class OracleRun:
    """The float64 outputs of one call (``outputs``), or ``None`` and why there are none (``reason``);
    ``reference``: the reference outputs the oracle rule measures, when they are not the expected
    outputs :func:`modulelens.restore.compare.compare` is given (``None``: those)."""

    outputs: Any = None
    reason: str | None = None
    reference: Any = None


class Float64Oracle:
    """A float64 copy of a module, run on a call's inputs to give the oracle of its outputs.

    The copy is made once (``copy.deepcopy`` then ``.to(torch.float64)``: float64 parameters and
    buffers, twice the memory of a float32 module); a module that cannot be copied or cast has no
    oracle, and :meth:`run` says why.

    Example::

        oracle = Float64Oracle(module)
        run = oracle.run(args, kwargs, context=lambda: call_context(call, device))
        run.outputs      # the float64 outputs, or None with run.reason
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.module: torch.nn.Module | None = None
        self.error: str | None = None
        try:
            self.module = copy.deepcopy(module).to(torch.float64)
        except Exception as error:  # the verdict falls back to tolerances; the reason is reported
            self.error = f"the module cannot be copied in float64 ({type(error).__name__}: {error})"

    def run(self, args: Sequence[object], kwargs: Mapping[str, object], *,
            context: Callable[[], contextlib.AbstractContextManager[object]] | None = None,
            training: bool = False) -> OracleRun:
        """The oracle of one call: floating inputs cast to float64 (complex to complex128), autocast
        off, no gradients, under ``context()`` (the call's recorded RNG state) when given."""
        if self.module is None:
            return OracleRun(reason=self.error)
        module = self.module
        module.train(training)
        args, kwargs = pytree.tree_map(_widen, (args, kwargs))
        try:
            with context() if context is not None else contextlib.nullcontext(), _no_autocast(), \
                    torch.no_grad(), OpCounter() as ops:
                outputs = module(*args, **kwargs)
        except Exception as error:
            return OracleRun(reason=f"the module cannot run in float64 ({type(error).__name__}: {str(error)[:200]})")
        random = ops.random_ops()
        if random:
            return OracleRun(reason=f"the module draws random numbers ({', '.join(random)}): a float64 run draws others")
        return OracleRun(outputs=outputs)


def _widen(value: object) -> object:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(torch.float64)
    if isinstance(value, torch.Tensor) and value.is_complex():
        return value.detach().to(torch.complex128)
    return value


@contextlib.contextmanager
def _no_autocast() -> Iterator[None]:
    """Autocast off on every device type (a recorded autocast region would run the oracle in bf16)."""
    with contextlib.ExitStack() as stack:
        for device_type in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
            stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


__all__ = ["ORACLE_FACTORS", "Float64Oracle", "OracleRun", "OracleVerdict", "judge", "low_precision", "oracle_factor"]
