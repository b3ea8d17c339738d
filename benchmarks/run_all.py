"""Every benchmark in one run, one after another on the same machine, then one table of the
performance targets (issue 15) from what they measured.

    python benchmarks/run_all.py [--quick]

Each script runs in its own process (so one's memory and caches do not help or hurt the next) and
writes its benchmarks/results/<name>.json as usual; this runner adds benchmarks/results/all.json
(the runs: arguments, wall time, load average before and after) and prints the targets table as
Markdown, the one in the README. --quick runs each script with small sizes, to check the runner
itself; its numbers are not the README's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
RESULTS = HERE / "results"

# (script, full-size arguments, quick arguments)
RUNS: list[tuple[str, list[str], list[str]]] = [
    ("bench_save_load.py", ["--gib", "1", "--repeat", "7"], ["--gib", "0.1", "--repeat", "2"]),
    ("bench_repo.py", ["--rounds", "7"], ["--quick"]),
    ("bench_markers.py", ["--repeat", "200"], ["--mib", "8", "--repeat", "20"]),
    ("bench_recording.py", ["--steps", "20", "--rounds", "9"], ["--steps", "3", "--rounds", "3"]),
    ("bench_capture.py", [], ["--steps", "10", "--rounds", "3", "--captures", "2"]),
    ("bench_cli.py", ["--rounds", "9"], ["--rounds", "2"]),
    ("bench_profile.py", [], ["--rounds", "3", "--iters", "5"]),
    ("bench_remote.py", ["--gib", "0.25", "--repeat", "3"], ["--gib", "0.02", "--repeat", "1"]),
    ("bench_ui.py", ["--rounds", "7"], ["--rounds", "2", "--versions", "200", "--names", "20", "--gib", "0.05"]),
    ("bench_call_inputs.py", ["--rounds", "15"], ["--rounds", "3"]),
    ("bench_metadata.py", ["--rounds", "9"], ["--rounds", "2"]),
    ("bench_op_trace.py", ["--steps", "10", "--rounds", "5"], ["--steps", "2", "--rounds", "1", "--tokens", "32"]),
    ("bench_verdicts.py", ["--rounds", "7"], ["--rounds", "2", "--sizes", "4096", "--tokens", "16"]),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes: checks the runner, not the numbers")
    parser.add_argument("--only", nargs="*", help="run only these scripts (then summarize all results)")
    parser.add_argument("--tables", action="store_true", help="run nothing: print the README's tables from the results")
    args = parser.parse_args()
    if args.tables:
        print(targets_table() + "\n\n" + detail_tables())
        return
    runs = []
    for script, full, quick in RUNS:
        if args.only and script not in args.only:
            continue
        argv = quick if args.quick else full
        load_before = os.getloadavg()
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        start = time.perf_counter()
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        done = subprocess.run([sys.executable, str(HERE / script), *argv], env=env)
        runs.append({"script": script, "args": argv, "exit_code": done.returncode, "started": started,
                     "wall_s": time.perf_counter() - start, "load_before": load_before, "load_after": os.getloadavg()})
        if done.returncode != 0:
            print(f"{script} failed (exit {done.returncode})", file=sys.stderr)
    RESULTS.mkdir(exist_ok=True)
    failed = any(run["exit_code"] for run in runs)
    record = runs
    if args.only:  # the other scripts' results stay what an earlier run measured, and so does their record
        rerun, order = {run["script"] for run in runs}, [script for script, _, _ in RUNS]
        kept = [run for run in _load("all").get("runs", []) if run.get("script") in order and run["script"] not in rerun]
        record = sorted(kept + runs, key=lambda run: order.index(run["script"]))
    (RESULTS / "all.json").write_text(json.dumps({"quick": args.quick, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                                   "runs": record}, indent=1))
    print(targets_table())
    if failed:
        sys.exit(1)


def _load(name: str) -> dict[str, Any]:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def targets_table() -> str:
    """The issue-15 targets, each with what the latest results measured."""
    save_load, repo, recording = _load("save_load"), _load("repo"), _load("recording")
    sl, rp = save_load.get("ratios", {}), repo.get("ratios", {})
    rows: list[tuple[str, float | None, float]] = [
        ("many small tensors: save / safetensors `save_file`", rp.get("small_save_vs_safetensors"), 1.5),
        ("many small tensors: load / safetensors `load_file`", rp.get("small_load_vs_safetensors"), 1.5),
        ("`Repo.list()` of 2,000 versions / the floor (read every summary)", rp.get("list_vs_floor_summaries"), 1.3),
        ("`gc --dry-run` of 2,000 versions / the floor (summaries + blob scan)", rp.get("gc_dry_run_vs_floor"), 1.3),
        ("1 GiB save, durable / safetensors + fsync", sl.get("save_vs_safetensors_fsync"), 1.0),
        ("1 GiB save, unflushed (`MODULELENS_FSYNC=0`) / safetensors", sl.get("save_no_fsync_vs_safetensors"), 1.0),
        ("1 GiB load to runnable / the mmap recipe", sl.get("load_vs_mmap_recipe"), 1.1),
    ]
    for row in recording.get("rows", []):
        rows.append((f"recording, {row['model']}: modulelens / nnsight", row.get("modulelens_vs_nnsight"), 1.0))
    lines = ["| target | measured | goal | met |", "| --- | --- | --- | --- |"]
    for label, value, goal in rows:
        shown = "not run" if value is None else f"{value:.2f}×"
        met = "" if value is None else ("yes" if value <= goal else "**no**")
        lines.append(f"| {label} | {shown} | ≤ {goal}× | {met} |")
    ui = _load("ui")  # issue 26: times, not ratios
    for label, key, goal in (("UI repo page, 2,000 versions (server side)", "repo_page_s", 0.3),
                             ("UI capture page, 1 GiB capture, cold (server side)", "capture_page_cold_s", 1.0)):
        value = ui.get(key)
        shown = "not run" if value is None else _s(value)
        met = "" if value is None else ("yes" if value <= goal else "**no**")
        lines.append(f"| {label} | {shown} | ≤ {_s(goal)} | {met} |")
    return "\n".join(lines)


def _s(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds * 1e3:.1f} ms" if seconds < 0.1 else f"{seconds:.3g} s"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def detail_tables() -> str:
    """Each benchmark's table as the README shows it, from the latest results."""
    parts = []
    save_load = _load("save_load")
    if save_load:
        parts.append("save / load to runnable, 1 GiB\n" + _table(
            ["", "save (median)", "save (best)", "load to runnable", "load + first forward"],
            [[r["tool"], _s(r.get("save_s")), _s(r.get("save_best_s")), _s(r.get("load_to_runnable_s")),
              _s(r.get("load_plus_forward_s"))] for r in save_load["rows"]]))
    repo = _load("repo")
    if repo:
        parts.append("repo\n" + _table(["case", "contender", "median", "best"],
                                        [[r["case"], r["contender"], _s(r["median_s"]), _s(r["best_s"])] for r in repo["rows"]])
                     + "\n\nratios: " + ", ".join(f"{k} {v:.2f}" for k, v in repo["ratios"].items())
                     + f"\n\nload average {repo.get('load_average')}")
    recording = _load("recording")
    if recording:
        parts.append("recording\n" + _table(
            ["model", "untraced", "modulelens", "nnsight", "modulelens / untraced", "nnsight / untraced", "modulelens / nnsight"],
            [[r["model"], f"{r['untraced_ms']:.1f} ms", f"{r['modulelens_ms']:.1f} ms", f"{r['nnsight_ms']:.1f} ms",
              f"{r['modulelens_vs_untraced']:.2f}", f"{r['nnsight_vs_untraced']:.2f}", f"{r['modulelens_vs_nnsight']:.2f}"]
             for r in recording["rows"]]))
    capture = _load("capture_overhead")
    if capture:
        parts.append("training step\n" + _table(["phase", "median step", "ratio to untraced"],
                                                 [[r["phase"], f"{r['median_step_ms']:.1f} ms", f"{r['ratio_vs_untraced']:.2f}"]
                                                  for r in capture["rows"]])
                     + f"\n\nnoise band {capture.get('noise_band_before')}, construction "
                       f"{capture.get('construction_us_tracking_off', 0):.2f} / {capture.get('construction_us_tracking_on', 0):.2f} us")
    cli = _load("cli")
    if cli:
        parts.append("cli\n" + _table(["command", "median", "best", "x python -c pass", "x import torch"],
                                       [[r["command"], _s(r["median_s"]), _s(r["best_s"]), f"{r['vs_python']:.2f}",
                                         f"{r['vs_import_torch']:.3f}"] for r in cli["rows"]])
                     + f"\n\nload average {cli.get('load_average')}")
    profile = _load("profile")
    if profile:
        parts.append("profile\n" + _table(["workload", "hand loop", "profile", "difference", "paired"],
                                           [[name, f"{w['hand_median_ms']:.3f} ms", f"{w['profile_median_ms']:.3f} ms",
                                             f"{w['difference_percent']:+.1f}%", f"{w['paired_difference_percent']:+.1f}%"]
                                            for name, w in profile["workloads"].items()]))
    remote = _load("remote")
    if remote:
        parts.append("remote\n" + _table(["operation", "modulelens", "baseline", "baseline time", "ratio"],
                                          [[r["operation"], _s(r["modulelens_s"]), r["baseline"], _s(r["baseline_s"]),
                                            f"{r['ratio']:.2f}"] for r in remote["rows"]]))
    ui = _load("ui")
    if ui:
        parts.append("ui\n" + _table(["case", "contender", "median", "best"],
                                       [[r["case"], r["contender"], _s(r["median_s"]), _s(r["best_s"])] for r in ui["rows"]])
                     + "\n\nratios: " + ", ".join(f"{k} {v:.2f}" for k, v in ui["ratios"].items())
                     + f"\n\npeak memory added by the cold capture page: {ui.get('capture_page_peak_added_mib', 0):.0f} MiB; "
                       f"load average {ui.get('load_average')}")
    call_inputs = _load("call_inputs")
    if call_inputs:
        parts.append("call inputs\n" + _table(
            ["tensors", "call.args", "+ read", "reopen", "+ read", "clone", "shared", "call.args / reopen"],
            [[r["tensors"], f"{r['args_ms']:.2f} ms", f"{r['args_read_ms']:.2f} ms", f"{r['reopen_ms']:.2f} ms",
              f"{r['reopen_read_ms']:.2f} ms", f"{r['clone_ms']:.2f} ms", f"{r['shared_ms']:.3f} ms",
              f"{r['args_vs_reopen']:.2f}"] for r in call_inputs["rows"]]))
    metadata = _load("metadata")
    if metadata:
        parts.append("whole-model metadata\n" + _table(
            ["layers", "modules", "capture.json", "constructions", "tree", "save"],
            [[str(r["layers"]), str(r["modules"]), f"{r['metadata_kb']:.0f} KiB", f"{r['constructions_kb']:.0f} KiB",
              f"{r['tree_kb']:.0f} KiB", f"{r['save_ms']:.0f} ms"] for r in metadata["rows"]]))
    return "\n\n".join(parts)


if __name__ == "__main__":
    main()
