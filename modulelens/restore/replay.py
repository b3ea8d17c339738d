"""Replay recorded calls on the rebuilt module and compare with the recorded outputs."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.utils._pytree as pytree

from modulelens.errors import CorruptCaptureError, UsageError
from modulelens.format.spec import cpu_capability
from modulelens.format.tree import flatten_with_paths, mutable_leaves
from modulelens.restore.backward import require_recorded_grads, run_backward
from modulelens.restore.buffer_check import MISSING_BUFFER, BufferCheck, starts_as_recorded
from modulelens.restore.compare import (
    LeafResult,
    UlpTolerance,
    check_ulps,
    compare,
    describe_ulps,
    nothing_to_compare,
)
from modulelens.restore.context import call_context  # noqa: F401 - tools and kernels import it from here
from modulelens.restore.divergence import Divergence, DivergenceRule, locate, trace_call
from modulelens.restore.inputs import describe_input_path

if TYPE_CHECKING:
    from modulelens.restore.calls import Call
    from modulelens.restore.loader import Capture


@dataclass
class CallReplay:
    """How one call replayed. ``status``: ``"pass"`` (every leaf compared and matching, and at least
    one of them holds a value the module could get wrong), ``"fail"`` (a leaf differs or contradicts
    its recorded statistics, or the call raised), or ``"unverified"``: nothing contradicts the
    recording, but ``unverified`` names what had no values to compare (a shape-only or unrecorded
    leaf, an output that is ``None``, empty or only NaN, a call that raised when recorded), as
    :class:`~modulelens.tools.verify.CallVerification` judges a candidate. ``passed`` is
    ``status == "pass"``."""

    call: int  # position in capture.calls
    index: int  # the module's call number in the original job
    passed: bool
    leaves: list[LeafResult] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    grad_leaves: list[LeafResult] = field(default_factory=list)  # replay(backward=True)
    # the first failing call of a capture recorded with its op trace: where this replay first differs
    divergence: Divergence | None = None
    unverified: list[str] = field(default_factory=list)  # why nothing here could prove the replay right

    @property
    def all_leaves(self) -> list[LeafResult]:
        return [*self.leaves, *self.grad_leaves]

    @property
    def status(self) -> str:
        if self.error is not None or not all(leaf.passed for leaf in self.all_leaves):
            return "fail"
        return "unverified" if self.unverified else "pass"

    @property
    def not_compared(self) -> list[LeafResult]:
        return [leaf for leaf in self.all_leaves if not leaf.compared]

    @property
    def worst(self) -> LeafResult | None:
        """The failing leaf furthest off (a NaN error counts as infinite; among equals, the first),
        as the call's line in ``str(report)`` and the HTML report name it; ``None`` when none fails."""
        failing = [leaf for leaf in self.all_leaves if not leaf.passed]
        return max(failing, key=_error_size) if failing else None

    def where(self) -> str | None:
        """Where the call fails: ``"<worst leaf's path>: <its message>; N more leaves differ"``
        (``str(report)``'s call line, the HTML report's detail); ``None`` when no leaf fails."""
        worst = self.worst
        if worst is None:
            return None
        more = sum(not leaf.passed for leaf in self.all_leaves) - 1
        return f"{worst.path}: {worst.message}" + (f"; {more} more leaves differ" if more else "")

    def to_dict(self) -> dict[str, object]:
        return {"call": self.call, "index": self.index, "passed": self.passed, "status": self.status,
                "error": self.error, "unverified": self.unverified, "seconds": self.seconds,
                "leaves": [leaf.to_dict() for leaf in self.leaves],
                "grad_leaves": [leaf.to_dict() for leaf in self.grad_leaves],
                "divergence": self.divergence.to_dict() if self.divergence is not None else None}


@dataclass
class ReplayReport:
    """The verdict of :func:`replay`: ``status`` is ``"PASS"`` (every call ran and matched its
    recording with something real to compare), ``"FAIL"`` (a call differs or raised) or
    ``"UNVERIFIED"``: nothing contradicts the recording, but nothing real was compared
    (``unverified`` names it: no recorded calls, outputs stored shape-only, ``None``, empty or only
    NaN). ``passed`` is true only for ``"PASS"``, as for ``verify`` (docs/tools.md)."""

    ref: str
    mode: str  # "bit-exact", "tolerance" or "within N ULPs"
    device: str
    dtype: str | None
    weights: str = "recorded"  # "recorded" (each call's recorded state) or "current" (the module as it is)
    calls: list[CallReplay] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    no_calls: str | None = None  # why no call was replayed (a capture without recorded calls)

    @property
    def status(self) -> Literal["PASS", "FAIL", "UNVERIFIED"]:
        """``"PASS"``, ``"FAIL"`` or ``"UNVERIFIED"`` (nothing failed, nothing real was compared)."""
        if any(c.status == "fail" for c in self.calls):
            return "FAIL"
        return "PASS" if self.calls and all(c.status == "pass" for c in self.calls) else "UNVERIFIED"

    @property
    def passed(self) -> bool:
        """The status is PASS: every call ran and matched, with something real to compare."""
        return self.status == "PASS"

    @property
    def unverified(self) -> list[str]:
        """Why the verdict cannot be PASS although nothing failed: one line per reason."""
        if not self.calls:
            return [self.no_calls or f"{self.ref}: no call was replayed"]
        return [f"call {c.index}: {reason}" for c in self.calls if c.status == "unverified" for reason in c.unverified]

    def to_dict(self) -> dict[str, object]:
        return {"ref": self.ref, "passed": self.passed, "status": self.status, "unverified": self.unverified,
                "mode": self.mode,
                "device": self.device, "dtype": self.dtype, "weights": self.weights, "notes": self.notes,
                "calls": [c.to_dict() for c in self.calls]}

    def __str__(self) -> str:
        weights = "recorded weights" if self.weights == "recorded" else "the module's current weights"
        lines = [f"replay {self.ref} on {self.device} ({self.mode}, {weights}): {self.status}"]
        lines.extend(f"  cannot verify: {reason}" for reason in self.unverified)
        for c in self.calls:
            status = {"pass": "pass", "fail": "FAIL", "unverified": "UNVERIFIED"}[c.status]
            lines.append(f"  call {c.index}: {status}  {_call_line(c)}")
            if c.grad_leaves:
                grads_ok = sum(leaf.passed and leaf.compared for leaf in c.grad_leaves)
                unverified = sum(leaf.passed and not leaf.compared for leaf in c.grad_leaves)
                extra = f", {unverified} NOT compared" if unverified else ""
                lines.append(f"    backward: {grads_ok}/{len(c.grad_leaves)} gradients match{extra}")
            if c.divergence is not None:
                lines.append(f"    {c.divergence.summary()}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    __repr__ = __str__


def recorded_device_type(capture: Capture) -> str:
    devices = {e.get("device", "cpu").split(":")[0] for e in capture.metadata["tensors"].values()}
    devices.discard("cpu")
    return devices.pop() if len(devices) == 1 else "cpu"


def _other_kernels(capture: Capture, device: torch.device) -> str | None:
    """Why the kernels that run here may round differently from the recorded ones (another torch,
    other CPU vector instructions, another GPU model), or ``None`` when they are the same ones.

    The same float operations give other last bits under AVX2 and AVX-512 kernels, so a bit-exact
    verdict is only true on the kernels that recorded: elsewhere a pass within tolerance is the
    true answer, and a bit-level mismatch is no regression (tests/format/test_golden_v1.py).
    """
    compiled = [path or "<root>" for path, entry in capture.metadata["module"].get("tree", {}).items()
                if entry.get("compiled")]
    if compiled:  # inductor fuses and reorders float operations: the eager module rounds differently
        return f"{', '.join(compiled[:3])} ran torch.compile'd in the job and runs eagerly here"
    recorded = capture.environment
    if recorded.get("torch") not in (None, torch.__version__):
        return f"recorded with torch {recorded['torch']}, replayed with {torch.__version__}"
    if device.type == "cpu":
        here = cpu_capability()
        if "cpu_capability" not in recorded:
            return "the capture does not say which CPU kernels recorded it (made before modulelens noted it)"
        if recorded["cpu_capability"] != here:
            return f"recorded with {recorded['cpu_capability']} CPU kernels, replayed with {here}"
    elif device.type == "cuda" and recorded.get("gpu_name") is not None:
        here = torch.cuda.get_device_name(device)
        if recorded["gpu_name"] != here:
            return f"recorded on a {recorded['gpu_name']}, replayed on a {here}"
    return None


def replay(
    capture: Capture,
    *,
    calls: Sequence[int] | None = None,
    exact: bool | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    module: torch.nn.Module | None = None,
    weights: str = "recorded",
    backward: bool = False,
    locate_divergence: bool = True,
    ulps: UlpTolerance | None = None,
) -> ReplayReport:
    """Run the module on every recorded call (or ``calls``) and compare with the recorded outputs.

    Args:
        capture: the loaded capture.
        calls: positions in ``capture.calls`` to replay (default: all).
        exact: bit-exact comparison (default: when device, dtype and kernels are unchanged: the same
            torch, CPU vector instructions or GPU model), else per-dtype tolerances; ``rtol``/``atol`` override them.
        module: run this module instead of ``capture.module`` (as it is: nothing is loaded into it).
        weights: ``"recorded"`` loads each call's recorded parameters and buffers into
            ``capture.module`` before the call; ``"current"`` runs ``capture.module`` as it is, with
            your edits to its weights (a notebook's "what does my change do to the real inputs?").
        backward: also run backward with the recorded output gradients and compare gradients.
        locate_divergence: when a call fails and the capture holds its op trace
            (``Recording(op_trace=True)``), run it again under a trace and name the first op that
            differs from the recorded job's (``CallReplay.divergence``; the first failing call only).
        ulps: compare floating outputs within this many ULPs of the recorded ones instead of
            ``rtol``/``atol`` (one number, or ``{"bfloat16": 2, "float32": 64}``). Every floating
            leaf reports its largest error in ULPs (``LeafResult.max_ulps``) whatever the rule.

    Returns:
        A :class:`ReplayReport`; ``report.status`` is ``"PASS"``, ``"FAIL"`` or ``"UNVERIFIED"``.

    Example::

        report = modulelens.load("ranker/mlp").replay()
        assert report.passed, report
    """
    if weights not in ("recorded", "current"):
        raise UsageError(f"weights={weights!r}: use 'recorded' or 'current'")
    if module is not None:
        weights = "current"
    device = capture.device or torch.device("cpu")
    cross_device = recorded_device_type(capture) != device.type
    # Recorded from sharded (DTensor) computation: its reductions ran in another order across ranks.
    sharded = bool(capture.metadata.get("distributed", {}).get("sharded"))
    other_kernels = None if cross_device else _other_kernels(capture, device)
    ulps = check_ulps(ulps)
    if exact is None:
        exact = (not cross_device and not sharded and other_kernels is None and capture.dtype is None
                 and rtol is None and atol is None and ulps is None)
    mode = "bit-exact" if exact else ("tolerance" if ulps is None else f"within {describe_ulps(ulps)}")
    report = ReplayReport(ref=capture.ref, mode=mode, device=str(device),
                          dtype=str(capture.dtype).removeprefix("torch.") if capture.dtype else None, weights=weights)
    target = module if module is not None else capture.module
    report.notes.extend(capture.notes)
    if other_kernels is not None and not exact:
        report.notes.append(f"{other_kernels}: compared within tolerance (exact=True asks for bit-exact)")
    if sharded:
        report.notes.append("recorded from sharded (DTensor) computation: compared within tolerance")
    how = _Comparison(exact=exact, rtol=rtol, atol=atol, cross_device=cross_device or sharded, ulps=ulps)
    held = capture.held_state if module is None else None  # the recorded weights the module holds, if any
    located = not locate_divergence
    selected = list(range(len(capture.calls))) if calls is None else list(calls)
    if not selected:
        report.no_calls = (f"{capture.ref} has no recorded calls to replay" if not capture.calls
                           else "no recorded call was selected (calls=[])")
    with capture.module_kept(target):  # each call's state loaded in turn, then the module as it was
        for position in selected:
            first = not report.calls
            result = _replay_call(capture, position, target, device, how, weights=weights, backward=backward,
                                  reload=first)
            report.calls.append(result)
            if result.status == "fail" and result.error is None and result.leaves and not located:
                located = True
                _locate(capture, position, target, how, weights, result, report.notes)
    if weights == "current":
        report.notes[:0] = _several_states_note(capture, report, held)
    not_compared = sorted({leaf.kind for c in report.calls for leaf in c.not_compared if leaf.kind != MISSING_BUFFER})
    if not_compared:
        report.notes.append(f"some outputs had no recorded values ({', '.join(not_compared)}) and were NOT "
                            "compared: the replay ran, but those leaves are unverified")
    return report


def _error_size(leaf: LeafResult) -> float:
    return math.inf if math.isnan(leaf.max_abs_error) else leaf.max_abs_error


def _call_line(c: CallReplay) -> str:
    """What one call's line says after its verdict: the error it raised; else the leaf furthest off,
    by path, with how many more differ (its error leads only where it is a number: a structure or
    value mismatch has none, and "max abs err 0" read as a match); else how many leaves matched."""
    if c.error is not None:
        return c.error
    worst, where = c.worst, c.where()
    if worst is not None and where is not None:
        size = f"max abs err {worst.max_abs_error:.3g}  " if worst.max_abs_error != 0 else ""
        return size + where
    worst_abs = max((leaf.max_abs_error for leaf in c.all_leaves), default=0.0)
    if c.status == "unverified" and not c.not_compared:  # every leaf matched, and proves nothing (None, NaN)
        return f"max abs err {worst_abs:.3g}  " + "; ".join(c.unverified)
    detail = f"{len(c.all_leaves) - len(c.not_compared)} leaves match"
    if c.not_compared:
        kinds = sorted({leaf.kind for leaf in c.not_compared})
        why = ": no recorded values" if MISSING_BUFFER not in kinds else ""
        detail += f"; {len(c.not_compared)} NOT compared ({', '.join(kinds)}{why})"
    return f"max abs err {worst_abs:.3g}  {detail}"


def _several_states_note(capture: Capture, report: ReplayReport, held: int | None) -> list[str]:
    """Why a replay with one set of weights fails calls recorded with others: a capture taken during
    training holds the weights of each recorded call (the optimizer changed them in between), and
    only the calls of one state can match the module's current weights, edited or not."""
    by_state: dict[int, list[int]] = {}
    for replayed in report.calls:
        by_state.setdefault(capture.calls[replayed.call].state_index, []).append(replayed.index)
    if len(by_state) < 2 or report.status != "FAIL":
        return []
    holds = (f"the module holds the weights of calls {', '.join(map(str, by_state.get(held, [])))}, so the other calls "
             "differ even without an edit" if held is not None else "the calls of at most one of them can match")
    return [f"these calls were recorded with {len(by_state)} different weight states (a capture taken while "
            f"training: calls by state {by_state}) and replayed with the module's current weights: {holds}; "
            "replay with the recorded weights (no --current-weights / weights='recorded'), or compare the calls "
            "of one state (calls=[...], --calls)"]


@dataclass(frozen=True)
class _Comparison:
    """How :func:`replay` compares a call's results with the recording."""

    exact: bool
    rtol: float | None
    atol: float | None
    cross_device: bool
    ulps: UlpTolerance | None = None

    def leaves(self, expected: object, actual: object, synthetic: bool) -> list[LeafResult]:
        return compare(expected, actual, exact=self.exact, rtol=self.rtol, atol=self.atol,
                       cross_device=self.cross_device, synthetic=synthetic, ulps=self.ulps)


def _replay_call(capture: Capture, position: int, target: torch.nn.Module, device: torch.device, how: _Comparison,
                 *, weights: str, backward: bool, reload: bool) -> CallReplay:
    """Run recorded call ``position`` on ``target`` and compare; errors go into the result, not up."""
    call = capture.calls[position]
    result = CallReplay(call=position, index=call.index, passed=False)
    if not call.finished:  # as verify judges it: nothing recorded to compare, not a wrong replay
        result.unverified.append("the recorded call raised in the original job: no output to compare")
        return result
    grads_wanted = backward and call.has_backward
    if backward and not call.has_backward:
        asked = capture.metadata.get("capture", {}).get("backward") is True
        why = call.backward_missing or ("none reached it in the job: no output of it required grad, or no backward "
                                        "ran through one" if asked else "capture with record=Recording(backward=True)")
        result.error = f"no backward was recorded for this call ({why})"
        return result
    try:
        if weights == "recorded":  # the first call reloads: edits through .data keep version counters
            capture.use_state(call.state_index, force=reload)
        args, kwargs = call.fresh_inputs(capture.device, capture.dtype)
        if grads_wanted:
            args, kwargs = require_recorded_grads((args, kwargs), call)
        # the buffers after the call say something only where the run starts from the recorded ones
        buffers = BufferCheck(capture, call, target) if call.vmap is None and (
            weights == "recorded" or (call.buffers_after and starts_as_recorded(capture, call, target))) else None
        with call.context(target, weights=False):
            start = time.perf_counter()
            output = run_call(capture, call, target, args, kwargs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            result.seconds = time.perf_counter() - start
            buffer_leaves = [] if buffers is None else buffers.leaves(
                target, exact=how.exact, rtol=how.rtol, atol=how.atol, cross_device=how.cross_device, ulps=how.ulps)
            if grads_wanted:
                expected_grads, actual_grads = run_backward(call, target, (args, kwargs), output, device)
    except Exception as error:  # report, don't crash: the next call may still work
        result.error = f"{type(error).__name__}: {error}"
        return result
    synthetic = call.shape_only_in("inputs")
    result.leaves = how.leaves(call.output, output, synthetic)
    result.leaves += _compare_mutated(call, (args, kwargs), exact=how.exact, rtol=how.rtol, atol=how.atol,
                                      cross_device=how.cross_device, synthetic=synthetic, ulps=how.ulps)
    result.leaves += buffer_leaves
    if grads_wanted:
        grad_leaves = how.leaves(expected_grads, actual_grads, synthetic or call.shape_only_in("backward.output_grads"))
        result.grad_leaves = [_rename(leaf) for leaf in grad_leaves]
    # a leaf with no recorded values (shape-only, unrecorded) can contradict the recording, never prove it
    result.unverified = [f"{leaf.path}: {leaf.message}" for leaf in result.all_leaves if not leaf.compared]
    if not result.unverified:  # None matches None, NaN matches NaN: a match that proves nothing
        # the buffers after the call count only where they were compared (the run started from the
        # recorded ones): a metric's update, replayed on other running states, returns None and proves nothing
        recorded = [call.output, *(call.mutated_inputs or {}).values(),
                    *(call.buffers_after.values() if buffers is not None else ()),
                    *([expected_grads] if grads_wanted else [])]
        nothing = nothing_to_compare(recorded)
        result.unverified = [nothing] if nothing else []
    result.passed = result.status == "pass"
    return result


def run_call(capture: Capture, call: Call, module: torch.nn.Module, args: tuple[object, ...],
             kwargs: dict[str, object]) -> object:
    """Run ``module`` on one recorded call's inputs as the job ran it: ``module(...)``, its recorded
    method (``capture.entry_point``), or for a call recorded inside ``torch.func.vmap`` (an ensemble)
    under vmap again, each member with its slice of the module's stacked weights, as
    ``functional_call`` over ``stack_module_state``'s weights ran it (an unbatched member computes
    other last bits than the batched kernels)."""
    batched = call.vmap
    if batched is None:
        return capture.entry_point(module)(*args, **kwargs)
    if capture.method is not None:
        raise UsageError(f"{capture.ref}: a call of {capture.method}() inside torch.func.vmap cannot be replayed "
                         "(functional_call runs module(...))")
    from torch.func import functional_call, vmap

    state = {**dict(module.named_parameters(remove_duplicate=False)),
             **dict(module.named_buffers(remove_duplicate=False))}
    state_dims = {name: 0 if name in batched["state"] else None for name in state}
    input_dims = _batch_dims((args, kwargs), batched["inputs"])
    out_dims = _batch_dims(call.output, batched["output"])

    def member(weights: dict[str, torch.Tensor], inputs: tuple[tuple[object, ...], dict[str, object]]) -> object:
        return functional_call(module, weights, inputs[0], inputs[1])

    return vmap(member, in_dims=(state_dims, input_dims), out_dims=out_dims,
                randomness=batched["randomness"])(state, (args, kwargs))


def _batch_dims(tree: Any, batched: list[str]) -> Any:
    """vmap's ``in_dims``/``out_dims`` for ``tree``: 0 at the leaves whose paths are ``batched``
    (stored stacked along their first dimension), ``None`` elsewhere."""
    leaves, spec = flatten_with_paths(tree)
    wanted = set(batched)
    return pytree.tree_unflatten([0 if path in wanted else None for path, _ in leaves], spec)


def _locate(capture: Capture, position: int, target: torch.nn.Module, how: _Comparison, weights: str,
            result: CallReplay, notes: list[str]) -> None:
    """Run failed call ``position`` again under an op trace and compare it with the recorded job's
    trace (docs/tools.md, "First divergence"); a capture without one gets a note saying how to record it."""
    call = capture.calls[position]
    if not call.has_op_trace:
        notes.append("this capture holds no op trace, so the first op that differs cannot be named: record with "
                     "Recording(op_trace=True) (modulelens run --op-trace)")
        return
    try:
        recorded = call.op_trace
    except CorruptCaptureError as error:  # the verdict stands; the damaged trace cannot explain it
        notes.append(f"the op trace of call {call.index} cannot be read, so the first op that differs is not named: "
                     f"{error}")
        return
    assert recorded is not None
    if weights == "recorded":
        capture.use_state(call.state_index, force=True)
    args, kwargs = call.fresh_inputs(capture.device, capture.dtype)
    try:
        with call.context(target, weights=False):
            _, replayed, stopped = trace_call(target, lambda: run_call(capture, call, target, args, kwargs))
    except Exception as error:  # the call failed a first time already: say so, keep the report
        notes.append(f"locating the first divergence of call {call.index} failed: {type(error).__name__}: {error}")
        return
    rule = DivergenceRule(exact=how.exact, rtol=how.rtol, atol=how.atol,
                          purpose="cross_device" if how.cross_device else "replay", dtype=capture.dtype)
    result.divergence = locate(recorded, replayed, rule, compared="this replay against the recorded job's trace",
                               candidate_name="this replay")
    if stopped is not None:
        result.divergence.notes.append(f"the replay's trace stopped early: {stopped}")


def _compare_mutated(call: Call, inputs: object, *, exact: bool, rtol: float | None, atol: float | None,
                     cross_device: bool, synthetic: bool, ulps: UlpTolerance | None) -> list[LeafResult]:
    """The inputs the recorded call changed in place (a cache it appended to), as they were after
    the recorded call, against the replayed inputs after the replayed call."""
    recorded = call.mutated_inputs
    if not recorded:
        return []
    replayed = dict(mutable_leaves(inputs))
    leaves: list[LeafResult] = []
    for path, after in recorded.items():
        leaves += compare(after, replayed.get(path), exact=exact, rtol=rtol, atol=atol, cross_device=cross_device,
                          synthetic=synthetic, ulps=ulps, root=f"{describe_input_path(path)}(after the call)")
    return leaves


def _rename(leaf: LeafResult) -> LeafResult:
    leaf.path = "grad" + leaf.path.removeprefix("output")
    return leaf
