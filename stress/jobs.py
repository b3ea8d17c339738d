"""Training jobs the storage rows run: ``api REPO`` captures with the Python API; ``plain`` is an
ordinary script for ``modulelens run``. Both print ``STEPS n`` when every step is done, then
(``api``) one JSON line with what was saved, the capture warnings and the seconds the capture
block took (saving included)."""

from __future__ import annotations

import json
import sys
import time
import warnings

import torch

STEPS = 6


def _train(model: torch.nn.Module) -> int:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    done = 0
    for _ in range(STEPS):
        optimizer.zero_grad()
        model(torch.randn(4, 512)).square().mean().backward()
        optimizer.step()
        done += 1
    return done


def api(repo: str) -> None:
    import modulelens

    modulelens.track_init()
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
    started = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with modulelens.capture(model, targets=["0", "2"], repo=repo, name="job", record=modulelens.Recording(max_calls=2)) as cap:
            steps = _train(model)
    print(f"STEPS {steps}", flush=True)
    print(json.dumps({"saved": [str(i.path) for i in cap.saved], "records": sorted(cap.records),
                      "seconds": time.monotonic() - started,
                      "warnings": [str(w.message) for w in caught if issubclass(w.category, modulelens.CaptureWarning)]}))


def plain() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
    print(f"STEPS {_train(model)}", flush=True)


if __name__ == "__main__":
    api(sys.argv[2]) if sys.argv[1] == "api" else plain()
