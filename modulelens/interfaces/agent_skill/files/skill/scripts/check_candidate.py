#!/usr/bin/env python3
"""Replay a capture, verify a candidate against it and profile both (modulelens agent skill helper).

Usage: python check_candidate.py NAME [--candidate FILE.py:Class] [--repo DIR] [--device DEV] [--no-profile]
Prints one JSON summary; exits 0 when the replay (and the verification, if any) passed, else 1.
Each step is the `--json` CLI (`python -m modulelens ...`), so steps the installed modulelens
lacks are reported as unavailable instead of failing the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def run(python: str, args: list[str]) -> dict[str, Any]:
    proc = subprocess.run([python, "-m", "modulelens", *args, "--json"], capture_output=True, text=True)
    try:
        envelope = json.loads(proc.stdout)
    except ValueError:
        # not JSON: e.g. a command this modulelens does not have yet ("No such command")
        return {"ok": False, "error": (proc.stderr or proc.stdout).strip()[-800:], "exit_code": proc.returncode}
    envelope["exit_code"] = proc.returncode
    return envelope


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    ref, rest = argv[0], argv[1:]
    options = {"--candidate": None, "--repo": None, "--device": None}
    profile = True
    it = iter(rest)
    for arg in it:
        if arg in options:
            options[arg] = next(it, None)
        elif arg == "--no-profile":
            profile = False
        else:
            print(json.dumps({"error": f"unknown argument {arg!r}"}))
            return 2
    common = [f for key in ("--repo", "--device") if options[key] for f in (key, options[key])]
    python = os.environ.get("MODULELENS_PYTHON", sys.executable)
    summary: dict[str, Any] = {"ref": ref}
    replay = run(python, ["replay", ref, *common])
    summary["replay"] = {"passed": bool(replay.get("ok") and replay["result"]["passed"]),
                         "result": replay.get("result"), "error": replay.get("error")}
    ok = summary["replay"]["passed"]
    if options["--candidate"]:
        verify = run(python, ["verify", ref, "--candidate", options["--candidate"], *common])
        result = verify.get("result") or {}
        summary["verify"] = {"passed": bool(verify.get("ok") and result.get("passed")), "result": result or None,
                             "error": verify.get("error")}
        ok = ok and summary["verify"]["passed"]
    if profile:
        prof = run(python, ["profile", ref, *common])
        summary["profile"] = {"result": prof.get("result"), "error": prof.get("error")}
    summary["passed"] = ok
    print(json.dumps(summary, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
