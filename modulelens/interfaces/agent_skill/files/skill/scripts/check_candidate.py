#!/usr/bin/env python3
"""Replay a capture, verify a candidate against it and profile it (modulelens agent skill helper).

Usage: python check_candidate.py NAME [--candidate FILE.py:Class] [--repo DIR] [--device DEV] [--no-profile]

Prints one compact JSON summary, verdict first:

    {"passed": false, "ref": "ranker/mlp:v3",
     "replay": {"passed": true, "mode": "bit-exact", "calls": 2},
     "verify": {"passed": false, "speedup": 1.4, "failures": ["call 0: output[0]: max abs err 0.02 > ..."]},
     "profile": {"median_ms": 0.41, "p10_ms": 0.39, "p90_ms": 0.45, "peak_bytes": 1048576, "flops": 2.1e9}}

Exit code 0 when the replay (and the verification, if any) passed, 1 when one did not, and the
failing command's own exit code when a step could not run (2 unknown capture or bad option,
3 corrupt capture, 4 the module cannot be rebuilt). Each step is `python -m modulelens ... --json`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

MAX_FAILURES = 5


def run(python: str, args: list[str]) -> dict[str, Any]:
    """One CLI step: its JSON envelope plus ``exit_code``."""
    proc = subprocess.run([python, "-m", "modulelens", *args, "--json"], capture_output=True, text=True)
    try:
        envelope = json.loads(proc.stdout)
    except ValueError:  # not JSON: the interpreter could not start modulelens at all
        envelope = {"ok": False, "error": {"message": (proc.stderr or proc.stdout).strip()[-400:]}}
    envelope["exit_code"] = proc.returncode
    return envelope


def replay_summary(step: dict[str, Any]) -> dict[str, Any]:
    if not step["ok"]:
        return {"passed": False, "error": step["error"]["message"]}
    r = step["result"]
    failed = [f"call {c['index']}: {c['error'] or c['status']}" for c in r["calls"] if not c["passed"]]
    return {"passed": r["passed"], "status": r.get("status"), "mode": r["mode"], "calls": len(r["calls"]),
            "failures": failed[:MAX_FAILURES], "cannot_verify": r.get("unverified", [])[:MAX_FAILURES]}


def verify_summary(step: dict[str, Any]) -> dict[str, Any]:
    if not step["ok"]:
        return {"passed": False, "error": step["error"]["message"]}
    r = step["result"]
    return {"passed": r["passed"], "status": r.get("status"), "speedup": r["speedup"],
            "failures": r["failures"][:MAX_FAILURES], "more_failures": max(len(r["failures"]) - MAX_FAILURES, 0),
            "cannot_verify": r.get("unverified", [])[:MAX_FAILURES]}


def profile_summary(step: dict[str, Any]) -> dict[str, Any]:
    if not step["ok"]:
        return {"error": step["error"]["message"]}
    r = step["result"]
    return {"median_ms": r["latency"]["median_ms"], "p10_ms": r["latency"]["p10_ms"],
            "p90_ms": r["latency"]["p90_ms"], "peak_bytes": r["memory"].get("peak_bytes"),
            "flops": r["flops"]["total"]}


def parse(argv: list[str]) -> tuple[str, dict[str, str | None], bool] | None:
    if not argv or argv[0].startswith("-"):
        return None
    options: dict[str, str | None] = {"--candidate": None, "--repo": None, "--device": None}
    profile = True
    it = iter(argv[1:])
    for arg in it:
        if arg in options:
            options[arg] = next(it, None)
        elif arg == "--no-profile":
            profile = False
        else:
            return None
    return argv[0], options, profile


def main(argv: list[str]) -> int:
    parsed = parse(argv)
    if parsed is None:
        print(__doc__, file=sys.stderr)
        return 2
    ref, options, profile = parsed
    common = [f for key in ("--repo", "--device") if options[key] for f in (key, options[key] or "")]
    python = os.environ.get("MODULELENS_PYTHON", sys.executable)
    summary: dict[str, Any] = {"passed": False, "ref": ref}
    steps = [run(python, ["replay", ref, *common])]
    summary["replay"] = replay_summary(steps[0])
    if options["--candidate"]:
        steps.append(run(python, ["verify", ref, "--candidate", options["--candidate"] or "", *common]))
        summary["verify"] = verify_summary(steps[-1])
    if profile:
        summary["profile"] = profile_summary(run(python, ["profile", ref, "--no-store", *common]))
    summary["passed"] = summary["replay"]["passed"] and summary.get("verify", {"passed": True})["passed"]
    print(json.dumps(summary, indent=1))
    broken = next((s["exit_code"] for s in steps if not s["ok"] and s["exit_code"] not in (0, 1)), None)
    return broken if broken is not None else (0 if summary["passed"] else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
