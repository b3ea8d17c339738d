"""Capture one zoo group in this process; print one JSON object (label -> ref, label -> error).

Usage: ``python zoo_capture.py <group> <repo> [label,label,...]``. Run by tests/restore/test_zoo.py
in a subprocess (torchvision is shimmed there, never in the test process). A scenario that fails
is reported per label and does not hide the others.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
import warnings

import torch
import zoo_models

import modulelens


def capture_group(group: str, repo: str, only: set[str] | None) -> dict[str, dict[str, str]]:
    refs: dict[str, str] = {}
    errors: dict[str, str] = {}
    for scenario in zoo_models.scenarios(group, only):
        try:
            torch.manual_seed(0)
            with modulelens.track_init():
                model = scenario.build().train(scenario.train)
            root = type(model).__name__
            patterns = {label: root if t == "*root*" else t for label, t in scenario.targets.items()}
            with warnings.catch_warnings():
                warnings.simplefilter("error", modulelens.CaptureWarning)  # a dropped target is an error
                with modulelens.capture(model, targets=sorted(set(patterns.values())), repo=repo,
                                        name=f"zoo/{scenario.name}", strict=True,
                                        record=modulelens.Recording(max_calls=scenario.max_calls)) as cap:
                    scenario.drive(model)
            saved = {info.name: info.ref for info in cap.saved}
            for label, pattern in patterns.items():
                name = f"zoo/{scenario.name}" if pattern == root else f"zoo/{scenario.name}/{pattern}"
                if name in saved:
                    refs[label] = saved[name]
                else:
                    errors[label] = f"not saved (saved: {sorted(saved)})"
        except Exception as error:
            for label in scenario.targets:
                errors[label] = f"capture: {type(error).__name__}: {error}"[:2000] + "\n" + traceback.format_exc(limit=4)
    return {"refs": refs, "errors": errors}


def main() -> None:
    group, repo = sys.argv[1], sys.argv[2]
    only = set(sys.argv[3].split(",")) if len(sys.argv) > 3 and sys.argv[3] else None
    start = time.perf_counter()
    result = capture_group(group, repo, only)
    result["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
