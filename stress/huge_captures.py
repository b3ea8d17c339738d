"""Captures too big for a page, made in seconds: the inputs of the UI's size rows (stress/ui_rows.py),
its tests (tests/ui/test_limits.py) and its benchmark (benchmarks/bench_ui.py).

A real small capture (``nn.Linear(4, 4)``, one call: ``stress.hostile.make_base_capture``) is saved, then its ``capture.json`` is
rewritten the way a long job or a wide module would have written it: 50,000 calls (each with its
own input and output tensor entries, all pointing at the one stored payload, as equal tensors
would), one call whose output is a list of a million leaves, or 3,000 stored reports. The
metadata stays valid: the repo checks it on every read, so a page sees what a real capture of
that size would give it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import modulelens
from stress.hostile import make_base_capture

MATHTEXT = "$" + "\\sqrt{" * 60 + "x" + "}" * 60 + "$"  # deep mathtext: matplotlib errors or spins on it


def capture_of(repo: modulelens.Repo, name: str, build: Callable[[], torch.nn.Module], x: torch.Tensor,
               **options: Any) -> str:
    """Capture ``build()`` (its constructor recorded), target ``0`` of a ``Sequential``, called once on
    ``x``; ``options`` go to :func:`modulelens.capture` (``payload=`` for shape-only outputs). Returns the ref."""
    torch.manual_seed(0)
    handle = modulelens.track_init()
    try:
        model = torch.nn.Sequential(build())
    finally:
        handle.stop()
    with modulelens.capture(model, targets=["0"], repo=repo, name=name, strict=True, **options) as cap:
        model(x)
    return cap.saved[0].ref


def rewrite(repo: modulelens.Repo, ref: str, edit: Any) -> None:
    """Rewrite the metadata of ``ref`` with ``edit(meta)`` and the name's listing after it."""
    name, version = repo.resolve(ref)
    path = repo.version_path(name, version) / "capture.json"
    meta = json.loads(path.read_text())
    edit(meta)
    os.chmod(path, 0o644)
    path.write_text(json.dumps(meta))
    repo.rebuild_summary(name)


def many_calls(repo: modulelens.Repo, name: str = "huge/calls", calls: int = 50_000) -> str:
    """A capture of ``calls`` recorded calls, each with tensor entries of its own."""
    ref = make_base_capture(repo, name)

    def edit(meta: dict[str, Any]) -> None:
        first = meta["calls"][0]
        input_id, output_id = first["inputs"]["leaves"][0]["id"], first["output"]["leaves"][0]["id"]
        tensors = meta["tensors"]
        made = []
        for i in range(calls):
            call = json.loads(json.dumps(first))
            call["index"] = i
            for leaf, source in ((call["inputs"]["leaves"][0], input_id), (call["output"]["leaves"][0], output_id)):
                tid = f"c{i}_{source}"
                tensors[tid] = dict(tensors[source])
                leaf["id"] = tid
            made.append(call)
        meta["calls"] = made

    rewrite(repo, ref, edit)
    return ref


def many_leaves(repo: modulelens.Repo, name: str = "huge/leaves", leaves: int = 1_000_000) -> str:
    """A capture whose one call returned a list of ``leaves`` leaves (numbers, and every 1,000th
    the recorded output tensor)."""
    ref = make_base_capture(repo, name)

    def edit(meta: dict[str, Any]) -> None:
        output = meta["calls"][0]["output"]
        tensor = output["leaves"][0]
        output["leaves"] = [tensor if i % 1000 == 0 else i for i in range(leaves)]
        output["spec"] = {"type": "builtins:list", "context": {"value": None}, "children": ["*"] * leaves}

    rewrite(repo, ref, edit)
    return ref


def many_reports(repo: modulelens.Repo, ref: str, count: int = 3_000) -> None:
    """``count`` profile and verify reports stored with ``ref`` (written as the tools write them)."""
    name, version = repo.resolve(ref)
    folder = repo.version_path(name, version) / "reports"
    folder.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for i in range(count):
        kind = "profile" if i % 2 else "verify"
        created = f"{stamp[:-3]}{i % 60:02d}Z"  # in the file name too, as the tools write it (newest first reads it there)
        data: dict[str, Any] = {"kind": kind, "created": created, "ref": ref}
        if kind == "profile":
            data.update(latency={"median_ms": 1.0 + i % 7, "p10_ms": 0.9, "p90_ms": 1.2, "iterations": 20},
                        memory={"peak_bytes": 1 << 20}, device="cpu", mode="eval",
                        top_ops=[{"name": "aten::addmm", "self_ms_per_iter": 0.5, "percent": 50.0}],
                        batch_sweep=[{"batch_size": b, "median_ms": 0.1 * b, "p10_ms": 0.1 * b, "p90_ms": 0.1 * b,
                                      "throughput_per_s": 10.0, "achieved_flops_per_s": 1e9} for b in (1, 8)])
        else:
            data.update(candidate="cands.py:Fast", passed=True, calls=[{"index": 0, "passed": True,
                                                                     "max_abs_error": 0.0, "max_rel_error": 0.0}])
        (folder / f"{kind}-{created}-{i:08x}.json").write_text(json.dumps(data, indent=1))


def mathtext_reports(repo: modulelens.Repo, ref: str) -> None:
    """Profile reports whose every text a plot shows (title, device, mode, dates) is deep mathtext."""
    repo.add_report(ref, "profile", {
        "ref": MATHTEXT, "device": MATHTEXT, "mode": MATHTEXT, "latency": {"median_ms": 1.0, "p10_ms": 1.0,
                                                                             "p90_ms": 1.0, "iterations": 3},
        "batch_sweep": [{"batch_size": b, "median_ms": 0.5 * b, "p10_ms": 0.5 * b, "p90_ms": 0.5 * b,
                         "throughput_per_s": 1.0, "achieved_flops_per_s": 1e9, "flops": 1e6} for b in (1, 8)],
        "arithmetic_intensity": 2.0, "achieved_flops_per_s": 1e9, "bytes_moved": {"total": 1e6}})
    name, version = repo.resolve(ref)
    folder = repo.version_path(name, version) / "reports"
    (folder / "profile-20261201T000000Z-mathtext.json").write_text(json.dumps({
        "kind": "profile", "created": "2026" + MATHTEXT, "ref": MATHTEXT,
        "latency": {"median_ms": 2.0, "p10_ms": 2.0, "p90_ms": 2.0, "iterations": 3}}))


def huge_repo(root: Path, *, calls: int = 50_000, leaves: int = 1_000_000, reports: int = 3_000) -> dict[str, str]:
    """A repo with one capture of each size; returns ``{"calls", "leaves", "reports", "mathtext"}`` refs."""
    repo = modulelens.Repo(root)
    refs = {"calls": many_calls(repo, calls=calls), "leaves": many_leaves(repo, leaves=leaves),
            "reports": make_base_capture(repo, "huge/reports"), "mathtext": make_base_capture(repo, "huge/mathtext")}
    many_reports(repo, refs["reports"], reports)
    mathtext_reports(repo, refs["mathtext"])
    return refs
