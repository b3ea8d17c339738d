"""Save and load-to-runnable of a module with 1 GiB of weights: modulelens vs torch.save/torch.load
and safetensors, measured in the same run; then load to runnable against the mmap recipe at several
sizes and numbers of weight files, warm and cold (issue 37).

    python benchmarks/bench_save_load.py [--gib 1[,2,4]] [--files 16,64,256] [--repeat 3] [--width 4096]

The full table (every save, every load) is of the first --gib size at --width. Then, for every size
in --gib (at --width: 16 weight matrices a GiB at 4096) and for the first size split into each
count of --files weight matrices (the width that gives that size in that many layers: 1 GiB in 16,
64, 256 is widths 4096, 2048, 1024), the three loads that memory-map (the torch.load(mmap=True)
recipe, the same with safetensors, modulelens) are timed warm (files in the page cache) and cold:
each file of every contender is dropped from the page cache (posix_fadvise(POSIX_FADV_DONTNEED),
after the previous load's module is freed, so no map pins its pages) before each cold load, and the
script checks with fincore that they left it. Only one size's files exist at a time and the model
that wrote them is freed before they load (4 GiB of weights, written three ways, is 12 GiB on disk).
Targets (issue 37): load to runnable <= 1.2x the mmap recipe at 1, 2 and 4 GiB and at every count of
files; cold <= 1.0x.

save_s is the median of --repeat saves (rotating order, `sync` before each), save_best_s the best;
loads are interleaved rounds too (--repeat of them, 5x as many for the two millisecond loads).
modulelens flushes a save to the disk before returning; "safetensors + fsync" is the like-for-like
baseline, and "modulelens (no fsync)" (MODULELENS_FSYNC=0) the like-for-like row for plain safetensors.
"load to runnable" = from nothing in memory to a module object with its weights, as each user of
each tool would write it:
  * torch:        m = Model(); m.load_state_dict(torch.load(f, weights_only=True))
  * safetensors:  m = Model(); m.load_state_dict(safetensors.torch.load_file(f))
  * torch mmap:   with torch.device("meta"): m = Model()
                  m.load_state_dict(torch.load(f, weights_only=True, mmap=True), assign=True)
                  (the best-practice recipe)
  * safetensors mmap: the same recipe with safetensors.torch.load_file(f), which memory-maps the file
  * modulelens:   m = modulelens.load(ref).module      (meta-device build + memory-mapped weights)
The "+ first forward" column adds one forward pass, which touches every weight: it shows what
lazy memory mapping defers rather than saves. Files are in the page cache (warm) for every tool.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import safetensors.torch
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _common import Big, interleaved, median, report, timed

import modulelens
from modulelens.tracing import weights
from modulelens.tracing.save import save_records


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", default="1", help="GiB of weights, or several: 1,2,4 (the full table is of the first)")
    parser.add_argument("--files", default="16,64,256",
                        help="the first size split into this many weight matrices, each count timed (empty: none)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--width", type=int, default=4096)
    args = parser.parse_args()
    sizes = [float(v) for v in args.gib.split(",")]
    file_counts = [int(v) for v in args.files.split(",") if v]
    modulelens.track_init()
    rows, extra = full_table(sizes[0], args.width, args.repeat)
    # the same shape is timed once: the first size at --width is also one of the counts of files
    shapes = {(gib, args.width, Big.depth_for(gib, args.width)) for gib in sizes}
    shapes |= {(sizes[0], _width_for(sizes[0], count), count) for count in file_counts}
    loads = [load_sweep(gib, width, depth, args.repeat) for gib, width, depth in
             sorted(shapes, key=lambda shape: (shape[0], shape[2]))]
    ratios = extra["ratios"]
    for row in loads:
        if row["width"] == args.width:
            ratios[f"load_vs_mmap_recipe_{row['gib']:g}gib"] = row["load_vs_mmap_recipe"]
            ratios[f"cold_load_vs_mmap_recipe_{row['gib']:g}gib"] = row["cold_load_vs_mmap_recipe"]
        if row["gib"] == sizes[0] and row["weight_files"] in file_counts:
            ratios[f"load_vs_mmap_recipe_{row['gib']:g}gib_{row['weight_files']}files"] = row["load_vs_mmap_recipe"]
    nbytes = extra["weight_bytes"]
    report("save_load", f"save / load-to-runnable, {nbytes / 2**30:.2f} GiB of fp32 weights "
           f"({Big.depth_for(sizes[0], args.width)}x Linear({args.width}))",
           rows, ["tool", "save_s", "save_best_s", "load_to_runnable_s", "load_plus_forward_s"],
           {**extra, "width": args.width, "loads": loads, "sizes_gib": sizes, "file_counts": file_counts})
    for key, value in ratios.items():
        print(f"{key}: {value:.3g}")


def mmap_recipe(path: Path, width: int, depth: int) -> nn.Module:
    """The best-practice recipe: build on the meta device, memory-map the file, assign."""
    with torch.device("meta"):
        m = Big(width, depth)
    m.load_state_dict(torch.load(path, weights_only=True, mmap=True), assign=True)
    return m


def safetensors_mmap_recipe(path: Path, width: int, depth: int) -> nn.Module:
    """The same recipe with safetensors: ``load_file`` memory-maps the file, assign keeps the maps."""
    with torch.device("meta"):
        m = Big(width, depth)
    m.load_state_dict(safetensors.torch.load_file(str(path)), assign=True)
    return m


def _width_for(gib: float, layers: int) -> int:
    """The width at which ``layers`` x Linear(width, width) hold about ``gib`` GiB of fp32 weights."""
    return max(1, round(math.sqrt(gib * (1 << 30) / 4 / layers)))


def full_table(gib: float, width: int, repeat: int) -> tuple[list[dict], dict]:
    """Every save and every load of ``gib`` GiB at ``width``, interleaved: the rows, and the ratios."""
    depth = Big.depth_for(gib, width)
    model = Big(width, depth)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    x = torch.randn(2, width)
    state = model.state_dict()
    work = Path(tempfile.mkdtemp(prefix="ml-bench-"))
    try:
        # ------------------------------------------------------------------ save
        def fresh() -> None:
            for p in work.iterdir():
                shutil.rmtree(p) if p.is_dir() else p.unlink()

        # The timed saves write weights held in memory, as torch.save and safetensors do: the capture
        # copies them (what it does for a module under COPY_BUDGET) instead of streaming them to
        # staging files while the call runs (tracing/weights.py), and every save below encodes,
        # hashes and writes them whole. The streamed path, a big module's first save, is timed as
        # capture + forward + save by bench_scale.py.
        copy_budget, weights.COPY_BUDGET = weights.COPY_BUDGET, 1 << 62
        capture = modulelens.capture(model, targets="Big", repo=work / "repo", name="big")
        model(x)
        capture.stop()
        capture.tracer.synchronize()
        def st_durable() -> None:
            safetensors.torch.save_file(state, str(work / "w.safetensors"))
            _flush(work / "w.safetensors")

        def ml_volatile() -> None:
            os.environ["MODULELENS_FSYNC"] = "0"
            try:
                save_records(capture.tracer, work / "repo", "big")
            finally:
                del os.environ["MODULELENS_FSYNC"]

        # modulelens flushes each save to the disk before it returns (durable across power loss,
        # repo/files.py); torch.save and safetensors do not, so each gets a row with a flush too.
        savers = {
            "torch": lambda: torch.save(state, work / "w.pt"),
            "safetensors": lambda: safetensors.torch.save_file(state, str(work / "w.safetensors")),
            "safetensors + fsync": st_durable,
            "modulelens (no fsync)": ml_volatile,
            "modulelens": lambda: save_records(capture.tracer, work / "repo", "big"),  # hashing + fsync included
        }
        save_times: dict[str, list[float]] = {k: [] for k in savers}
        for r in range(repeat):
            # rotate the order and start each save with no dirty pages, so that no tool pays for
            # another's writeback
            for label in list(savers)[r % len(savers):] + list(savers)[:r % len(savers)]:
                fresh()
                os.sync()
                save_times[label] += timed(savers[label], 1)
        torch_save, st_save, ml_save = save_times["torch"], save_times["safetensors"], save_times["modulelens"]

        # ------------------------------------------------------------------ load (files kept warm)
        torch.save(state, work / "w.pt")
        safetensors.torch.save_file(state, str(work / "w.safetensors"))
        repo = modulelens.Repo(work / "repo")
        save_records(capture.tracer, repo, "big")
        capture.tracer.records.clear()  # the saved snapshot copies are no longer needed

        def load_torch() -> nn.Module:
            m = Big(width, depth)
            m.load_state_dict(torch.load(work / "w.pt", weights_only=True))
            return m

        def load_torch_file_only() -> dict:
            return torch.load(work / "w.pt", weights_only=True)

        def load_st() -> nn.Module:
            m = Big(width, depth)
            m.load_state_dict(safetensors.torch.load_file(str(work / "w.safetensors")))
            return m

        def load_torch_mmap() -> nn.Module:
            return mmap_recipe(work / "w.pt", width, depth)

        def load_st_mmap() -> nn.Module:
            return safetensors_mmap_recipe(work / "w.safetensors", width, depth)

        def load_ml() -> nn.Module:
            return modulelens.load("big", repo=repo, trust_source=True).module  # Big is this script's own class

        loaders = {"torch.load": load_torch, "safetensors": load_st, "torch.load mmap": load_torch_mmap,
                   "safetensors mmap": load_st_mmap, "modulelens": load_ml}
        for fn in loaders.values():
            fn()  # warm the page cache and imports
        # Interleaved rounds with a rotating order (garbage collected untimed before each), like
        # every other comparison here; the two loads that take milliseconds get 5x the rounds,
        # since one scheduler hiccup is a large part of 15 ms.
        slow = {k: loaders[k] for k in ("torch.load", "safetensors")}
        fast = {k: loaders[k] for k in ("torch.load mmap", "safetensors mmap", "modulelens")}
        to_runnable = {**interleaved(slow, repeat), **interleaved(fast, 5 * repeat)}
        with_forward = interleaved({k: (lambda f=f: f()(x)) for k, f in loaders.items()}, repeat)
        rows_load = {k: (median(to_runnable[k]), median(with_forward[k])) for k in loaders}
        file_only = median(timed(load_torch_file_only, repeat))
    finally:
        weights.COPY_BUDGET = copy_budget
        shutil.rmtree(work, ignore_errors=True)

    ml_s, st_s, t_s = median(ml_save), median(st_save), median(torch_save)
    st_sync, ml_nosync = save_times["safetensors + fsync"], save_times["modulelens (no fsync)"]
    ml_l = rows_load["modulelens"][0]
    rows = [
        {"tool": "torch.save / Model() + load_state_dict(torch.load())", "save_s": t_s, "save_best_s": min(torch_save),
         "load_to_runnable_s": rows_load["torch.load"][0],
         "load_plus_forward_s": rows_load["torch.load"][1]},
        {"tool": "safetensors save_file / Model() + load_state_dict(load_file())", "save_s": st_s, "save_best_s": min(st_save),
         "load_to_runnable_s": rows_load["safetensors"][0],
         "load_plus_forward_s": rows_load["safetensors"][1]},
        {"tool": "torch.load(mmap=True) + meta build + assign", "load_to_runnable_s": rows_load["torch.load mmap"][0],
         "load_plus_forward_s": rows_load["torch.load mmap"][1]},
        {"tool": "safetensors load_file + meta build + assign", "load_to_runnable_s": rows_load["safetensors mmap"][0],
         "load_plus_forward_s": rows_load["safetensors mmap"][1]},
        {"tool": "safetensors save_file + fsync", "save_s": median(st_sync), "save_best_s": min(st_sync)},
        {"tool": "modulelens, not flushed (MODULELENS_FSYNC=0)", "save_s": median(ml_nosync), "save_best_s": min(ml_nosync)},
        {"tool": "modulelens save (durable) / load(ref).module", "save_s": ml_s, "save_best_s": min(ml_save), "load_to_runnable_s": ml_l,
         "load_plus_forward_s": rows_load["modulelens"][1]},
    ]
    ratios = {
        # the disk's writeback makes single saves noisy: the best of N shows each tool's own cost
        "save_best_vs_safetensors_best": min(ml_save) / min(st_save),
        "save_vs_safetensors": ml_s / st_s,
        "save_vs_safetensors_fsync": ml_s / median(st_sync),
        "save_no_fsync_vs_safetensors": median(ml_nosync) / st_s,
        "save_vs_torch_save": ml_s / t_s,
        "load_speedup_vs_torch_load": rows_load["torch.load"][0] / ml_l,
        "load_speedup_vs_torch_load_file_only": file_only / ml_l,
        "load_speedup_vs_safetensors": rows_load["safetensors"][0] / ml_l,
        "load_vs_mmap_recipe": ml_l / rows_load["torch.load mmap"][0],
        "load_vs_safetensors_mmap_recipe": ml_l / rows_load["safetensors mmap"][0],
    }
    return rows, {"weight_bytes": nbytes, "repeat": repeat, "torch_load_file_only_s": file_only, "ratios": ratios}


def load_sweep(gib: float, width: int, depth: int, repeat: int) -> dict:
    """Load to runnable of ``depth`` x Linear(width) (about ``gib`` GiB) by the three loads that
    memory-map, warm and cold, in interleaved rounds; the model that wrote the files is freed first."""
    work = Path(tempfile.mkdtemp(prefix="ml-bench-load-"))
    try:
        model = Big(width, depth)
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        torch.save(model.state_dict(), work / "w.pt")
        safetensors.torch.save_file(model.state_dict(), str(work / "w.safetensors"))
        # a big module's first save, as users take it: weights streamed while the call runs (tracing/weights.py)
        with torch.no_grad(), modulelens.capture(model, targets="Big", repo=work / "repo", name="big"):
            model(torch.randn(2, width))
        del model
        gc.collect()
        blobs = sum(1 for path in (work / "repo").rglob("*") if path.is_file() and path.stat().st_size >= 1 << 20)

        def recipe() -> nn.Module:
            return mmap_recipe(work / "w.pt", width, depth)

        def st_recipe() -> nn.Module:
            return safetensors_mmap_recipe(work / "w.safetensors", width, depth)

        def ml() -> nn.Module:
            # a new Repo each time, as a new process has: nothing of an earlier load kept
            return modulelens.load("big", repo=modulelens.Repo(work / "repo"), trust_source=True).module

        loaders = {"torch.load mmap recipe": recipe, "safetensors mmap recipe": st_recipe, "modulelens": ml}
        for fn in loaders.values():
            fn()  # warm the page cache and imports
        warm = interleaved(loaders, 5 * repeat)
        cold_left: list[int] = []

        def evict(_label: str) -> None:
            gc.collect()  # the last load's module and its maps gone, so that its pages can leave
            _drop_from_page_cache(work)
            cold_left.append(_cached_bytes(work))

        os.sync()  # dirty pages cannot be dropped: the files written above are flushed once
        cold = interleaved(loaders, 2 * repeat, setup=evict)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    row: dict = {"gib": gib, "width": width, "weight_files": depth, "weight_bytes": nbytes,
                 "modulelens_files_over_1mib": blobs, "cold_cached_bytes_max": max(cold_left, default=None)}
    for label in loaders:
        row[f"{label} warm_s"] = median(warm[label])
        row[f"{label} cold_s"] = median(cold[label])
    row["load_vs_mmap_recipe"] = row["modulelens warm_s"] / row["torch.load mmap recipe warm_s"]
    row["load_vs_safetensors_mmap_recipe"] = row["modulelens warm_s"] / row["safetensors mmap recipe warm_s"]
    row["cold_load_vs_mmap_recipe"] = row["modulelens cold_s"] / row["torch.load mmap recipe cold_s"]
    row["cold_load_vs_safetensors_mmap_recipe"] = row["modulelens cold_s"] / row["safetensors mmap recipe cold_s"]
    print(f"{nbytes / 2**30:.2f} GiB in {depth} weight files (width {width}): load / mmap recipe "
          f"{row['load_vs_mmap_recipe']:.2f}x warm, {row['cold_load_vs_mmap_recipe']:.2f}x cold "
          f"(at most {row['cold_cached_bytes_max']} bytes left cached before a cold load)", flush=True)
    return row


def _drop_from_page_cache(root: Path) -> None:
    """Every file under ``root`` out of the page cache (clean pages that no map holds)."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _cached_bytes(root: Path) -> int:
    """Bytes of the files under ``root`` in the page cache (util-linux fincore), or -1 without it."""
    files = [str(path) for path in root.rglob("*") if path.is_file()]
    if not shutil.which("fincore") or not files:
        return -1
    listed = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *files],
                            capture_output=True, text=True, check=False)
    return sum(int(line) for line in listed.stdout.split()) if listed.returncode == 0 else -1


def _flush(path: Path) -> None:
    """fsync a file and its folder, as a durable save does."""
    for target, flags in ((path, os.O_RDONLY), (path.parent, os.O_RDONLY | os.O_DIRECTORY)):
        fd = os.open(target, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


if __name__ == "__main__":
    main()
