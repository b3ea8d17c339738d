"""Does ``modulelens profile`` measure what a hand-written timing loop measures?

For each workload, a module is captured, reloaded, and its recorded call is timed, in alternating
rounds, by ``Capture.profile`` and by a plain ``time.perf_counter`` loop over the same module and
the same inputs in the same process. The medians should agree within 3%.

    OMP_NUM_THREADS=1 python benchmarks/bench_profile.py [--rounds 21] [--iters 50]

Prints a table and writes benchmarks/results/profile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import modulelens

RESULTS = Path(os.environ.get("MODULELENS_BENCH_RESULTS") or Path(__file__).resolve().parent / "results") / "profile.json"

WORKLOADS: dict[str, dict[str, Any]] = {
    # Iterations are kept around a millisecond or less: on a shared machine a longer iteration is
    # often preempted, and then both loops measure the scheduler rather than the module.
    "mlp 256-1024-256 b16 fwd": {"sizes": (256, 1024, 256), "batch": 16, "backward": False},
    "mlp 256-1024-256 b16 fwd+bwd": {"sizes": (256, 1024, 256), "batch": 16, "backward": True},
    "mlp 64-64-64 b8 fwd (tiny)": {"sizes": (64, 64, 64), "batch": 8, "backward": False},
    "mlp 64-64-64 b8 fwd+bwd (tiny)": {"sizes": (64, 64, 64), "batch": 8, "backward": True},
}


def build(sizes: tuple[int, int, int]) -> torch.nn.Module:
    d_in, hidden, d_out = sizes
    return torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, d_out))


def hand_loop(module: torch.nn.Module, x: torch.Tensor, backward: bool, warmup: int, iters: int) -> float:
    """The loop a person would write: median of per-iteration perf_counter times, in ms."""
    params = [p for p in module.parameters() if p.requires_grad]
    samples = []
    if not backward:
        with torch.no_grad():
            for i in range(warmup + iters):
                t0 = time.perf_counter()
                module(x)
                if i >= warmup:
                    samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples)
    x = x.detach().clone().requires_grad_(True)
    grad = None
    for i in range(warmup + iters):
        for p in params:
            p.grad = None
        x.grad = None
        t0 = time.perf_counter()
        out = module(x)
        if grad is None:
            grad = torch.ones_like(out)
        out.backward(grad)
        if i >= warmup:
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def run(rounds: int, iters: int, warmup: int) -> dict[str, Any]:
    results: dict[str, Any] = {
        "environment": {"torch": torch.__version__, "python": platform.python_version(),
                        "machine": platform.machine(), "threads": torch.get_num_threads(),
                        "load_average_at_start": list(os.getloadavg()), "cpus": os.cpu_count()},
        "rounds": rounds, "iters": iters, "warmup": warmup, "workloads": {},
    }
    with tempfile.TemporaryDirectory() as repo:
        for name, spec in WORKLOADS.items():
            torch.manual_seed(0)
            tracking = modulelens.track_init()
            try:
                model = torch.nn.ModuleDict({"mlp": build(spec["sizes"])})
            finally:
                tracking.stop()
            x = torch.randn(spec["batch"], spec["sizes"][0])
            with modulelens.capture(model, targets=["mlp"], repo=repo, name="bench"):
                model["mlp"](x)
            cap = modulelens.load("bench/mlp", repo=repo)
            module = cap.module
            inputs = cap.calls[0].fresh_inputs()[0][0]
            hand, prof = [], []
            for _ in range(rounds):  # alternate so drift on a shared machine hits both alike
                hand.append(hand_loop(module, inputs, spec["backward"], warmup, iters))
                report = modulelens.profile(cap, backward=spec["backward"], store=False,
                                            timing=modulelens.TimingConfig(warmup=warmup, iters=iters))
                prof.append(report.latency["median_ms"])
            hand_ms, prof_ms = statistics.median(hand), statistics.median(prof)
            ratios = [p / h for p, h in zip(prof, hand, strict=True)]
            print(f"  {name}: done", flush=True)
            results["workloads"][name] = {
                "hand_ms_per_round": hand, "profile_ms_per_round": prof,
                "hand_median_ms": hand_ms, "profile_median_ms": prof_ms,
                "difference_percent": 100.0 * (prof_ms - hand_ms) / hand_ms,
                "agree_within_3_percent": abs(prof_ms - hand_ms) / hand_ms < 0.03,
                # each round's profile/hand ratio pairs two adjacent measurements, cancelling slow drift
                "paired_difference_percent": 100.0 * (statistics.median(ratios) - 1),
                "paired_agree_within_3_percent": abs(statistics.median(ratios) - 1) < 0.03,
                # the fastest round is the least disturbed by other processes on a shared machine
                "hand_min_ms": min(hand), "profile_min_ms": min(prof),
                "min_difference_percent": 100.0 * (min(prof) - min(hand)) / min(hand),
                "flops": report.flops["total"],
            }
    results["load_average_at_end"] = list(os.getloadavg())
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    results = run(args.rounds, args.iters, args.warmup)
    print(f"{'workload':32} {'hand loop ms':>13} {'profile ms':>11} {'diff %':>8}  agree(<3%)"
          f" | {'paired %':>8} | {'hand min':>9} {'prof min':>9} {'diff %':>7}")
    for name, row in results["workloads"].items():
        print(f"{name:32} {row['hand_median_ms']:13.4f} {row['profile_median_ms']:11.4f} "
              f"{row['difference_percent']:8.2f}  {row['agree_within_3_percent']!s:10} | "
              f"{row['paired_difference_percent']:8.2f} | {row['hand_min_ms']:9.4f} "
              f"{row['profile_min_ms']:9.4f} {row['min_difference_percent']:7.2f}")
    print("ms: median over rounds of each round's per-iteration median; paired %: median over rounds of "
          "profile/hand - 1;\nmin: the least disturbed round of each")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
