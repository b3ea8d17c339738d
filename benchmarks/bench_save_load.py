"""Save and load-to-runnable of a module with 1 GiB of weights: modulelens vs torch.save/torch.load
and safetensors, measured in the same run.

    python benchmarks/bench_save_load.py [--gib 1.0] [--repeat 3] [--width 4096]

--width sets the layers' width, and so the number of weight files for the same size (one blob per
weight matrix: 16 a GiB at 4096, 64 at 2048): issue 37 wants the load flat in it.

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
import os
import shutil
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
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--width", type=int, default=4096)
    args = parser.parse_args()
    width = args.width
    depth = Big.depth_for(args.gib, width)
    modulelens.track_init()
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
        weights.COPY_BUDGET = 1 << 62
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
        for r in range(args.repeat):
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
            # the best-practice recipe: build on the meta device, memory-map the file, assign
            with torch.device("meta"):
                m = Big(width, depth)
            m.load_state_dict(torch.load(work / "w.pt", weights_only=True, mmap=True), assign=True)
            return m

        def load_st_mmap() -> nn.Module:
            # the same recipe with safetensors: load_file memory-maps the file, assign keeps the maps
            with torch.device("meta"):
                m = Big(width, depth)
            m.load_state_dict(safetensors.torch.load_file(str(work / "w.safetensors")), assign=True)
            return m

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
        to_runnable = {**interleaved(slow, args.repeat), **interleaved(fast, 5 * args.repeat)}
        with_forward = interleaved({k: (lambda f=f: f()(x)) for k, f in loaders.items()}, args.repeat)
        rows_load = {k: (median(to_runnable[k]), median(with_forward[k])) for k in loaders}
        file_only = median(timed(load_torch_file_only, args.repeat))
    finally:
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
    report("save_load", f"save / load-to-runnable, {nbytes / 2**30:.2f} GiB of fp32 weights ({depth}x Linear({width}))",
           rows, ["tool", "save_s", "save_best_s", "load_to_runnable_s", "load_plus_forward_s"],
           {"weight_bytes": nbytes, "repeat": args.repeat, "torch_load_file_only_s": file_only, "ratios": ratios})
    for key, value in ratios.items():
        print(f"{key}: {value:.3g}")


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
