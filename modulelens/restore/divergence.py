"""The first op where two runs of one call part ways (docs/tools.md, "First divergence").

Two op traces (:mod:`modulelens.format.op_trace`) of one call are compared: a candidate against
the rebuilt reference (``verify``, ``kernel verify``, the pytest helper), or a replay against the
trace the recorded job left (``replay``: another process, another machine). The runs need not
run the same ops: a candidate may fuse, reorder or skip them. So they are aligned in two steps:

1. **module calls**, by path and occurrence (the second call of ``blocks.3.attn`` with the
   second); a reference submodule the candidate does not have (fused into one kernel, renamed)
   folds into its nearest aligned ancestor, the **region** its ops are compared in;
2. **ops within a region**: first by value: a reference op whose outputs the candidate made
   bit-identically (same dtype, shape and fingerprint), by any op and in any order, is paired with
   the op that made them, which survives reordering, a no-op the candidate skipped and a value it
   computed by other ops; then the rest of those the region's own module ran, in order, by op name
   and output shapes (``difflib.SequenceMatcher``), which survives ops inserted or skipped. The
   ops of a fused submodule are paired by value only.

The reference's ops and module exits are then walked in the order they ran. A paired op's
outputs are judged by the :class:`DivergenceRule` (bit-exact, or the tolerance in effect, taken
normwise: ``max |a - e| <= atol + rtol * max |e|``, so that cancellation in one element of an
intermediate is not taken for the origin); an aligned module call's outputs are judged the same
way when it exits, which is where a fused region is compared: at its boundary. The first verdict
beyond the rule is the divergence; the paired op before it that agreed is the last agreeing op.
Errors are reported in ULPs of the reference's dtype (:mod:`modulelens.restore.ulp`).

An output whose values were not kept (over the trace's value budget) is judged from its
fingerprint and statistics: equal fingerprints agree; otherwise the statistics bound the error
from below (``|max_a - max_e|``, ``|min_a - min_e|``, ``|mean_a - mean_e|`` and the standard
deviations' difference are each at most ``max |a - e|``), which proves a divergence when the bound
is over the tolerance and leaves it "not measured" when it is not.
"""

from __future__ import annotations

import difflib
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from modulelens.format.op_trace import OpRecorder, OpTrace, TracedOp, TracedValue, TraceLimits
from modulelens.format.shape_only import tensor_stats
from modulelens.restore.compare import default_tolerance
from modulelens.restore.ulp import supported, ulp_error

# Values kept by a trace taken here (both runs of a comparison are in memory at once).
LOCATE_LIMITS = TraceLimits(values_bytes=64 << 20)
_ORDER = {"same": 0, "none": 0, "within": 1, "unknown": 2, "beyond": 3}
# Ops that compute nothing (autograd detaches the outputs it saves for backward): never named as
# the last op that agreed, which should be one the user's code ran.
_BOOKKEEPING = frozenset({"aten::detach", "aten::alias", "aten::lift_fresh"})


@dataclass(frozen=True)
class DivergenceRule:
    """When an op's output counts as diverged: any bit (``exact``), or beyond ``rtol``/``atol``
    (default: the per-dtype table of ``purpose``, as :func:`modulelens.restore.compare.default_tolerance`),
    judged normwise. ``dtype``: the run was cast to it (``load(..., dtype=)``), so its tolerances apply."""

    exact: bool = False
    rtol: float | None = None
    atol: float | None = None
    purpose: str = "replay"
    dtype: torch.dtype | None = None

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        base = default_tolerance(self.dtype or dtype, self.purpose) or (0.0, 0.0)
        return (base[0] if self.rtol is None else self.rtol, base[1] if self.atol is None else self.atol)

    def describe(self) -> str:
        if self.exact:
            return "bit-exact"
        if self.rtol is None and self.atol is None:
            return f"per-dtype {self.purpose.replace('_', '-')} tolerances, normwise"
        return f"rtol={self.rtol}, atol={self.atol}, normwise"


@dataclass
class OpAt:
    """One op (or a module's output, ``op`` ``"(output)"``) of one of the two traces."""

    index: int  # position in its trace's ops (-1: a module boundary)
    module: str  # submodule path ("" is the traced module itself)
    op: str
    source: str | None = None  # "file.py:LINE in function"

    def describe(self) -> str:
        where = f"{self.module or '<root>'} {self.op}"
        return where + (f" at {_short(self.source)}" if self.source else "")


@dataclass
class OpDifference:
    """How one op's (or module boundary's) outputs compared."""

    reference: OpAt
    candidate: OpAt | None
    verdict: str  # "within" (differs, within the rule), "beyond", "unknown" (differs, not measured)
    output: int = 0  # which output
    dtype: str | None = None
    candidate_dtype: str | None = None
    shape: list[int] | None = None
    max_abs_error: float | None = None
    max_ulps: float | None = None  # in ULPs of the reference's dtype
    mismatched: int | None = None  # elements beyond the tolerance (elementwise, for scale)
    numel: int | None = None
    measured: str = "values"  # "values", "statistics" (a lower bound), "fingerprint", "shape", "structure"
    message: str = ""

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        for key in ("max_abs_error", "max_ulps"):
            if isinstance(data[key], float) and not math.isfinite(data[key]):
                data[key] = str(data[key])
        return data


@dataclass
class Divergence:
    """Where two runs of one call part ways (:func:`locate`). ``found``: an op or a module
    boundary diverges beyond the rule; ``first`` is it, ``last_agreeing`` the paired op before it
    that agreed; ``first_difference`` the first paired op not bit-identical (maybe within the rule)."""

    compared: str
    rule: str
    candidate: str = "the candidate"  # what the judged run is called in the details ("this replay")
    found: bool = False
    first: OpDifference | None = None
    last_agreeing: OpAt | None = None
    first_difference: OpDifference | None = None
    unmeasured: list[OpDifference] = field(default_factory=list)  # differ before `first`, by an unknown amount
    fused: list[dict[str, Any]] = field(default_factory=list)  # reference module calls the candidate ran otherwise
    reference_ops: int = 0
    candidate_ops: int = 0
    paired_ops: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line: the first divergence and the last op that agreed (or why there is none)."""
        if not self.found or self.first is None:
            if self.first_difference is not None:
                return (f"no op diverges beyond the tolerance ({self.rule}); the first that differs at all is "
                        f"{self.first_difference.reference.describe()} ({_size(self.first_difference)})")
            if not self.paired_ops:  # nothing was compared: not evidence that nothing diverges
                return (f"no op could be compared: none of the reference's {self.reference_ops} ops was paired with "
                        f"one of {self.candidate}'s {self.candidate_ops}")
            return f"no op of the {self.paired_ops} compared (of {self.reference_ops}) diverges ({self.rule})"
        first = self.first
        where = first.reference.describe()
        if first.reference.index < 0:
            where = f"the output of {first.reference.module or '<root>'}"
            region = next((f for f in self.fused if f["region"] == first.reference.module), None)
            if region is not None:
                where += (f" (compared at its boundary: the candidate ran {', '.join(region['modules'][:3])}"
                          f"{' ...' if len(region['modules']) > 3 else ''} as other ops)")
        text = f"first divergence at {where}: {first.message or _size(first)}"
        if self.last_agreeing is not None:
            text += f"; last agreeing op: {self.last_agreeing.describe()}"
        return text

    def details(self) -> list[str]:
        """The lines after the summary: the candidate's side of the op, ops that differ by an unmeasured
        amount before it, the regions the candidate fused or rewrote, notes."""
        lines = []
        first = self.first
        if first is not None and first.candidate is not None and first.reference.index >= 0 \
                and first.candidate.describe() != first.reference.describe():
            lines.append(f"{self.candidate}'s op: {first.candidate.describe()}")
        lines += [f"differs by an unmeasured amount before it: {d.reference.describe()} ({d.message})"
                  for d in self.unmeasured]
        for region in self.fused[:3]:
            lines.append(f"fused or rewritten by {self.candidate}: {', '.join(region['modules'])} (compared inside "
                         f"{region['region'] or '<root>'}: {region['paired_ops']} of {region['reference_ops']} ops paired)")
        if len(self.fused) > 3:
            lines.append(f"... and {len(self.fused) - 3} more regions fused or rewritten")
        return lines + [f"note: {n}" for n in self.notes]

    def to_dict(self) -> dict[str, object]:
        return {"compared": self.compared, "rule": self.rule, "found": self.found, "summary": self.summary(),
                "details": self.details(),
                "first": self.first.to_dict() if self.first else None,
                "last_agreeing": asdict(self.last_agreeing) if self.last_agreeing else None,
                "first_difference": self.first_difference.to_dict() if self.first_difference else None,
                "unmeasured": [d.to_dict() for d in self.unmeasured], "fused": self.fused,
                "reference_ops": self.reference_ops, "candidate_ops": self.candidate_ops,
                "paired_ops": self.paired_ops, "notes": list(self.notes)}

    def __str__(self) -> str:
        return "\n".join([f"{self.compared} ({self.rule}): {self.summary()}", *(f"  {d}" for d in self.details())])

    __repr__ = __str__


def trace_call(module: torch.nn.Module, run: Callable[[], object],
               limits: TraceLimits = LOCATE_LIMITS) -> tuple[object, OpTrace, str | None]:
    """Run ``run()`` (a call of ``module``) under an op recorder.

    Returns:
        ``(output, trace, error)``: ``error`` says why the recording stopped early (the call ran).

    Example::

        output, trace, _ = trace_call(cap.module, lambda: cap.module(*call.args, **call.kwargs))
    """
    recorder = OpRecorder(module, stats=tensor_stats, limits=limits)
    recorder.start()
    output: Any = None
    try:
        output = run()
    finally:
        trace = recorder.stop(output)
    return output, trace, recorder.error


def locate(reference: OpTrace, candidate: OpTrace, rule: DivergenceRule, *, compared: str,
           candidate_name: str = "the candidate") -> Divergence:
    """The first op (or module boundary) where ``candidate`` diverges from ``reference`` by ``rule``.

    Args:
        reference: the trace taken as right (the rebuilt original, the recorded job).
        candidate: the trace judged (a rewrite, a replay).
        rule: bit-exact or a tolerance (:class:`DivergenceRule`).
        compared: says what the two traces are, for the report.
        candidate_name: what the judged run is called in the report's details.

    Returns:
        A :class:`Divergence`; ``found`` false when nothing diverges beyond the rule.

    Example::

        divergence = locate(cap.calls[0].op_trace, replayed, DivergenceRule(exact=True),
                            compared="replay against the recorded job's trace")
        print(divergence.summary())   # first divergence at blocks.2.attn aten::_softmax at model.py:41 ...
    """
    result = Divergence(compared=compared, rule=rule.describe(), candidate=candidate_name,
                        reference_ops=len(reference.ops), candidate_ops=len(candidate.ops))
    modules = _pair_module_calls(reference, candidate)
    ops = _pair_ops(reference, candidate, modules)
    result.paired_ops = len(ops)
    result.fused = _fused(reference, modules, ops)
    for kind, index in _events(reference):
        if kind == "op":
            if index not in ops:
                continue
            difference = _compare_op(reference, candidate, index, ops[index], rule)
            where = _op_at(reference, index)
        else:
            if index not in modules:
                continue
            difference = _compare_boundary(reference, candidate, index, modules[index], rule)
            where = None
        if difference is None:  # bit-identical (or nothing comparable)
            if where is not None and where.op not in _BOOKKEEPING:
                result.last_agreeing = where
            continue
        if result.first_difference is None and kind == "op":
            result.first_difference = difference
        if difference.verdict == "within" and where is not None:
            result.last_agreeing = where
        elif difference.verdict == "unknown":
            if len(result.unmeasured) < 5:
                result.unmeasured.append(difference)
        elif difference.verdict == "beyond":
            result.found, result.first = True, difference
            break
    if reference.truncated or candidate.truncated:
        result.notes.append(f"the traces stopped recording ops after {TraceLimits().max_ops} (reference "
                            f"{reference.truncated} more, candidate {candidate.truncated} more)")
    return result


# -------------------------------------------------------------------------------------- alignment


def _pair_module_calls(reference: OpTrace, candidate: OpTrace) -> dict[int, int]:
    """Reference module call -> the candidate's call of the same path and occurrence."""
    def keyed(trace: OpTrace) -> dict[tuple[str, int], int]:
        seen: Counter[str] = Counter()
        keys = {}
        for index, call in enumerate(trace.modules):
            keys[(call.path, seen[call.path])] = index
            seen[call.path] += 1
        return keys

    theirs = keyed(candidate)
    return {index: theirs[key] for key, index in keyed(reference).items() if key in theirs}


def _regions(trace: OpTrace, aligned: set[int]) -> dict[int, list[int]]:
    """Aligned module call -> the ops it ran outside aligned submodule calls, in order."""
    region_of: list[int] = []
    for index, call in enumerate(trace.modules):
        region_of.append(index if index in aligned or call.parent < 0 else region_of[call.parent])
    regions: dict[int, list[int]] = defaultdict(list)
    for position, op in enumerate(trace.ops):
        regions[region_of[op.module]].append(position)
    return regions


def _exact_key(op: TracedOp) -> tuple[object, ...] | None:
    """The op's outputs, bit for bit (not its name: a value the candidate made by other ops, or one a
    skipped no-op passed through, is there all the same)."""
    if not op.outputs or any(v.is_tensor and v.fingerprint is None for v in op.outputs):
        return None
    return tuple((v.dtype, tuple(v.shape or ()), v.fingerprint) if v.is_tensor else ("scalar", repr(v.scalar))
                 for v in op.outputs)


def _loose_key(op: TracedOp) -> tuple[object, ...]:
    """The op's name without its overload, and its output shapes (dtypes may differ: a cast rewrite)."""
    return (op.op.split(".")[0], *(tuple(v.shape or ()) if v.is_tensor else "scalar" for v in op.outputs))


def _pair_ops(reference: OpTrace, candidate: OpTrace, modules: dict[int, int]) -> dict[int, int]:
    """Reference op -> candidate op, region by region (see the module docstring)."""
    ours = _regions(reference, set(modules))
    theirs = _regions(candidate, set(modules.values()))
    pairs: dict[int, int] = {}
    for region, reference_ops in ours.items():
        candidate_ops = theirs.get(modules[region], [])
        made: dict[tuple[object, ...], list[int]] = defaultdict(list)  # output values -> the candidate's ops making them
        for position in candidate_ops:
            key = _exact_key(candidate.ops[position])
            if key is not None:
                made[key].append(position)
        taken: set[int] = set()
        for position in reference_ops:
            makers = made.get(_exact_key(reference.ops[position]) or ())
            if makers:  # the first maker not paired yet, else the first (a value made once, passed on twice)
                pairs[position] = next((p for p in makers if p not in taken), makers[0])
                taken.add(pairs[position])
        # In order only the ops the region's own module ran: those of a submodule the candidate fused
        # are paired by value or not at all (a fused region is compared at its boundary; pairing its
        # ops by name paired a view of addmm's result with one of a matmul's before the bias was added)
        rest_ours = [p for p in reference_ops if p not in pairs and reference.ops[p].module == region]
        rest_theirs = [p for p in candidate_ops if p not in taken]
        matcher = difflib.SequenceMatcher(None, [_loose_key(reference.ops[p]) for p in rest_ours],
                                          [_loose_key(candidate.ops[p]) for p in rest_theirs], autojunk=False)
        for block in matcher.get_matching_blocks():
            for k in range(block.size):
                pairs[rest_ours[block.a + k]] = rest_theirs[block.b + k]
    return pairs


def _fused(reference: OpTrace, modules: dict[int, int], ops: dict[int, int]) -> list[dict[str, Any]]:
    """Per aligned reference call, its outermost submodule calls without a counterpart (the
    candidate fused, renamed or skipped them): their ops were compared inside it, its ``region``."""
    regions: dict[int, dict[str, Any]] = {}
    for index, call in enumerate(reference.modules):
        if index in modules or call.parent < 0 or call.parent not in modules:
            continue
        region = regions.setdefault(call.parent, {"region": reference.modules[call.parent].path, "modules": [],
                                                  "reference_ops": 0, "paired_ops": 0})
        region["modules"].append(call.path)
        region["reference_ops"] += call.end - call.start
        region["paired_ops"] += sum(p in ops for p in range(call.start, call.end))
    return list(regions.values())


def _events(trace: OpTrace) -> list[tuple[str, int]]:
    """The reference's ops and module exits in the order they happened."""
    ends: dict[int, list[int]] = defaultdict(list)
    for index, call in enumerate(trace.modules):
        ends[call.end].append(index)
    events: list[tuple[str, int]] = []
    for position in range(len(trace.ops) + 1):
        events += [("exit", index) for index in sorted(ends.get(position, ()), reverse=True)]
        if position < len(trace.ops):
            events.append(("op", position))
    return events


# -------------------------------------------------------------------------------------- comparison


def _op_at(trace: OpTrace, position: int) -> OpAt:
    op = trace.ops[position]
    return OpAt(position, trace.modules[op.module].path, op.op, trace.source_of(op))


def _compare_op(reference: OpTrace, candidate: OpTrace, ours: int, theirs: int,
                rule: DivergenceRule) -> OpDifference | None:
    return _compare_outputs(reference.ops[ours].outputs, candidate.ops[theirs].outputs, rule,
                            _op_at(reference, ours), _op_at(candidate, theirs))


def _compare_boundary(reference: OpTrace, candidate: OpTrace, ours: int, theirs: int,
                      rule: DivergenceRule) -> OpDifference | None:
    mine, other = reference.modules[ours], candidate.modules[theirs]
    return _compare_outputs(mine.outputs, other.outputs, rule, OpAt(-1, mine.path, "(output)"),
                            OpAt(-1, other.path, "(output)"))


def _compare_outputs(expected: list[TracedValue], actual: list[TracedValue], rule: DivergenceRule,
                     where: OpAt, there: OpAt) -> OpDifference | None:
    """The worst of the outputs' verdicts, or ``None`` when all are bit-identical (or not comparable)."""
    if len(expected) != len(actual):
        return OpDifference(where, there, "beyond", measured="structure",
                            message=f"{len(actual)} outputs instead of {len(expected)}")
    worst: OpDifference | None = None
    for position, (want, got) in enumerate(zip(expected, actual, strict=True)):
        difference = _compare_value(want, got, rule, where, there, position)
        if difference is not None and (worst is None or _ORDER[difference.verdict] > _ORDER[worst.verdict]):
            worst = difference
    return worst


def _compare_value(want: TracedValue, got: TracedValue, rule: DivergenceRule, where: OpAt, there: OpAt,
                   position: int) -> OpDifference | None:
    if want.same(got):
        return None
    result = OpDifference(where, there, "beyond", output=position, dtype=want.dtype, candidate_dtype=got.dtype,
                          shape=want.shape)
    if not want.is_tensor or not got.is_tensor:
        result.measured = "structure"
        result.message = f"{got.describe()} instead of {want.describe()}"
        return result
    if want.shape != got.shape:
        result.measured = "shape"
        result.message = f"shape {got.shape} instead of {want.shape}"
        return result
    if want.fingerprint is None and want.stats is None:
        return None  # nothing was read of it (uninitialised memory, an unreadable layout)
    if want.tensor is not None and got.tensor is not None:
        return _measured(want.tensor, got.tensor, rule, result)
    return _from_statistics(want, got, rule, result)


def _measured(expected: torch.Tensor, actual: torch.Tensor, rule: DivergenceRule,
              result: OpDifference) -> OpDifference:
    result.numel = expected.numel()
    floating = expected.dtype.is_floating_point or expected.dtype.is_complex
    if not floating or not supported(expected.dtype):
        mismatched = int((expected != actual.to(expected.dtype)).sum())
        result.mismatched = mismatched
        result.max_abs_error = float((expected.to(torch.float64) - actual.to(torch.float64)).abs().max()) \
            if expected.numel() and not expected.dtype.is_complex else None
        result.verdict = "beyond" if mismatched else "within"
        result.message = f"{mismatched}/{expected.numel()} elements differ"
        return result
    ulps = ulp_error(actual, expected, expected.dtype)
    want = expected.detach().to(torch.complex128 if expected.dtype.is_complex else torch.float64)
    got = actual.detach().to(want.dtype)
    diff = (got - want).abs()
    nan_here = torch.isnan(want) ^ torch.isnan(got)
    diff = torch.where(torch.isnan(want) & torch.isnan(got), torch.zeros_like(diff), diff)
    if diff.dtype.is_complex:
        diff = diff.real
    result.max_abs_error = float(diff.max()) if diff.numel() else 0.0
    result.max_ulps = float(ulps.max()) if ulps.numel() else 0.0
    scale = want.abs()
    scale = scale[torch.isfinite(scale)]
    magnitude = float(scale.max()) if scale.numel() else 0.0
    rtol, atol = rule.tolerance(expected.dtype)
    limit = atol + rtol * magnitude
    elementwise = (diff > atol + rtol * want.abs().real) | nan_here
    result.mismatched = int(elementwise.sum())
    over = rule.exact or bool(nan_here.any()) or not (result.max_abs_error <= limit)
    result.verdict = "beyond" if over else "within"
    dtype_note = "" if actual.dtype == expected.dtype else f", computed in {str(actual.dtype).removeprefix('torch.')}"
    result.message = (f"{_ulps_text(result.max_ulps)} of {str(expected.dtype).removeprefix('torch.')} (max abs error "
                      f"{result.max_abs_error:.3g}{dtype_note}; {result.mismatched}/{result.numel} elements "
                      + ("differ bit-wise" if rule.exact else f"beyond rtol={rtol:g}, atol={atol:g}") + ")")
    return result


def _from_statistics(want: TracedValue, got: TracedValue, rule: DivergenceRule,
                     result: OpDifference) -> OpDifference:
    """No values on one side: the fingerprints differ; the statistics may prove by how much at least."""
    result.measured = "fingerprint"
    mine, theirs = want.stats or {}, got.stats or {}
    if mine.get("nonfinite", 0) != theirs.get("nonfinite", 0):
        result.measured = "statistics"
        result.message = (f"{theirs.get('nonfinite', 0)} non-finite values instead of {mine.get('nonfinite', 0)} "
                          "(values not kept: statistics compared)")
        return result
    bound = 0.0
    for key in ("min", "max", "mean", "std"):
        a, b = mine.get(key), theirs.get(key)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isfinite(a) and math.isfinite(b):
            bound = max(bound, abs(a - b))
    if rule.exact:
        result.message = "the bits differ (values not kept: fingerprints compared" + (
            f"; the statistics say max abs error >= {bound:.3g})" if bound else ")")
        result.max_abs_error = bound or None
        return result
    magnitude = max((abs(mine[k]) for k in ("min", "max") if isinstance(mine.get(k), (int, float))), default=0.0)
    named = getattr(torch, want.dtype or "", None)
    dtype = named if isinstance(named, torch.dtype) else torch.float32
    rtol, atol = rule.tolerance(dtype)
    result.max_abs_error = bound or None
    if bound > atol + rtol * magnitude:
        result.measured = "statistics"
        result.message = (f"max abs error >= {bound:.3g} (from the statistics: the values were not kept), "
                          f"over rtol={rtol:g}, atol={atol:g}")
        return result
    result.verdict = "unknown"
    result.message = "the bits differ; by how much is not known (the values were not kept)"
    return result


def _ulps_text(ulps: float | None) -> str:
    if ulps is None:
        return "error"
    if not math.isfinite(ulps):
        return "inf ULPs (a NaN or an infinity where the other run has a number)"
    return f"{ulps:.3g} ULPs"


def _size(difference: OpDifference) -> str:
    return difference.message or difference.verdict


def _short(source: str) -> str:
    """``/long/path/to/model.py:41 in forward`` -> ``model.py:41 in forward``."""
    path, _, rest = source.partition(":")
    return path.replace("\\", "/").rsplit("/", 1)[-1] + (f":{rest}" if rest else "")


__all__ = ["Divergence", "DivergenceRule", "OpAt", "OpDifference", "locate", "trace_call"]
