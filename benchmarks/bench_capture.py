"""Training-step time with capture active, after early stop, and with no tracing at all, measured
in one run on identical models; plus the cost of constructor tracking per module construction.

    python benchmarks/bench_capture.py [--steps 200] [--rounds 5]

Rounds alternate the untraced and the traced-after-early-stop models so that machine noise hits
both alike; the ratio is the median over rounds of (median step after early stop) / (median
untraced step).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _common import report

import modulelens
from modulelens.capture.init_tracking import stop_tracking, track_init
from modulelens.demo.model import CARDINALITIES, RecModel, synthetic_batch


def step_times(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list, steps: int) -> list[float]:
    loss_fn = nn.BCEWithLogitsLoss()
    times = []
    for i in range(steps):
        dense, sparse, labels = batches[i % len(batches)]
        start = time.perf_counter()
        optimizer.zero_grad()
        loss_fn(model(dense, sparse), labels).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times


def construction_cost(n: int = 20000) -> tuple[float, float]:
    def build() -> float:
        start = time.perf_counter()
        for _ in range(n):
            nn.Identity()
        return (time.perf_counter() - start) / n

    stop_tracking()
    off = min(build() for _ in range(3))
    handle = track_init()
    on = min(build() for _ in range(3))
    handle.stop()
    return off, on


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=512)
    args = parser.parse_args()
    torch.set_num_threads(1)
    off, on = construction_cost()

    modulelens.track_init()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    batches = [synthetic_batch(args.batch, generator) for _ in range(16)]
    base = RecModel(CARDINALITIES)
    plain, traced = copy.deepcopy(base), copy.deepcopy(base)
    opt_plain = torch.optim.Adam(plain.parameters(), lr=1e-3)
    opt_traced = torch.optim.Adam(traced.parameters(), lr=1e-3)
    step_times(plain, opt_plain, batches, 20)  # warm up both
    step_times(traced, opt_traced, batches, 20)

    targets = ["embeddings", "attention", "interaction", "top_mlp"]
    with tempfile.TemporaryDirectory() as repo:
        capture = modulelens.capture(traced, targets=targets, repo=repo, name="bench", warmup=0, max_calls=10)
        capturing = step_times(traced, opt_traced, batches, 10)  # every step records all 4 targets
        assert capture.complete and capture.tracer.active_hooks == 0
        start = time.perf_counter()
        capture.save()
        save_seconds = time.perf_counter() - start

    untraced_rounds, after_rounds = [], []
    for round_index in range(args.rounds):
        # alternate which model goes first, so slow drifts of the machine cancel out
        if round_index % 2 == 0:
            untraced_rounds.append(statistics.median(step_times(plain, opt_plain, batches, args.steps)))
            after_rounds.append(statistics.median(step_times(traced, opt_traced, batches, args.steps)))
        else:
            after_rounds.append(statistics.median(step_times(traced, opt_traced, batches, args.steps)))
            untraced_rounds.append(statistics.median(step_times(plain, opt_plain, batches, args.steps)))
    untraced = statistics.median(untraced_rounds)
    after = statistics.median(after_rounds)
    ratio_after = statistics.median(a / u for a, u in zip(after_rounds, untraced_rounds, strict=True))
    rows = [
        {"phase": "untraced", "median_step_ms": untraced * 1e3, "ratio_vs_untraced": 1.0},
        {"phase": "capturing (4 targets, every step recorded)", "median_step_ms": statistics.median(capturing) * 1e3,
         "ratio_vs_untraced": statistics.median(capturing) / untraced},
        {"phase": "after early stop", "median_step_ms": after * 1e3, "ratio_vs_untraced": ratio_after},
    ]
    report("capture_overhead", f"training step of the demo RecModel (batch {args.batch}, 1 thread)", rows,
           ["phase", "median_step_ms", "ratio_vs_untraced"],
           {"rounds": args.rounds, "steps_per_round": args.steps, "save_seconds": save_seconds,
            "construction_us_tracking_off": off * 1e6, "construction_us_tracking_on": on * 1e6,
            "ratio_after_early_stop": ratio_after})
    print(f"module construction: {off * 1e6:.2f} us untracked, {on * 1e6:.2f} us tracked")
    print(f"after early stop / untraced: {ratio_after:.4f}")


if __name__ == "__main__":
    main()
