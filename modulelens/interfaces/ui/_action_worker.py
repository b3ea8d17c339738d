"""The child process of a UI action: ``python -m modulelens.interfaces.ui._action_worker KIND ...``.

Replay, profile and "B on A's inputs" rebuild a module and run it, so the server never does them
itself: a crash, a hang or a kernel that takes the interpreter stays in this process, and the
pages keep answering. It loads under the repo's own trust setting (docs/security.md), exactly as
``modulelens replay REF --repo DIR`` would, and reports on stdout, one JSON object per line:
``{"stage", "done", "total"}`` while it works, then ``{"result": {...}}`` or ``{"error": ...}``.
"""

from __future__ import annotations

import argparse
import json
import sys


def _say(**fields: object) -> None:
    print(json.dumps(fields, default=str), flush=True)


def _replay(ref: str, repo: str) -> dict[str, object]:
    from modulelens.interfaces import session
    from modulelens.tools.reports import store_report

    _say(stage="loading", done=0, total=1)
    capture = session.load_capture(ref, repo)
    total = len(capture.calls)
    reports = []
    for position in range(total):  # one call at a time, so the page shows how far it is
        _say(stage=f"replaying call {position + 1} of {total}", done=position, total=total)
        reports.append(capture.replay(calls=[position]))
    if not reports:  # a capture without calls: the report says so (UNVERIFIED), as `modulelens replay` does
        reports.append(capture.replay())
    combined = reports[0]
    combined.calls = [call for report in reports for call in report.calls]
    combined.notes = list(dict.fromkeys(note for report in reports for note in report.notes))
    _say(stage="storing the report", done=total, total=total)
    data = combined.to_dict()
    path = store_report(capture, "replay", data)
    return {"ref": capture.ref, "passed": combined.passed, "status": combined.status, "report": path,
            "calls": len(combined.calls), "mode": combined.mode}


def _profile(ref: str, repo: str) -> dict[str, object]:
    from modulelens.interfaces import session
    from modulelens.tools.profile import profile

    _say(stage="loading", done=0, total=2)
    capture = session.load_capture(ref, repo)
    _say(stage="profiling call 0 and batch sizes 1, 8, 64", done=1, total=2)
    report = profile(capture, batch_sizes=[1, 8, 64], store=True)
    return {"ref": capture.ref, "median_ms": report.latency["median_ms"], "report": report.report_path,
            "peak_bytes": report.memory.get("peak_bytes"), "flops": report.flops["total"]}


def _diff(a: str, b: str, repo: str) -> dict[str, object]:
    from modulelens.interfaces import session
    from modulelens.tools.diff import diff

    _say(stage="loading", done=0, total=2)
    first, second = session.load_capture(a, repo), session.load_capture(b, repo)
    _say(stage=f"running {second.ref} on the recorded inputs of {first.ref}", done=1, total=2)
    report = diff(first, second)
    outputs = report.outputs
    # "same", not "passed": a diff is no verdict (two versions a training step apart differ as they should)
    return {"ref": first.ref, "a": first.ref, "b": second.ref, "same": bool(outputs) and all(o["same"] for o in outputs),
            "outputs": [{"call": o["index"], "same": o["same"], "max_abs_error": o["max_abs_error"], "error": o["error"]}
                        for o in outputs], "notes": report.notes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="modulelens-ui-action")
    parser.add_argument("kind", choices=("replay", "profile", "diff"))
    parser.add_argument("refs", nargs="+")
    parser.add_argument("--repo", required=True)
    args = parser.parse_args(argv)
    from modulelens.interfaces._errors import KNOWN_ERRORS, error_message

    try:
        if args.kind == "diff":
            result = _diff(args.refs[0], args.refs[1], args.repo)
        else:
            result = (_replay if args.kind == "replay" else _profile)(args.refs[0], args.repo)
    except KNOWN_ERRORS as error:
        _say(error=error_message(error))
        return 1
    _say(result=result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
