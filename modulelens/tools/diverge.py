"""``modulelens diverge``: where a rewrite, or this machine's replay, first parts from the reference.

With a candidate, :func:`modulelens.verify` runs it against the recorded calls and, on the first
call that fails, both it and the rebuilt module again under an op trace; without one, a replay
compares each call with the op trace the recorded job left (``Recording(op_trace=True)``). The
locating itself is :mod:`modulelens.restore.divergence` (docs/tools.md, "First divergence").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from modulelens.errors import UsageError
from modulelens.tools.candidates import Candidate, describe_candidate
from modulelens.tools.reports import json_safe, store_report
from modulelens.tools.verify import verify

if TYPE_CHECKING:
    from modulelens.restore.divergence import Divergence
    from modulelens.restore.loader import Capture


def find_divergence(capture: Capture, candidate: Candidate | None = None, *, call: int | None = None,
                    rtol: float | None = None, atol: float | None = None, store: bool = True) -> dict[str, object]:
    """Run ``candidate`` (or a replay) on the recorded calls and name the first op that diverges.

    Args:
        capture: the loaded capture.
        candidate: a rewrite (as :func:`modulelens.verify` takes it); ``None``: replay the rebuilt
            module and compare it with the recorded job's op trace.
        call: one recorded call (its position); default: every call, the first failing one located.
        rtol, atol: override the per-dtype tolerances (ops are judged normwise by them).
        store: keep the result with the capture's version as a ``diverge`` report.

    Returns:
        The ``diverge`` result of docs/cli-json.md: ``status`` (``"PASS"``, ``"FAIL"``, or
        ``"UNVERIFIED"`` when nothing contradicts the recording but there was nothing real to
        compare: outputs stored shape-only, ``None``, only NaN, no calls; ``unverified`` says what),
        ``passed`` (true only for ``"PASS"``), per call its verdict and ``divergence`` (the first
        failing call's), and ``divergence`` (that one, or ``None``).

    Raises:
        UsageError: ``call`` is not a recorded call, or there is no candidate and no recorded op trace.
        CandidateError: the candidate cannot be found, imported or built.

    Example::

        result = find_divergence(modulelens.load("gpt/blocks.3"), "fused.py:FusedBlock")
        print(result["divergence"]["summary"])   # first divergence at mlp.c_fc aten::addmm at ...
    """
    if call is not None and not 0 <= call < len(capture.calls):
        raise UsageError(f"--call {call}: {capture.ref} has {len(capture.calls)} recorded call(s) (0 to "
                         f"{len(capture.calls) - 1})")
    calls: Sequence[int] = range(len(capture.calls)) if call is None else [call]
    if candidate is not None:
        result = _against_candidate(capture, candidate, list(calls), rtol, atol)
    elif not capture.calls:  # nothing ran, so nothing can have diverged: never a vacuous PASS
        result = _result(capture, None, "this replay against the recorded job's trace", "UNVERIFIED",
                         [f"{capture.ref} has no recorded calls to compare"], [], list(capture.notes))
    elif not any(capture.calls[position].has_op_trace for position in calls):
        raise UsageError(f"{capture.ref} holds no op trace to compare a replay with: record it with "
                         "Recording(op_trace=True) (modulelens run --op-trace), or compare a rewrite with --candidate")
    else:
        result = _against_recording(capture, list(calls), rtol, atol)
    if store:
        result["report_path"] = store_report(capture, "diverge", json_safe(result))
    return result


def _against_candidate(capture: Capture, candidate: Candidate, calls: list[int], rtol: float | None,
                       atol: float | None) -> dict[str, object]:
    report = verify(capture, candidate, rtol=rtol, atol=atol, calls=calls, timing=None, store=False)
    rows = [_row(c.call, c.index, c.status, c.error, c.divergence, c.unverified) for c in report.calls]
    notes = ([report.error] if report.error else []) + list(report.notes)
    return _result(capture, describe_candidate(candidate), "the candidate against the rebuilt reference",
                   report.status, report.unverified, rows, notes)


def _against_recording(capture: Capture, calls: list[int], rtol: float | None, atol: float | None) -> dict[str, object]:
    report = capture.replay(calls=calls, rtol=rtol, atol=atol)
    # replay judges a None, empty or all-NaN output UNVERIFIED itself (it proves nothing), as verify does
    rows = [_row(c.call, c.index, c.status, c.error, c.divergence, c.unverified) for c in report.calls]
    return _result(capture, None, f"this replay against the recorded job's trace ({report.mode})", report.status,
                   report.unverified, rows, list(report.notes))


def _row(position: int, index: int, status: str, error: str | None, divergence: Divergence | None,
         unverified: list[str]) -> dict[str, object]:
    return {"call": position, "index": index, "passed": status == "pass", "status": status, "error": error,
            "unverified": list(unverified), "divergence": divergence.to_dict() if divergence is not None else None}


def _result(capture: Capture, candidate: str | None, compared: str, status: str, unverified: list[str],
            rows: list[dict[str, object]], notes: list[str]) -> dict[str, object]:
    first = next((row["divergence"] for row in rows if row["divergence"] is not None), None)
    return json_safe({"ref": capture.ref, "candidate": candidate, "compared": compared, "status": status,
                      "passed": status == "PASS", "unverified": unverified if status == "UNVERIFIED" else [],
                      "calls": rows, "divergence": first, "notes": notes, "report_path": None})
