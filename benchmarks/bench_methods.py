"""What method targets (``vae:encode``, issue 34) cost the job, against the obvious alternatives.

    python benchmarks/bench_methods.py [--rounds 15] [--calls 200]

* **pass-through**: while a method is wrapped on its class (tracing/methods.py), every *other*
  instance of the class calls it through the wrapper (one dict lookup). ``encode`` of an untargeted
  small VAE, unwrapped vs wrapped: the ratio is that cost.
* **recording**: one recorded call of the same module through a method target (``:forward``, the
  method called directly) vs a module target (``module(...)``, forward hooks): the same record, so
  about 1.
* **parents**: ``modulelens run`` keeps each module's parent (a global registration hook) while
  it looks for roots; building a 48-block model with the hook vs without.

Interleaved rounds, medians; one thread.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _common import interleaved, median, report

import modulelens
from modulelens.tracing.methods import wrap_method
from modulelens.tracing.runner import _Parents


class SmallVAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(32, 64), nn.SiLU(), nn.Linear(64, 16))
        self.decoder = nn.Sequential(nn.Linear(16, 64), nn.SiLU(), nn.Linear(64, 32))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encode(x))


def _build_deep() -> nn.Module:
    return nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.GELU()) for _ in range(48)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    x = torch.randn(4, 32)

    # pass-through: another instance's calls while the class is wrapped for a target
    target, other = SmallVAE(), SmallVAE()

    def encode_many() -> None:
        for _ in range(args.calls):
            other.encode(x)
    handles: list = []

    def wrap_or_not(label: str) -> None:  # each round toggles the wrapper, so both see the same load
        while handles:
            handles.pop().remove()
        if label == "wrapped":
            handles.append(wrap_method(target, "encode", lambda inst, original, a, k: original(inst, *a, **k),
                                       "x:encode"))
    times = interleaved({"plain": encode_many, "wrapped": encode_many}, args.rounds, setup=wrap_or_not)
    wrap_or_not("plain")
    per_call = (median(times["wrapped"]) - median(times["plain"])) / args.calls
    rows.append({"what": "untargeted encode() while its class is wrapped", "baseline": "unwrapped",
                 "ratio": median(times["wrapped"]) / median(times["plain"]), "per call us": per_call * 1e6})

    # recording: a method target vs a module target, one recorded call each
    modulelens.track_init()
    model = SmallVAE()
    repo = tempfile.mkdtemp(prefix="bench-methods-")

    def record(targets: list[str], call: str) -> None:
        cap = modulelens.capture(model, targets, repo=repo, name="b")
        model.forward(x) if call == "method" else model(x)
        cap.stop()
    times = interleaved({"method": lambda: record([":forward"], "method"), "module": lambda: record(["."], "module")},
                        args.rounds)
    rows.append({"what": "a recorded call through ':forward' (method target)", "baseline": "'.' (forward hooks)",
                 "ratio": median(times["method"]) / median(times["module"]),
                 "per call us": (median(times["method"]) - median(times["module"])) * 1e6})

    # parents: module construction with run's registration hook on
    hooks: list[_Parents] = []

    def hook_or_not(label: str) -> None:
        while hooks:
            hooks.pop().stop()
        if label == "with":
            hooks.append(_Parents())
    built = interleaved({"without": _build_deep, "with": _build_deep}, args.rounds, setup=hook_or_not)
    hook_or_not("without")
    without, with_hook = built["without"], built["with"]
    modules = sum(1 for _ in _build_deep().modules())
    rows.append({"what": f"building a model of {modules} modules with run's parent hook", "baseline": "without",
                 "ratio": median(with_hook) / median(without),
                 "per call us": (median(with_hook) - median(without)) / modules * 1e6})
    report("bench_methods", "method targets: what they cost the job", rows,
           ["what", "baseline", "ratio", "per call us"], {"rounds": args.rounds, "calls": args.calls})


if __name__ == "__main__":
    main()
