"""The option groups of :class:`modulelens.capture`: which calls are recorded, how much is stored.

Like httpx's ``Timeout`` and ``Limits``: each group is frozen and checked when it is built, so a
bad value fails before the job runs; ``capture``, the tracer and the ``modulelens run`` bootstrap
(``RunConfig.recording()``) all take these objects, so the checks live in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from modulelens.errors import UsageError
from modulelens.tracing.distributed import RanksSpec, normalise_ranks


@dataclass(frozen=True)
class Recording:
    """Which calls of each target are recorded, on which ranks (see docs/fidelity.md, docs/distributed.md).

    Args:
        warmup: calls of each target skipped before recording starts (>= 0).
        max_calls: calls recorded per target (>= 1); then that target's hooks go away.
        backward: also record each recorded call's backward (output gradients in, input and
            parameter gradients out).
        ranks: in a distributed job, the ranks that record: ``0``, a list (``[0, 3]``), a
            comma-separated string (``"0,3"``) or ``"all"``.
        sync_timeout: seconds the ranks of a mesh wait for each other before sharded (DTensor)
            values are gathered; past it the capture stops incomplete and the job goes on.
        op_trace: also record each recorded call's op-level trace: every aten op it ran, in which
            submodule, from which source line, with an exact fingerprint and statistics of each
            output (docs/fidelity.md, "Op traces"). Replay and ``verify`` name the first op that
            differs from it. Only recorded calls pay for it (``benchmarks/bench_op_trace.py``).
        op_trace_values: bytes of op output values kept per recorded call, beyond fingerprints and
            statistics (the first outputs until the budget is spent; ``0``: none).
        settle_at_return: finish reading a recorded call's large weights (those written to the repo
            while the job runs) before the call returns, instead of before the next optimizer step or
            backward through the call. For jobs that change weights some other way between calls
            (``p.data.add_`` with no backward, as evolution strategies do), which otherwise lose such
            a weight, with a warning; each recorded call then waits for part of its write.

    Raises:
        UsageError: ``warmup < 0``, ``max_calls < 1``, ``sync_timeout <= 0``, malformed ``ranks``
            or ``op_trace_values < 0``.

    Example::

        with modulelens.capture(model, ["blocks.*.attn"], record=Recording(warmup=2, max_calls=3, backward=True)):
            train(model)
        with modulelens.capture(model, ["blocks.3"], record=Recording(op_trace=True)):
            model(batch)                         # cap.calls[0].op_trace lists every aten op of blocks.3
    """

    warmup: int = 0
    max_calls: int = 1
    backward: bool = False
    ranks: RanksSpec = (0,)
    sync_timeout: float = 60.0
    op_trace: bool = False
    op_trace_values: int = 16 << 20
    settle_at_return: bool = False

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.max_calls < 1:
            raise UsageError(f"warmup must be >= 0 and max_calls >= 1, got warmup={self.warmup}, "
                             f"max_calls={self.max_calls}")
        if not isinstance(self.op_trace_values, int) or isinstance(self.op_trace_values, bool) \
                or self.op_trace_values < 0:
            raise UsageError(f"op_trace_values must be a number of bytes >= 0, got {self.op_trace_values!r}")
        if not isinstance(self.settle_at_return, bool):
            raise UsageError(f"settle_at_return must be True or False, got {self.settle_at_return!r}")
        if not self.sync_timeout > 0:
            raise UsageError(f"sync_timeout must be > 0 seconds, got {self.sync_timeout!r}")
        ranks = normalise_ranks(self.ranks)
        object.__setattr__(self, "ranks", ranks if isinstance(ranks, str) else tuple(ranks))  # frozen: hashable


@dataclass(frozen=True)
class PayloadPolicy:
    """Which captured tensors keep their payload, and which are stored shape-only (dtype, shape,
    statistics) (docs/fidelity.md, "Shape-only records").

    Args:
        shape_only_over: bytes; a call tensor (input, output, gradient) bigger than this is stored
            shape-only.
        max_bytes: bytes of payload per capture (parameters included); over it, the largest call
            tensors go shape-only until the capture fits.
        shape_only_params: let parameters and buffers go shape-only too (the restored module then
            has statistics-matched random weights).

    Raises:
        UsageError: a byte count that is not an integer >= 0.

    Example::

        with modulelens.capture(model, ["ranker.sparse"], payload=PayloadPolicy(shape_only_over=64 << 20,
                                                                                max_bytes=1 << 30)):
            train(model)
    """

    shape_only_over: int | None = None
    max_bytes: int | None = None
    shape_only_params: bool = False

    def __post_init__(self) -> None:
        for name in ("shape_only_over", "max_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise UsageError(f"PayloadPolicy({name}=...) must be a number of bytes >= 0, got {value!r}")

    @property
    def active(self) -> bool:
        return self.shape_only_over is not None or self.max_bytes is not None

    def settings(self) -> dict[str, object]:
        return {"shape_only_over": self.shape_only_over, "max_bytes": self.max_bytes,
                "shape_only_params": self.shape_only_params}


__all__ = ["PayloadPolicy", "Recording"]
