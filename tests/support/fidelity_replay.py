"""Replay every capture of a fidelity run in this (fresh) process; print one JSON object.

Usage: ``python fidelity_replay.py <repo> <manifest.json> [--trust-source] [--jsonl FILE]`` where the manifest maps a
label (the module type) to a capture ref. Run by tests/restore/test_fidelity.py and test_zoo.py in a subprocess, and by
the census (``python -m census``). With ``--jsonl`` each label's result is also appended to FILE as soon as it is known
(one ``{"label": ..., **result}`` line), so a caller whose replay process died (a crash in native code, a time-out)
keeps what was replayed and knows which label was in flight.
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
    stage = "load"
    try:
        capture = modulelens.load(ref, repo=repo, trust_source=trust_source)
        capture.module  # noqa: B018 - rebuilt here (lazily otherwise), so a failed rebuild is a load error
        stage = "replay"
        report = capture.replay()
    except Exception as error:  # reported per module type, never hides the others
        return {"ref": ref, "status": "ERROR", "stage": stage, "error": f"{type(error).__name__}: {error}",
                "trace": traceback.format_exc(limit=3)}
    leaves = [leaf for call in report.calls for leaf in call.leaves]
    # a wrong value, as opposed to a call that raised: a compared leaf (tensor, value, structure,
    # gradient) that does not match (the census never accepts one, census/known.py)
    differing = sum(not leaf.passed for call in report.calls for leaf in call.all_leaves)
    return {
        "ref": ref, "status": report.status, "mode": report.mode, "calls": len(report.calls), "differing": differing,
        # UNVERIFIED with every leaf compared: the outputs hold nothing to compare (None, empty, only
        # NaN, no calls), a category of its own in the census (census/outcomes.py)
        "unverified": report.unverified,
        "nothing_to_compare": report.status == "UNVERIFIED" and not any(c.not_compared for c in report.calls),
        "raised": sum(call.error is not None for call in report.calls),
        "tensor_leaves": sum(leaf.kind == "tensor" and leaf.compared for leaf in leaves),
        "leaves": len(leaves), "class": capture.module_class,
        "mutated_leaves": sum(leaf.kind == "tensor" and leaf.compared and "(after the call)" in leaf.path
                              for leaf in leaves),
        "unrecorded": [u["path"] for u in capture.metadata.get("unrecorded", [])], "seconds": round(time.perf_counter() - start, 3),
        "report": str(report),
    }


def main() -> None:
    repo, manifest = sys.argv[1], sys.argv[2]
    options = sys.argv[3:]
    trust_source = "--trust-source" in options  # classes of the user's own scripts (docs/security.md)
    jsonl = options[options.index("--jsonl") + 1] if "--jsonl" in options else None
    with open(manifest) as handle:
        refs: dict[str, str] = json.load(handle)
    preloaded = sorted(name for name in sys.modules if name.startswith(("fidelity_models", "transformers")))
    results: dict[str, dict[str, Any]] = {}
    for label, ref in refs.items():
        results[label] = replay_one(ref, repo, trust_source)
        if jsonl is not None:
            with open(jsonl, "a") as handle:
                handle.write(json.dumps({"label": label, **results[label]}) + "\n")
    print(json.dumps({"preloaded": preloaded, "results": results}))


if __name__ == "__main__":
    main()
