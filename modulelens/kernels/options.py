"""The option groups of :func:`modulelens.kernels.verify_kernel` (timing is a :class:`TimingConfig`).

Like httpx's ``Timeout`` and ``Limits``: each group is frozen and checked when it is built; the CLI
and the MCP server build them from their flags, so every surface validates the same way (a test
pins the CLI's defaults to these). This module imports torch (through ``problems``), so the CLI
repeats the defaults as literals rather than importing them at ``--help`` time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from modulelens.errors import UsageError
from modulelens.kernels.problems import MAX_CALLS
from modulelens.restore.compare import UlpTolerance, check_ulps
from modulelens.tools.timing import TimingConfig

DEFAULT_TIMEOUT = 300.0
REFERENCE_MIN_TIMEOUT = 120.0
RANDOM_SAMPLES = 5
# CUDA-event timing of kernel verify: a fixed trial count, the same for reference and candidate
KERNEL_TIMING = TimingConfig(warmup=10, iters=100)


@dataclass(frozen=True)
class KernelChecks:
    """Which inputs a kernel candidate runs on, and how closely its outputs must match.

    By default a floating output is judged against a float64 oracle of the reference (the oracle
    rule of docs/kernels.md, "Verdicts in ULPs"): its error within ``k`` times the reference's own
    (``k`` = ``oracle_factor``, default 4 for float32, 3 for 16- and 8-bit floats). Where there is no
    oracle (float64 outputs, a reference that draws random numbers or cannot run in float64), or when
    ``rtol``/``atol`` or ``ulps`` are given, fixed tolerances judge it instead.

    Args:
        calls: recorded call positions to use (default: all, up to ``max_calls``).
        max_calls: the most recorded calls used (>= 1).
        random_samples: seeded random inputs of the recorded shapes and dtypes, added to the
            recorded calls (>= 0).
        seed: seed of the random inputs and of ``ModelNew``'s construction.
        rtol: overrides the per-dtype relative tolerance of floating outputs (and turns the oracle off).
        atol: overrides the per-dtype absolute tolerance (and turns the oracle off).
        ulps: judge floating outputs within this many ULPs of the reference's, elementwise: one
            number, or ``{"bfloat16": 2, "float32": 64}`` (turns the oracle off).
        oracle: judge by the float64 oracle when no tolerance is given (``False``: KernelBench's
            fixed per-dtype tolerances).
        oracle_factor: ``k`` of the oracle rule for every dtype (> 0).

    Raises:
        UsageError: ``max_calls < 1``, ``random_samples < 0``, a negative tolerance, ``ulps`` with
            ``rtol``/``atol``, or ``oracle_factor <= 0``.

    Example::

        verify_kernel("ranker/top_mlp:v3", "kernel.py", checks=KernelChecks(max_calls=2, atol=1e-4))
        verify_kernel("ranker/top_mlp:v3", "kernel.py", checks=KernelChecks(ulps={"bfloat16": 2}))
    """

    calls: Sequence[int] | None = None
    max_calls: int = MAX_CALLS
    random_samples: int = RANDOM_SAMPLES
    seed: int = 0
    rtol: float | None = None
    atol: float | None = None
    ulps: UlpTolerance | None = None
    oracle: bool = True
    oracle_factor: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ulps", check_ulps(self.ulps))
        if self.ulps is not None and (self.rtol is not None or self.atol is not None):
            raise UsageError("give ULP tolerances or rtol/atol, not both")
        if self.oracle_factor is not None and not self.oracle_factor > 0:
            raise UsageError(f"oracle_factor must be > 0, got {self.oracle_factor}")
        if self.calls is not None:
            object.__setattr__(self, "calls", tuple(self.calls))  # frozen and hashable, whatever came in
        if self.max_calls < 1 or self.random_samples < 0:
            raise UsageError(f"kernel checks need max_calls >= 1 and random_samples >= 0, got max_calls="
                             f"{self.max_calls}, random_samples={self.random_samples}")
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise UsageError(f"{name} must be >= 0, got {value}")

    @property
    def uses_oracle(self) -> bool:
        """Whether floating outputs are judged by the float64 oracle (no tolerance given, oracle on)."""
        return self.oracle and self.rtol is None and self.atol is None and self.ulps is None


@dataclass(frozen=True)
class CandidatePolicy:
    """How long the worker processes may run, and which static-check findings are accepted.

    Args:
        timeout: seconds the candidate's process may run before it is killed (> 0).
        reference_timeout: seconds for the reference's process (default ``max(timeout, 120)``).
        allow: static-check rules downgraded to warnings (names from
            :data:`modulelens.kernels.static_check.RULES`).
        allow_torch_ops: accept a candidate whose forward runs heavy ops (matmul, convolution,
            attention) through PyTorch (a mixed candidate); by default that fails.

    Raises:
        UsageError: a timeout that is not positive.

    Example::

        verify_kernel("ranker/top_mlp:v3", "kernel.py", policy=CandidatePolicy(timeout=60, allow_torch_ops=True))
    """

    timeout: float = DEFAULT_TIMEOUT
    reference_timeout: float | None = None
    allow: Sequence[str] = ()
    allow_torch_ops: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "allow", tuple(self.allow))
        if self.timeout <= 0 or (self.reference_timeout is not None and self.reference_timeout <= 0):
            raise UsageError(f"timeouts must be > 0 seconds, got timeout={self.timeout}, "
                             f"reference_timeout={self.reference_timeout}")

    @property
    def reference_seconds(self) -> float:
        """The reference process's limit: ``reference_timeout``, else ``max(timeout, 120)``."""
        return self.reference_timeout or max(self.timeout, REFERENCE_MIN_TIMEOUT)
