"""Replay every capture of a fidelity run in this (fresh) process; print one JSON object.

Usage: ``python fidelity_replay.py <repo> <manifest.json> [--trust-source]`` where the manifest maps a label (the
module type) to a capture ref. Run by tests/restore/test_fidelity.py in a subprocess.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any


def replay_one(ref: str, repo: str, trust_source: bool = False) -> dict[str, Any]:
    import modulelens

    start = time.perf_counter()
    try:
        capture = modulelens.load(ref, repo=repo, trust_source=trust_source)
        report = capture.replay()
    except Exception as error:  # reported per module type, never hides the others
        return {"ref": ref, "status": "ERROR", "error": f"{type(error).__name__}: {error}",
                "trace": traceback.format_exc(limit=3)}
    leaves = [leaf for call in report.calls for leaf in call.leaves]
    return {
        "ref": ref, "status": report.status, "mode": report.mode, "calls": len(report.calls),
        "tensor_leaves": sum(leaf.kind == "tensor" and leaf.compared for leaf in leaves),
        "leaves": len(leaves), "class": capture.module_class,
        "mutated_leaves": sum(leaf.kind == "tensor" and leaf.compared and "(after the call)" in leaf.path
                              for leaf in leaves),
        "unrecorded": [u["path"] for u in capture.metadata.get("unrecorded", [])], "seconds": round(time.perf_counter() - start, 3),
        "report": str(report),
    }


def main() -> None:
    repo, manifest = sys.argv[1], sys.argv[2]
    trust_source = "--trust-source" in sys.argv[3:]  # classes of the user's own scripts (docs/security.md)
    with open(manifest) as handle:
        refs: dict[str, str] = json.load(handle)
    preloaded = sorted(name for name in sys.modules if name.startswith(("fidelity_models", "transformers")))
    results = {label: replay_one(ref, repo, trust_source) for label, ref in refs.items()}
    print(json.dumps({"preloaded": preloaded, "results": results}))


if __name__ == "__main__":
    main()
