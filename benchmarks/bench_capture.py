"""Training-step time of one model before capture, while capturing, and after early stop; plus
the cost of constructor tracking per module construction.

    python benchmarks/bench_capture.py [--steps 100] [--rounds 20] [--captures 6]

The after/before ratio is corrected by an identical never-traced control model measured
interleaved with it in both phases (see main()).
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
from modulelens.demo.model import CARDINALITIES, RecModel, synthetic_batch
from modulelens.tracing.init_tracking import stop_tracking, track_init


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
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--captures", type=int, default=6, help="captures of 10 recorded steps (at least 2)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    off, on = construction_cost()

    modulelens.track_init()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    batches = [synthetic_batch(args.batch, generator) for _ in range(16)]
    base = RecModel(CARDINALITIES)
    # `traced` is measured before capture and after early stop; `control` (an identical copy that
    # is never traced) is measured interleaved with it in both phases. Two copies of one model
    # differ by a few percent on their own (memory placement), and the machine drifts, so the
    # overhead is the ratio of ratios: (traced/control after) / (traced/control before).
    traced, control = copy.deepcopy(base), copy.deepcopy(base)
    opt_traced = torch.optim.Adam(traced.parameters(), lr=1e-3)
    opt_control = torch.optim.Adam(control.parameters(), lr=1e-3)
    step_times(traced, opt_traced, batches, 20)  # warm up both
    step_times(control, opt_control, batches, 20)

    def paired_rounds() -> tuple[list[float], list[float]]:
        t_medians, c_medians = [], []
        for round_index in range(args.rounds):
            pair = [(traced, opt_traced, t_medians), (control, opt_control, c_medians)]
            for model, optimizer, medians in pair if round_index % 2 == 0 else reversed(pair):
                medians.append(statistics.median(step_times(model, optimizer, batches, args.steps)))
        return t_medians, c_medians

    before_t, before_c = paired_rounds()
    before = statistics.median(t / c for t, c in zip(before_t, before_c, strict=True))
    targets = ["embeddings", "attention", "interaction", "top_mlp"]
    # Several captures of 10 recorded steps, each right after 10 steps of the control: a capture's
    # ratio is its median step over the control's, corrected as the after phase is. The first
    # capture in a process is reported apart: its recorded tensors are the process's first such
    # allocations (fresh pages from the kernel; later captures reuse the memory the earlier ones
    # freed), and one capture per job is what most jobs do.
    capture_steps: list[float] = []
    capture_ratios: list[float] = []
    save_seconds: list[float] = []
    for _ in range(args.captures):
        control_median = statistics.median(step_times(control, opt_control, batches, 10))
        with tempfile.TemporaryDirectory() as repo:
            capture = modulelens.capture(traced, targets=targets, repo=repo, name="bench",
                                         record=modulelens.Recording(warmup=0, max_calls=10))
            capturing = step_times(traced, opt_traced, batches, 10)  # every step records all 4 targets
            assert capture.complete and capture.tracer.active_hooks == 0
            start = time.perf_counter()
            capture.save()
            save_seconds.append(time.perf_counter() - start)
        capture_steps.append(statistics.median(capturing))
        capture_ratios.append(capture_steps[-1] / control_median / before)
    after_t, after_c = paired_rounds()

    after = statistics.median(t / c for t, c in zip(after_t, after_c, strict=True))
    untraced = statistics.median(before_t)
    ratio_after = after / before
    rows = [
        {"phase": "before capture (untraced)", "median_step_ms": untraced * 1e3, "ratio_vs_untraced": 1.0},
        {"phase": "capturing, the process's first capture (4 targets, every step recorded)",
         "median_step_ms": capture_steps[0] * 1e3, "ratio_vs_untraced": capture_ratios[0]},
        {"phase": f"capturing, captures 2-{args.captures} (median)",
         "median_step_ms": statistics.median(capture_steps[1:]) * 1e3,
         "ratio_vs_untraced": statistics.median(capture_ratios[1:])},
        {"phase": "after early stop", "median_step_ms": statistics.median(after_t) * 1e3, "ratio_vs_untraced": ratio_after},
    ]
    hooks_left = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in traced.modules())
    report("capture_overhead", f"training step of the demo RecModel (batch {args.batch}, 1 thread)", rows,
           ["phase", "median_step_ms", "ratio_vs_untraced"],
           {"rounds": args.rounds, "steps_per_round": args.steps, "save_seconds": save_seconds,
            "construction_us_tracking_off": off * 1e6, "construction_us_tracking_on": on * 1e6,
            "ratio_after_early_stop": ratio_after, "capture_ratios": capture_ratios,
            # per-round traced/control ratios before capture: how much two identical untraced
            # models differ on this machine, i.e. the noise band of ratio_after_early_stop
            "noise_band_before": [min(t / c for t, c in zip(before_t, before_c, strict=True)),
                                  max(t / c for t, c in zip(before_t, before_c, strict=True))],
            "hooks_after_early_stop": hooks_left})
    print(f"module construction: {off * 1e6:.2f} us untracked, {on * 1e6:.2f} us tracked")
    band = [t / c for t, c in zip(before_t, before_c, strict=True)]
    print(f"after early stop / untraced: {ratio_after:.4f} (per-round traced/control before capture: "
          f"{min(band):.3f}..{max(band):.3f}; hooks left on the model: {hooks_left})")


if __name__ == "__main__":
    main()
