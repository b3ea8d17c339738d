"""Run in a fresh process by the tests: load captures and replay them, print JSON results."""

from __future__ import annotations

import json
import sys

import modulelens


def main() -> None:
    repo = sys.argv[1]
    results = {}
    for ref in sys.argv[2:]:
        try:
            capture = modulelens.load(ref, repo=repo)
            report = capture.replay()
            results[ref] = {"passed": report.passed, "mode": report.mode, "calls": len(report.calls),
                            "class": type(capture.module).__name__, "text": str(report)}
        except Exception as error:  # reported to the test, which names the module
            results[ref] = {"passed": False, "error": f"{type(error).__name__}: {error}"}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
