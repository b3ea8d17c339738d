"""A small training job that captures with the Python API into ``sys.argv[1]`` and reports, as
one JSON line, how many steps it finished, what was saved where, and the capture warnings."""

from __future__ import annotations

import json
import sys
import time
import warnings

import torch

import modulelens


def main() -> None:
    modulelens.track_init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    started = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with modulelens.capture(model, targets=["0", "2"], repo=sys.argv[1], name="job", record=modulelens.Recording(max_calls=2)) as cap:
            for _ in range(6):
                optimizer.zero_grad()
                model(torch.randn(8, 64)).square().mean().backward()
                optimizer.step()
                steps += 1
    print(json.dumps({"steps": steps, "seconds": time.monotonic() - started,
                      "saved": [i.ref for i in cap.saved], "paths": [str(i.path) for i in cap.saved],
                      "records": sorted(cap.records), "warnings": [str(w.message) for w in caught
                                                               if issubclass(w.category, modulelens.CaptureWarning)]}))


if __name__ == "__main__":
    main()
