#!/usr/bin/env python3
"""Find captures whose name or module class contains a word (modulelens agent skill helper).

Usage: python find_capture.py [WORD ...] [--repo DIR]
Prints one JSON object: {"matches": [{"ref", "module_class", "aliases", "created"}], "repo_error": null}.
Runs `python -m modulelens ls --json` with this interpreter (or $MODULELENS_PYTHON).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    words, repo = [], None
    args = iter(argv)
    for arg in args:
        if arg == "--repo":
            repo = next(args, None)
        else:
            words.append(arg.lower())
    python = os.environ.get("MODULELENS_PYTHON", sys.executable)
    command = [python, "-m", "modulelens", "ls", "--json"] + (["--repo", repo] if repo else [])
    proc = subprocess.run(command, capture_output=True, text=True)
    try:
        envelope = json.loads(proc.stdout)
    except ValueError:
        print(json.dumps({"matches": [], "repo_error": (proc.stderr or proc.stdout).strip()[-500:]}))
        return 1
    if not envelope.get("ok"):
        print(json.dumps({"matches": [], "repo_error": envelope.get("error")}))
        return envelope.get("error", {}).get("exit_code", 1)
    matches = [
        {"ref": row["ref"], "module_class": row["module_class"], "aliases": row["aliases"], "created": row["created"]}
        for row in envelope["result"]
        if all(w in row["ref"].lower() or w in row["module_class"].lower() for w in words)
    ]
    print(json.dumps({"matches": matches, "repo_error": None}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
