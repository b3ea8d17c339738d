"""The repo where captures are many and small (issue 15), each against its baseline in the same run.

    python benchmarks/bench_repo.py [--rounds 7] [--quick] [--versions 2000] [--names 200]

* many small tensors: a capture of ~5,000 tensors (2,000 small parameters, 200 recorded calls x 15
  tensors), recorded for real through modulelens.capture; save (encoding + hashing + writing) and
  load (modulelens.load, then every parameter and every call's inputs and output as tensors) vs
  safetensors.torch.save_file / load_file of the same tensors.
* a repo of --versions versions under --names names: Repo.list(), show (describe one version) and
  gc --dry-run vs the floor of reading what the layout stores for them: each name's index head and
  log of entries, parsed (_common.read_index; and, for reference, every capture file as layout 1 did).
  gc again with something to free (an orphan blob), when it also reads every version's capture.json
  before deleting (issue 35), vs that floor plus reading (not parsing) every capture file.
* a fresh process: `modulelens ls --repo R` vs `python -c "import torch"`.
* the pack threshold: writing payloads as blobs of their own vs into a pack, by payload size.

Every comparison runs interleaved (the order rotates each round) and reports the median of the
rounds and the ratio of medians; results go to benchmarks/results/repo.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _common import fresh_process_env, interleaved, many_versions_repo, median, read_index, report

import modulelens
from modulelens.format.hashing import hash_bytes
from modulelens.repo.packs import build_pack, plan_packs
from modulelens.restore.summary import describe
from modulelens.tracing.save import save_records


class ManySmall(nn.Module):
    """2,000 small parameters (1,000 x Linear(32, 32)); each call takes 10 tensors, returns 5."""

    def __init__(self, features: int = 1000, dim: int = 32) -> None:
        super().__init__()
        self.proj = nn.ModuleList(nn.Linear(dim, dim) for _ in range(features))

    def forward(self, *features: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.proj[i](f) for i, f in enumerate(features[:5]))


def _rows(times: dict[str, list[float]], case: str) -> list[dict[str, Any]]:
    return [{"case": case, "contender": k, "median_s": median(v), "best_s": min(v), "rounds": len(v)}
            for k, v in times.items()]


# ------------------------------------------------------------------------------ many small tensors


def many_small(work: Path, rounds: int, calls: int = 200,
               features: int = 1000) -> tuple[list[dict[str, Any]], dict[str, float], dict[str, Any]]:
    torch.manual_seed(0)
    model = ManySmall(features)
    capture = modulelens.capture(model, targets="ManySmall", repo=work / "unused", name="small",
                                 record=modulelens.Recording(max_calls=calls))
    started = time.perf_counter()
    with torch.no_grad():
        for _ in range(calls):
            model(*[torch.randn(16, 32) for _ in range(10)])
    capture.stop()
    recorded_s = time.perf_counter() - started
    [info] = save_records(capture.tracer, work / "unused", "small")  # the timed saves below redo this
    meta = modulelens.Repo(work / "unused").read_metadata(info.name, info.version)
    loaded = modulelens.load(info.ref, repo=work / "unused")
    tensors = {}
    for tid, entry in meta["tensors"].items():
        if entry.get("payload"):  # the very tensors modulelens stores, as safetensors gets them
            tensors[tid] = loaded.tensor(tid).clone().contiguous()
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    st_file = work / "small.safetensors"
    repo_dir = work / "repo"

    def fresh(label: str) -> None:
        shutil.rmtree(repo_dir, ignore_errors=True)
        st_file.unlink(missing_ok=True)

    saves = interleaved({
        "safetensors": lambda: safetensors.torch.save_file(tensors, str(st_file)),
        "modulelens": lambda: save_records(capture.tracer, repo_dir, "small"),
    }, rounds, setup=fresh)
    safetensors.torch.save_file(tensors, str(st_file))
    save_records(capture.tracer, repo_dir, "small")
    repo = modulelens.Repo(repo_dir)

    def load_ml() -> None:
        cap = modulelens.load(info.name, repo=repo)
        cap.state_dict(0)
        for call in cap.calls:
            call.inputs  # noqa: B018 - decodes the call's tensors
            call.output  # noqa: B018

    loads = interleaved({"safetensors": lambda: safetensors.torch.load_file(str(st_file)), "modulelens": load_ml},
                        rounds)
    ratios = {
        "small_save_vs_safetensors": median(saves["modulelens"]) / median(saves["safetensors"]),
        "small_load_vs_safetensors": median(loads["modulelens"]) / median(loads["safetensors"]),
    }
    extra = {"tensors": len(tensors), "payload_bytes": nbytes, "recorded_calls": calls, "record_s": recorded_s}
    return _rows(saves, "save many small") + _rows(loads, "load many small"), ratios, extra


# ------------------------------------------------------------------------------ 2,000 versions


def many_versions(work: Path, rounds: int, versions: int, names: int) -> tuple[list[dict[str, Any]], dict[str, float]]:
    root = work / "versions-repo"
    many_versions_repo(root, versions, names)
    show_ref = f"team/model{names // 2}/block:v{versions // names // 2 or 1}"

    def floor_capture_files() -> None:
        with os.scandir(root / "names") as found:
            for entry in found:
                with os.scandir(Path(entry.path, "versions")) as vs:
                    for v in vs:
                        if v.name.isdigit():  # not the tombstones of removed versions
                            json.loads(Path(v.path, "capture.json").read_bytes())

    def floor_gc() -> None:
        read_index(root, keep=False)
        for sub in os.scandir(root / "blobs"):
            with os.scandir(sub.path) as blobs:
                for _ in blobs:
                    pass

    def floor_show() -> None:
        name, version = show_ref.split(":v")
        json.loads((root / "names" / name.replace("/", "%2F") / "versions" / version / "capture.json").read_bytes())

    # Right after the saves each summary is current but carries no key (the folders changed under a
    # second ago, repo/index.py), and reading never writes: a listing rebuilds each name's summary
    # from its folders (a stat per version, no capture file read) until a writer stores it again.
    # Listing, gc and show take milliseconds, where one scheduler hiccup is a large share: three
    # times the rounds (the fresh-process `ls` below keeps --rounds: each round imports torch).
    cheap = 3 * rounds
    unsettled = interleaved({"floor: summaries": lambda: read_index(root),
                             "Repo.list() (right after saving)": lambda: modulelens.Repo(root).list()}, cheap)
    time.sleep(1.1)  # the folders' state is trusted once it is a second old (repo/index.py)
    modulelens.Repo(root).gc(dry_run=True)  # a writer stores the summaries with their keys
    times = interleaved({
        "floor: summaries": lambda: read_index(root),
        "floor: capture files": floor_capture_files,
        "Repo.list()": lambda: modulelens.Repo(root).list(),
    }, cheap)
    gc_times = interleaved({"floor: summaries + blob scan": floor_gc,
                            "gc --dry-run": lambda: modulelens.Repo(root).gc(dry_run=True)}, cheap)

    def floor_gc_reading_captures() -> None:
        floor_gc()
        with os.scandir(root / "names") as found:
            for entry in found:
                with os.scandir(Path(entry.path, "versions")) as vs:
                    for v in vs:
                        if v.name.isdigit():
                            Path(v.path, "capture.json").read_bytes()  # read, not parsed

    # With something to free (an orphan blob, as a crashed save leaves), gc also reads every version's
    # capture.json before deleting (issue 35: the index may lie): against the floor of reading them.
    orphan = os.urandom(64)
    modulelens.Repo(root).write_blob(hash_bytes(orphan), orphan)
    freeing_times = interleaved({"floor: summaries + capture files read + blob scan": floor_gc_reading_captures,
                                 "floor: summaries + blob scan": floor_gc,
                                 "gc --dry-run, freeing": lambda: modulelens.Repo(root).gc(dry_run=True)}, cheap)
    assert modulelens.Repo(root).gc(dry_run=True).removed_blobs == 1
    show_times = interleaved({"floor: one capture file": floor_show,
                              "show": lambda: describe(modulelens.Repo(root), show_ref)}, cheap)
    env = fresh_process_env()
    fresh = {
        'python -c "import torch"': lambda: subprocess.run([sys.executable, "-c", "import torch"], check=True, env=env),
        "modulelens ls": lambda: subprocess.run([sys.executable, "-m", "modulelens", "ls", "--repo", str(root)],
                                                check=True, stdout=subprocess.DEVNULL, env=env),
    }
    for run in fresh.values():
        run()  # untimed: writes the bytecode cache, as a pip install has (fresh_process_env)
    ls_times = interleaved(fresh, rounds)
    assert len(modulelens.Repo(root).list()) == versions
    m = {k: median(v) for d in (times, gc_times, show_times, ls_times) for k, v in d.items()}
    freeing = {k: median(v) for k, v in freeing_times.items()}
    ratios = {
        "list_vs_floor_summaries": m["Repo.list()"] / m["floor: summaries"],
        "list_right_after_saving_vs_floor_summaries": (median(unsettled["Repo.list() (right after saving)"])
                                                       / median(unsettled["floor: summaries"])),
        "list_vs_floor_capture_files": m["Repo.list()"] / m["floor: capture files"],
        "gc_dry_run_vs_floor": m["gc --dry-run"] / m["floor: summaries + blob scan"],
        "gc_dry_run_vs_floor_capture_files": m["gc --dry-run"] / m["floor: capture files"],
        "gc_freeing_vs_floor_reading_captures": (freeing["gc --dry-run, freeing"]
                                                 / freeing["floor: summaries + capture files read + blob scan"]),
        "gc_freeing_vs_floor": freeing["gc --dry-run, freeing"] / freeing["floor: summaries + blob scan"],
        "show_vs_floor": m["show"] / m["floor: one capture file"],
        "ls_fresh_process_vs_import_torch": m["modulelens ls"] / m['python -c "import torch"'],
    }
    rows = (_rows(unsettled, f"list {versions} versions right after saving") + _rows(times, f"list {versions} versions")
            + _rows(gc_times, "gc --dry-run") + _rows(freeing_times, "gc --dry-run, freeing")
            + _rows(show_times, "show one version") + _rows(ls_times, "fresh process"))
    return rows, ratios


# ------------------------------------------------------------------------------ pack threshold


def threshold_sweep(work: Path, rounds: int) -> list[dict[str, Any]]:
    """Per payload: a blob of its own vs a member of a pack, for 64 payloads of each size."""
    rows = []
    for size in (4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20):
        data = [memoryview(os.urandom(size)) for _ in range(64)]
        digests = [hash_bytes(d) for d in data]

        def fresh(label: str) -> None:
            shutil.rmtree(work / "sweep", ignore_errors=True)

        def loose(digests: list[str] = digests, data: list[memoryview] = data) -> None:
            repo = modulelens.Repo(work / "sweep")
            for digest, d in zip(digests, data, strict=True):
                repo.write_blob(digest, d)

        pairs = tuple(zip(digests, data, strict=True))

        def packed(pairs: tuple[tuple[str, memoryview], ...] = pairs) -> None:
            repo = modulelens.Repo(work / "sweep")
            for plan in plan_packs(list(pairs)):
                buffer, _ = build_pack(plan)
                repo.write_blob(hash_bytes(buffer), buffer)

        times = interleaved({"own blobs": loose, "one pack": packed}, rounds, setup=fresh)
        rows.append({"payload_bytes": size, "own_blob_us": median(times["own blobs"]) / 64 * 1e6,
                     "packed_us": median(times["one pack"]) / 64 * 1e6})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="3 rounds, 400 versions under 40 names")
    parser.add_argument("--versions", type=int, default=2000)
    parser.add_argument("--names", type=int, default=200)
    parser.add_argument("--calls", type=int, default=200, help="recorded calls of the many-small-tensors capture")
    parser.add_argument("--features", type=int, default=1000, help="Linear(32, 32) layers: 2 parameters each")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.versions, args.names = 3, 400, 40
    modulelens.track_init()
    work = Path(tempfile.mkdtemp(prefix="ml-bench-repo-"))
    try:
        small_rows, small_ratios, small_extra = many_small(work, args.rounds, args.calls, args.features)
        version_rows, version_ratios = many_versions(work, args.rounds, args.versions, args.names)
        sweep = threshold_sweep(work, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios = {**small_ratios, **version_ratios}
    report("repo", f"many small tensors and {args.versions} versions (median of {args.rounds} interleaved rounds)",
           small_rows + version_rows, ["case", "contender", "median_s", "best_s", "rounds"],
           {"rounds": args.rounds, "versions": args.versions, "names": args.names, "small": small_extra,
            "threshold_sweep": sweep, "ratios": ratios, "load_average": os.getloadavg()})
    for row in sweep:
        print(f"payload {row['payload_bytes'] >> 10:>5} KiB: own blob {row['own_blob_us']:8.1f} us, "
              f"packed {row['packed_us']:8.1f} us")
    for key, value in ratios.items():
        print(f"{key}: {value:.3g}")


if __name__ == "__main__":
    main()
