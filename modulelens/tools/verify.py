"""``modulelens verify``: does a candidate implementation reproduce every recorded call?

The candidate (a class, an instance, or a ``file.py:Class`` / ``module:Class`` spec) is built
like the original (``from_original(module)`` if it defines it, else the recorded constructor
arguments), given the recorded state dict strictly, and run on every recorded call under the
recorded grad mode / autocast / RNG state / training flag. Outputs are compared leaf by leaf with
:func:`modulelens.restore.compare.compare` (per-dtype tolerances, overridable), the inputs are
checked for in-place modification, and reference and candidate are timed on the same inputs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import torch
import torch.utils._pytree as pytree

from modulelens.errors import ToolError
from modulelens.format.metric_states import metric_states, set_metric_states
from modulelens.restore.buffer_check import BufferCheck
from modulelens.restore.compare import LeafResult, UlpTolerance, check_ulps, compare, nothing_to_compare
from modulelens.restore.divergence import Divergence, DivergenceRule, locate, trace_call
from modulelens.restore.oracle import Float64Oracle, OracleRun, low_precision
from modulelens.restore.replay import call_context, recorded_device_type
from modulelens.tools.candidates import Candidate, build_candidate, describe_candidate
from modulelens.tools.recorded import refuse_ensemble
from modulelens.tools.reports import json_safe, store_report
from modulelens.tools.timing import TimingConfig, compare_timings, time_pair, timing_noise, timing_summary
from modulelens.tools.working_copy import has_buffers, load_pristine_state, run_device, working_module

if TYPE_CHECKING:
    from modulelens.restore.calls import Call
    from modulelens.restore.loader import Capture


_TIMING = TimingConfig(warmup=3, iters=20)  # per call, for reference and candidate alike

Status = Literal["PASS", "FAIL", "UNVERIFIED"]


@dataclass
class CallVerification:
    """How the candidate did on one recorded call.

    ``status`` is ``"pass"`` (every output leaf compared with recorded values and matching, and at
    least one of them holds something to compare), ``"fail"`` (a leaf differs, contradicts its
    recorded statistics, an input was modified, or the candidate raised) or ``"unverified"``
    (nothing contradicts the recording, but ``unverified`` names what had no values to compare:
    a shape-only or unrecorded output, ``None``, no finite value, a call that raised when recorded).
    """

    call: int  # position in capture.calls
    index: int  # the module's call number in the original job
    passed: bool = False
    error: str | None = None
    unverified: list[str] = field(default_factory=list)
    leaves: list[LeafResult] = field(default_factory=list)
    mutated_inputs: list[LeafResult] = field(default_factory=list)
    max_abs_error: float = 0.0
    mean_abs_error: float = 0.0
    max_rel_error: float = 0.0
    mean_rel_error: float = 0.0
    reference_ms: float | None = None  # medians of the interleaved timed iterations
    candidate_ms: float | None = None
    timing: dict[str, Any] | None = None  # compare_timings(): speedup range, p10/p90 of both, noise
    divergence: Divergence | None = None  # the first failing call: where the candidate parts from the reference

    @property
    def speedup(self) -> float | None:
        if self.reference_ms is None or not self.candidate_ms:
            return None
        return self.reference_ms / self.candidate_ms

    @property
    def status(self) -> Literal["pass", "fail", "unverified"]:
        if self.error or any(not leaf.passed for leaf in self.leaves) or self.mutated_inputs:
            return "fail"
        return "unverified" if self.unverified else "pass"

    @property
    def max_ulps(self) -> float | None:
        """The largest error in ULPs over the floating output leaves (``None``: none)."""
        values = [leaf.max_ulps for leaf in self.leaves if leaf.max_ulps is not None]
        return max(values) if values else None

    @property
    def failures(self) -> list[str]:
        """One readable line per problem: which output leaf, how far off; which input was modified."""
        lines = []
        if self.error:
            lines.append(f"call {self.index}: {self.error}")
        lines.extend(f"call {self.index}: {leaf.path}: {leaf.message}" for leaf in self.leaves if not leaf.passed)
        lines.extend(f"call {self.index}: the candidate modified its input {leaf.path} in place ({leaf.message})"
                     for leaf in self.mutated_inputs)
        if self.divergence is not None:
            lines.append(f"call {self.index}: {self.divergence.summary()}")
        return lines

    def to_dict(self) -> dict[str, object]:
        return json_safe({
            "call": self.call, "index": self.index, "passed": self.passed, "status": self.status,
            "error": self.error, "unverified": self.unverified,
            "max_abs_error": self.max_abs_error, "mean_abs_error": self.mean_abs_error,
            "max_rel_error": self.max_rel_error, "mean_rel_error": self.mean_rel_error, "max_ulps": self.max_ulps,
            "reference_ms": self.reference_ms, "candidate_ms": self.candidate_ms, "speedup": self.speedup,
            "timing": self.timing, "mutated_inputs": [leaf.to_dict() for leaf in self.mutated_inputs],
            "leaves": [leaf.to_dict() for leaf in self.leaves],
            "divergence": self.divergence.to_dict() if self.divergence is not None else None,
        })


@dataclass
class VerifyReport:
    """The verdict of :func:`verify`: ``status`` is ``"PASS"`` (every selected call passed),
    ``"FAIL"`` (``failures`` says why) or ``"UNVERIFIED"``: nothing contradicts the recording, but
    there was nothing real to compare (``unverified`` names it: no recorded calls, outputs stored
    shape-only, ``None``, NaN). ``passed`` is true only for ``"PASS"``."""

    ref: str
    candidate: str
    built_with: str
    device: str
    dtype: str | None
    rtol: float | None
    atol: float | None
    calls: list[CallVerification] = field(default_factory=list)
    state_mismatch: StateMismatch | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    report_path: str | None = None
    timing_noise: list[str] = field(default_factory=list)  # why the timings cannot be trusted (tools/timing.py)
    no_calls: str | None = None  # why no call was selected (a capture without recorded calls)

    @property
    def status(self) -> Status:
        if self.error is not None or any(c.status == "fail" for c in self.calls):
            return "FAIL"
        return "PASS" if self.calls and all(c.status == "pass" for c in self.calls) else "UNVERIFIED"

    @property
    def passed(self) -> bool:
        return self.status == "PASS"

    @property
    def unverified(self) -> list[str]:
        """Why the verdict cannot be PASS although nothing failed: one line per reason."""
        if self.error is None and not self.calls:
            return [self.no_calls or f"{self.ref}: no call was verified"]
        return [f"call {c.index}: {reason}" for c in self.calls if c.status == "unverified" for reason in c.unverified]

    @property
    def speedup(self) -> float | None:
        """Sum of reference medians over sum of candidate medians (calls timed for both)."""
        timed = [c for c in self.calls if c.reference_ms is not None and c.candidate_ms]
        if not timed:
            return None
        return sum(c.reference_ms or 0.0 for c in timed) / sum(c.candidate_ms or 0.0 for c in timed)

    @property
    def failures(self) -> list[str]:
        lines = [self.error] if self.error else []
        for c in self.calls:
            lines.extend(c.failures)
        return lines

    def to_dict(self) -> dict[str, object]:
        return json_safe({
            "ref": self.ref, "candidate": self.candidate, "built_with": self.built_with, "passed": self.passed,
            "status": self.status, "unverified": self.unverified, "device": self.device, "dtype": self.dtype,
            "rtol": self.rtol, "atol": self.atol,
            "speedup": self.speedup, "timing_trusted": not self.timing_noise, "timing_noise": self.timing_noise,
            "error": self.error, "state_mismatch": self.state_mismatch,
            "failures": self.failures, "notes": self.notes, "calls": [c.to_dict() for c in self.calls],
        })

    def __str__(self) -> str:
        tol = f"rtol={self.rtol}, atol={self.atol}"
        if self.rtol is None and self.atol is None:
            tol = "per-dtype tolerances"
        if any(leaf.rule == "oracle" for c in self.calls for leaf in c.leaves):
            tol = "the float64 oracle rule"
        lines = [f"verify {self.candidate} against {self.ref} on {self.device} ({tol}): {self.status}"]
        if self.error:
            lines.append(f"  {self.error}")
        lines.extend(f"  cannot verify: {reason}" for reason in self.unverified)
        for c in self.calls:
            timing = f"  {c.speedup:.2f}x" if c.speedup else ""
            if c.speedup and c.timing:
                timing += f" ({c.timing['speedup_low']:.2f}-{c.timing['speedup_high']:.2f})"
            status = {"pass": "pass", "fail": "FAIL", "unverified": "UNVERIFIED"}[c.status]
            ulps = "" if c.max_ulps is None else f"  max {c.max_ulps:.3g} ULPs"
            lines.append(f"  call {c.index}: {status}  max abs err {c.max_abs_error:.3g}"
                         f"  mean abs err {c.mean_abs_error:.3g}  max rel err {c.max_rel_error:.3g}{ulps}{timing}")
            lines.extend(f"    {line.split(': ', 1)[1]}" for line in c.failures)
        if self.speedup:
            lines.append(f"  speedup {self.speedup:.2f}x (reference median / candidate median, timed interleaved)"
                         + (" -- too noisy to trust (see the note)" if self.timing_noise else ""))
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    __repr__ = __str__


class StateMismatch(TypedDict):
    """How a candidate's state dict differs from the recorded one (:func:`load_state_strict`)."""

    missing: list[str]
    unexpected: list[str]
    shape: list[dict[str, object]]


def load_state_strict(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> StateMismatch | None:
    """Load ``state`` into ``module``; return the mismatch (``None`` when it loaded exactly).

    ``missing`` are keys the candidate has that the recording lacks; ``unexpected`` are recorded
    keys the candidate has no place for; ``shape`` lists same-named tensors of different shapes.

    Example::

        mismatch = load_state_strict(candidate, cap.state_dict())
        if mismatch:
            print(describe_mismatch(mismatch))
    """
    own = module.state_dict()
    shapes: list[dict[str, object]] = [
        {"key": key, "candidate": list(own[key].shape), "recorded": list(value.shape)}
        for key, value in state.items() if key in own and tuple(own[key].shape) != tuple(value.shape)
    ]
    if shapes:
        result_missing = sorted(set(own) - set(state))
        result_unexpected = sorted(set(state) - set(own))
        return {"missing": result_missing, "unexpected": result_unexpected, "shape": shapes}
    try:
        result = module.load_state_dict(state, strict=False)
    except RuntimeError as error:  # size mismatches found by load hooks
        found = re.findall(r"size mismatch for ([^:]+):", str(error))
        return {"missing": [], "unexpected": [], "shape": [{"key": k} for k in found] or [{"error": str(error)}]}
    if result.missing_keys or result.unexpected_keys:
        return {"missing": sorted(result.missing_keys), "unexpected": sorted(result.unexpected_keys), "shape": []}
    return None


def describe_mismatch(mismatch: StateMismatch, limit: int = 8) -> str:
    """One line naming missing, unexpected and reshaped keys (at most ``limit`` of each)."""
    def keys(items: Sequence[object]) -> str:
        shown = ", ".join(str(k) for k in items[:limit])
        return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")

    parts = []
    if mismatch["missing"]:
        parts.append(f"missing keys (the candidate has them, the recording does not): {keys(mismatch['missing'])}")
    if mismatch["unexpected"]:
        parts.append(f"unexpected keys (recorded, the candidate has no such tensor): {keys(mismatch['unexpected'])}")
    if mismatch["shape"]:
        parts.append("shape mismatch: " + keys([
            f"{s['key']} candidate {s['candidate']} vs recorded {s['recorded']}" if "candidate" in s else str(s)
            for s in mismatch["shape"]]))
    return "the candidate's state dict does not match the recorded one: " + "; ".join(parts)


def error_means(expected: object, actual: object) -> tuple[float, float]:
    """Mean absolute and mean relative error over all floating tensor elements of two output trees
    (relative error only where the expected value is non-zero; NaN matching NaN counts as 0).

    Example::

        mean_abs, mean_rel = error_means(call.output, candidate(*call.args))
    """
    want_leaves, want_spec = pytree.tree_flatten(expected)
    got_leaves, got_spec = pytree.tree_flatten(actual)
    if want_spec != got_spec:
        return math.nan, math.nan
    total_abs = total_rel = 0.0
    count_abs = count_rel = 0
    for want, got in zip(want_leaves, got_leaves, strict=True):
        if not (isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor)) or want.shape != got.shape:
            continue
        if not (want.is_floating_point() or want.is_complex()) or want.numel() == 0:
            continue
        w = want.detach().to("cpu", torch.complex128 if want.is_complex() else torch.float64)
        g = got.detach().to("cpu", w.dtype)
        diff = (g - w).abs()
        diff = torch.where(torch.isnan(w) & torch.isnan(g), torch.zeros_like(diff), diff)
        if diff.dtype.is_complex:
            diff = diff.real
        total_abs += float(diff.sum())
        count_abs += diff.numel()
        nonzero = w.abs() > 0
        if bool(nonzero.any()):
            total_rel += float((diff[nonzero] / w.abs()[nonzero]).sum())
            count_rel += int(nonzero.sum())
    return (total_abs / count_abs if count_abs else 0.0), (total_rel / count_rel if count_rel else 0.0)


def _mutations(before: tuple[object, object], after: tuple[object, object]) -> list[LeafResult]:
    changed = []
    for prefix, want, got in (("args", before[0], after[0]), ("kwargs", before[1], after[1])):
        for leaf in compare(want, got, exact=True):
            if not leaf.passed:
                leaf.path = prefix + leaf.path.removeprefix("output")
                changed.append(leaf)
    return changed


# Over 80 lines only through its docstring (Args/Returns/Raises/Example); the body validates and
# hands off to private helpers, one job each.
def verify(
    capture: Capture,
    candidate: Candidate,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    calls: Sequence[int] | None = None,
    load_state: bool | None = None,
    timing: TimingConfig | None = _TIMING,
    store: bool = True,
    mode: str = "recorded",
    locate_divergence: bool = True,
    ulps: UlpTolerance | None = None,
    oracle: bool | None = None,
    oracle_factor: float | None = None,
) -> VerifyReport:
    """Run ``candidate`` on every recorded call of ``capture`` and compare with the recorded outputs.

    Runs on the capture's device and dtype (``load(..., device=...)``).

    Args:
        capture: the loaded capture whose recorded calls are the reference.
        candidate: an ``nn.Module`` class, an instance, or a ``"file.py:Class"`` /
            ``"package.module:Class"`` spec; built from the recorded constructor arguments, or by
            its ``from_original(module)`` classmethod when it has one.
        rtol, atol: override the per-dtype tolerances.
        calls: positions in ``capture.calls`` to check (default: all).
        load_state: load each call's recorded state dict strictly (default: yes, unless the
            candidate was built by ``from_original``).
        timing: time reference and candidate on the same inputs; ``None`` skips timing.
        store: keep the report with the capture's version.
        locate_divergence: on the first call whose outputs fail, run the rebuilt reference and the
            candidate again under an op trace and name the first op where the candidate diverges
            (``CallVerification.divergence``; docs/tools.md, "First divergence").
        ulps: judge floating outputs within this many ULPs of the recorded ones instead of
            ``rtol``/``atol``: one number, or ``{"bfloat16": 2, "float32": 64}`` per dtype.
        oracle: judge floating outputs by their error against a float64 run of the reference,
            within ``oracle_factor`` times the recording's own (docs/tools.md, "Verdicts in ULPs");
            outputs it cannot cover fall back to ``ulps``, then to ``rtol``/``atol``. Default: on
            when the outputs (or the run, ``load(..., dtype=)``) are float16, bfloat16 or float8
            and no ``rtol``/``atol``/``ulps`` is given.
        oracle_factor: ``k`` of the oracle rule (default: 4 for float32, 3 for 16- and 8-bit floats).
        mode: ``"recorded"`` runs each call in its recorded mode; ``"eval"``/``"train"`` runs every
            call in that mode instead, and a call recorded in the other mode is then compared with
            the original module run in that mode on the same inputs.

    Returns:
        A :class:`VerifyReport`. ``report.status`` is the verdict: ``"PASS"``, ``"FAIL"``
        (``report.failures`` says why) or ``"UNVERIFIED"`` (``report.unverified`` says what had
        nothing to compare: no recorded calls, an output stored shape-only, ``None``, only NaN).
        ``report.passed`` is true only for ``"PASS"``. A verdict is never PASS on values that were
        not recorded: a shape-only output is checked for its shape, dtype and recorded statistics
        (a candidate that contradicts them FAILS; one that agrees is UNVERIFIED, not PASS).

    Raises:
        CandidateError: the candidate cannot be found, imported or built.
        ToolError: ``mode`` is not one of those above.

    Example::

        cap = modulelens.load("ranker/mlp:golden")
        report = modulelens.verify(cap, "kernels/fused_mlp.py:FusedMLP", rtol=1e-4)
        assert report.passed, "\\n".join(report.failures)
        print(f"{report.speedup:.2f}x faster")
    """
    if mode not in ("recorded", "eval", "train"):
        raise ToolError(f"mode must be recorded, eval or train, not {mode!r}")
    refuse_ensemble(capture, "verify")
    if oracle_factor is not None and not oracle_factor > 0:
        raise ToolError(f"oracle_factor must be > 0, got {oracle_factor}")
    if oracle is None:
        oracle = rtol is None and atol is None and ulps is None and low_precision(_output_dtypes(capture, calls))
    judging = _Judging(check_ulps(ulps), oracle, oracle_factor)
    device = run_device(capture)
    dtype = capture.dtype
    cross_device = recorded_device_type(capture) != device.type
    selected = list(range(len(capture.calls))) if calls is None else list(calls)
    first_state = capture.calls[selected[0]].state_index if selected else 0
    module, built_with = build_candidate(candidate, capture, first_state)
    if load_state is None:
        load_state = built_with != "from_original"
    report = VerifyReport(ref=capture.ref, candidate=describe_candidate(candidate), built_with=built_with,
                          device=str(device), dtype=str(dtype).removeprefix("torch.") if dtype else None,
                          rtol=rtol, atol=atol, notes=list(capture.notes))
    if not selected:
        report.no_calls = (f"{capture.ref} has no recorded calls to verify against" if not capture.calls
                           else "no recorded call was selected (calls=[])")
    current_state: int | None = None if load_state or built_with == "from_original" else first_state
    references = _References(capture, device, dtype)
    for position in selected:
        if report.error:
            break
        call = capture.calls[position]
        result = CallVerification(call=position, index=call.index)
        report.calls.append(result)
        if not call.finished:
            result.unverified.append("the recorded call raised in the original job: no output to compare")
            continue
        # a training-mode call changes buffers (BatchNorm running stats): give each one its state afresh
        # (and a metric's update changes its running states, whatever the mode)
        if call.state_index != current_state or (call.training and has_buffers(module)) or metric_states(module):
            if built_with == "from_original" and current_state is not None:
                module, _ = build_candidate(candidate, capture, call.state_index)
            if load_state and not _load_recorded_state(module, capture, call.state_index, report):
                break
            module.to(device)
            if dtype is not None:
                module.to(dtype)
            current_state = call.state_index
        training = call.training if mode == "recorded" else mode == "train"
        if training != call.training:
            report.notes.append(f"call {call.index} was recorded in {'training' if call.training else 'eval'} mode "
                                f"and ran in {mode} mode: compared with the original module run in {mode} mode")
        note = _run_call(module, capture, call, result, device, dtype, rtol, atol, cross_device,
                         references if timing is not None else None, timing, training=training,
                         expected_from=references if training != call.training else None,
                         judging=judging.with_oracle(references, call, device, dtype, training),
                         check_buffers=load_state or built_with == "from_original")
        if note:
            report.notes.append(note)
        # (the op traces locate a wrong output; a wrong buffer update is named by its leaf)
        if locate_divergence and result.error is None and any(not leaf.passed and leaf.path.startswith("output")
                                                              for leaf in result.leaves):
            locate_divergence = False  # the first failing call only: each locate runs both twice more
            rule = DivergenceRule(rtol=rtol, atol=atol, purpose="cross_device" if cross_device else "replay")
            result.divergence = _divergence(_Traced(module, candidate, built_with, load_state), references, call,
                                            device, dtype, rule, training, report.notes)
    if cross_device:
        report.notes.append(f"recorded on {recorded_device_type(capture)}, run on {device.type}: "
                            "float32 tolerances widened for reordered reductions")
    report.timing_noise = timing_noise([(f"call {c.index}", _shapes(capture.calls[c.call]), c.timing)
                                        for c in report.calls if c.timing])
    if report.timing_noise:
        report.notes.append("timings too noisy to trust: " + "; ".join(report.timing_noise[:2]))
    if store:
        report.report_path = store_report(capture, "verify", report.to_dict())
    return report


def _load_recorded_state(module: torch.nn.Module, capture: Capture, state_index: int, report: VerifyReport) -> bool:
    """Load recorded state ``state_index`` strictly, and its torchmetrics metric states (they are not
    in a metric's state dict); on a mismatch, record it as the report's error."""
    mismatch = load_state_strict(module, capture.fresh_state_dict(state_index))
    if mismatch is None:
        if metric_states(module):
            set_metric_states(module, capture.fresh_module_state(state_index))
        return True
    report.state_mismatch = mismatch
    report.error = describe_mismatch(mismatch)
    report.calls.pop()
    return False


def _run_call(
    module: torch.nn.Module, capture: Capture, call: Call, result: CallVerification, device: torch.device,
    dtype: torch.dtype | None, rtol: float | None, atol: float | None, cross_device: bool,
    references: _References | None, timing: TimingConfig | None, *, training: bool,
    expected_from: _References | None = None, judging: _Judging | None = None, check_buffers: bool = False,
) -> str | None:
    """Run, compare and time one call in ``training`` mode; returns a note if timing failed.

    ``expected_from`` (when the mode is not the recorded one) supplies the original module, whose
    run on the same inputs is the expected output instead of the recorded one."""
    before = call.fresh_inputs(device, dtype)
    args, kwargs = call.fresh_inputs(device, dtype)
    want = call.output
    if expected_from is not None:
        reference = expected_from.get(call.state_index, training)
        reference.train(training)
        with call_context(call, device), torch.no_grad():
            want = capture.entry_point(reference)(*call.fresh_inputs(device, dtype)[0],
                                                  **call.fresh_inputs(device, dtype)[1])
    module.train(training)
    run = capture.entry_point(module)  # module(...), or module.encode for a method capture
    # the buffers the call changes (running statistics), where the candidate starts from the recorded ones
    buffers = BufferCheck(capture, call, module) if check_buffers and expected_from is None else None
    judging = judging or _Judging()
    try:
        with call_context(call, device):
            output = run(*args, **kwargs)
    except Exception as error:
        result.error = f"the candidate raised {type(error).__name__}: {error}"
        return None
    result.leaves = compare(want, output, exact=False, rtol=rtol, atol=atol, cross_device=cross_device,
                            ulps=judging.ulps, oracle=judging.run, oracle_factor=judging.factor)
    if buffers is not None:
        result.leaves += buffers.leaves(module, exact=False, rtol=rtol, atol=atol, cross_device=cross_device,
                                        ulps=judging.ulps)
    result.mutated_inputs = _mutations(before, (args, kwargs))
    result.max_abs_error = max((leaf.max_abs_error for leaf in result.leaves), default=0.0)
    result.max_rel_error = max((leaf.max_rel_error for leaf in result.leaves), default=0.0)
    result.mean_abs_error, result.mean_rel_error = error_means(want, output)
    result.unverified = [f"{leaf.path}: {leaf.message}" for leaf in result.leaves if not leaf.compared]
    if not result.unverified:
        nothing = nothing_to_compare([want, *call.buffers_after.values()] if buffers is not None else want)
        result.unverified = [nothing] if nothing else []
    result.passed = result.status == "pass"
    del output
    if references is None or timing is None:
        return None
    reference = references.get(call.state_index, training)
    reference.train(training)
    ref_args, ref_kwargs = call.fresh_inputs(device, dtype)
    try:
        with call_context(call, device):
            # interleaved, on inputs of their own: load on a shared machine hits both alike
            ref_run = capture.entry_point(reference)
            ref_t, cand_t = time_pair(lambda: ref_run(*ref_args, **ref_kwargs), lambda: run(*args, **kwargs),
                                      device, timing)
    except Exception as error:  # timing is a bonus; the verdict stands
        result.reference_ms = result.candidate_ms = None
        return f"timing call {call.index} failed: {type(error).__name__}: {error}"
    result.reference_ms, result.candidate_ms = ref_t.median_ms, cand_t.median_ms
    result.timing = json_safe({"reference": timing_summary(ref_t), "candidate": timing_summary(cand_t),
                               **compare_timings(timing_summary(ref_t), timing_summary(cand_t))})
    return None


@dataclass
class _Judging:
    """How :func:`verify` judges floating outputs beyond ``rtol``/``atol``: ULP tolerances, the float64
    oracle (made per recorded state from the reference module, as the reference runs), its factor."""

    ulps: UlpTolerance | None = None
    oracle: bool = False
    factor: float | None = None
    run: OracleRun | None = None  # the current call's oracle
    copies: dict[int, Float64Oracle] = field(default_factory=dict)

    def with_oracle(self, references: _References, call: Call, device: torch.device, dtype: torch.dtype | None,
                    training: bool) -> _Judging:
        """This judging with ``call``'s float64 oracle (the reference in float64 on the call's inputs,
        under its recorded RNG state). When the run is cast to another dtype than the recording, the
        oracle rule measures the reference's own error in that dtype: the reference runs too."""
        if not self.oracle:
            return self
        reference = references.get(call.state_index, training)
        # one float64 copy at a time; afresh for a training-mode call, whose run changes its buffers
        if call.state_index not in self.copies or (training and has_buffers(reference)):
            self.copies = {call.state_index: Float64Oracle(reference)}
        args, kwargs = call.fresh_inputs(device, dtype)
        run = self.copies[call.state_index].run(args, kwargs, context=lambda: call_context(call, device),
                                                training=training)
        if dtype is not None and run.outputs is not None:
            reference.train(training)
            args, kwargs = call.fresh_inputs(device, dtype)
            with call_context(call, device), torch.no_grad():
                run.reference = reference(*args, **kwargs)
        return _Judging(self.ulps, self.oracle, self.factor, run, self.copies)


@dataclass
class _Traced:
    """The candidate as verify built it, for running one call again under an op trace."""

    module: torch.nn.Module
    spec: Candidate
    built_with: str
    load_state: bool

    def fresh(self, capture: Capture, state_index: int, device: torch.device, dtype: torch.dtype | None,
              training: bool) -> torch.nn.Module:
        """The candidate in the call's recorded state: a training-mode call changed its buffers."""
        if not (training and has_buffers(self.module)):
            return self.module
        module = self.module
        if self.built_with == "from_original":
            module, _ = build_candidate(self.spec, capture, state_index)
        elif self.load_state:
            load_state_strict(module, capture.fresh_state_dict(state_index))
        module.to(device)
        return module.to(dtype) if dtype is not None else module


def _divergence(candidate: _Traced, references: _References, call: Call, device: torch.device,
                dtype: torch.dtype | None, rule: DivergenceRule, training: bool, notes: list[str]) -> Divergence | None:
    """The rebuilt reference and the candidate run again on ``call`` under op traces, and located."""
    try:
        module = candidate.fresh(references.capture, call.state_index, device, dtype, training)
        reference = references.get(call.state_index, training)
        reference.train(training)
        args, kwargs = call.fresh_inputs(device, dtype)
        with call_context(call, device):
            run_reference = references.capture.entry_point(reference)  # a method capture: that method
            _, expected, reference_error = trace_call(reference, lambda: run_reference(*args, **kwargs))
        module.train(training)
        args, kwargs = call.fresh_inputs(device, dtype)
        with call_context(call, device):
            run_candidate = references.capture.entry_point(module)
            _, actual, candidate_error = trace_call(module, lambda: run_candidate(*args, **kwargs))
    except Exception as error:  # the verdict stands; only its explanation is missing
        notes.append(f"locating the first divergence of call {call.index} failed: {type(error).__name__}: {error}")
        return None
    divergence = locate(expected, actual, rule, compared="the candidate against the rebuilt reference")
    for side, stopped in (("reference", reference_error), ("candidate", candidate_error)):
        if stopped is not None:
            divergence.notes.append(f"the {side}'s trace stopped early: {stopped}")
    return divergence


def _output_dtypes(capture: Capture, calls: Sequence[int] | None) -> set[torch.dtype]:
    """The dtypes the checked calls' floating outputs have here (the run's, when ``load`` cast them)."""
    positions = range(len(capture.calls)) if calls is None else calls
    dtypes = {leaf.dtype for position in positions for leaf in pytree.tree_leaves(capture.calls[position].output)
              if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()}
    return {capture.dtype} | dtypes if capture.dtype is not None else dtypes


def _shapes(call: Call) -> str:
    """The dtypes and shapes of a call's tensor inputs: calls with equal ones do the same work."""
    return ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
                     for t in pytree.tree_leaves(call.inputs) if isinstance(t, torch.Tensor))


class _References:
    """The original module for timing, in the state each call needs, without disturbing the capture.

    The capture's own module serves when there is one recorded state and the call cannot change
    buffers; otherwise one private copy is kept and given each recorded state from fresh mappings.
    """

    def __init__(self, capture: Capture, device: torch.device, dtype: torch.dtype | None) -> None:
        self.capture, self.device, self.dtype = capture, device, dtype
        self._private: torch.nn.Module | None = None
        self._private_state: int | None = None

    def get(self, state_index: int, training: bool) -> torch.nn.Module:
        capture = self.capture
        private = len(capture.metadata.get("states", [])) > 1 or (training and has_buffers(capture.module))
        if not private:
            return working_module(capture, state_index, device=self.device, dtype=self.dtype)
        if self._private is None:
            self._private = working_module(capture, state_index, device=self.device, dtype=self.dtype, private=True)
        elif self._private_state != state_index or training:
            load_pristine_state(self._private, capture, state_index)
        self._private_state = state_index
        return self._private
