"""The diff page as data: a picker of two versions, then what differs between them (constructor
arguments, per-tensor weight drift, input and output statistics) with the compared tensors'
histograms drawn over each other.

Weights are compared from the memory-mapped payloads a chunk at a time
(:func:`modulelens.tools.diff.tensor_changes`); inputs and outputs by their recorded statistics,
pooled over each capture's first :data:`~.shown.DIFF_CALLS` calls. The overlaid histograms come
from a sample of each tensor (:meth:`StoredCapture.sample`, the capture page's), over shared bins
(:func:`~modulelens.interfaces.tensor_info.shared_histograms`): the first
:data:`~.shown.DIFF_OVERLAYS` rows of a table are drawn in, the others on a click. Running B's
module on A's inputs is an action (``--allow-run``): it rebuilds a module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from modulelens.errors import ModulelensError
from modulelens.format.human import human_number
from modulelens.interfaces.tensor_info import SAMPLE_ELEMENTS, shared_histograms, tree_rows
from modulelens.interfaces.ui import charts
from modulelens.interfaces.ui.repo_view import RepoView, StoredCapture
from modulelens.interfaces.ui.shown import (
    DIFF_CALLS,
    DIFF_LEAVES,
    DIFF_OVERLAYS,
    DIFF_ROWS,
    PICKER_OPTIONS,
    Window,
    as_text,
    real_number,
)
from modulelens.interfaces.value_text import argument_texts, spec_leaf_window


def picker(view: RepoView, a: str, b: str) -> dict[str, Any]:
    """The two version pickers: every version grouped by name, newest first (the name of ``a`` or
    ``b`` first), at most :data:`~.shown.PICKER_OPTIONS` of them; beyond that the fields take a
    typed ref too (``more``)."""
    by_name: dict[str, list[str]] = {}
    for info in sorted(view.versions(), key=lambda i: (i.name, -i.version)):
        by_name.setdefault(info.name, []).append(info.ref)
    chosen = [ref.partition(":")[0] for ref in (a, b) if ref]
    order = [*dict.fromkeys(n for n in chosen if n in by_name), *(n for n in by_name if n not in chosen)]
    groups, count = [], 0
    for name in order:
        refs = by_name[name][:max(PICKER_OPTIONS - count, 0)]
        if not refs:
            break
        groups.append((name, refs))
        count += len(refs)
    total = sum(len(refs) for refs in by_name.values())
    return {"groups": groups, "more": total - count, "total": total}


def diff_page(view: RepoView, a: StoredCapture, b: StoredCapture) -> dict[str, Any]:
    """Two versions side by side: constructor, per-tensor weight drift, input and output statistics,
    and the compared tensors' histograms over each other (A and B)."""
    from modulelens.tools.diff import tensor_changes

    ma, mb = a.metadata, b.metadata
    ca = (ma.get("constructions") or {}).get(ma["module"].get("construction") or "")
    cb = (mb.get("constructions") or {}).get(mb["module"].get("construction") or "")
    args_a = argument_texts(ca, ma) if ca else {}
    args_b = argument_texts(cb, mb) if cb else {}
    constructor = [{"argument": as_text(k, 200), "a": as_text(args_a.get(k, "-")), "b": as_text(args_b.get(k, "-")),
                    "changed": args_a.get(k) != args_b.get(k)} for k in dict.fromkeys([*args_a, *args_b])]
    state_a, state_b = _state_tensors(a), _state_tensors(b)
    tensors = [{**t, "max_abs": human_number(t["max_abs_diff"]), "rel": human_number(t["rel_norm"]),
                "pair": _pair(state_a.get(t["name"]), state_b.get(t["name"]))} for t in tensor_changes(a, b)]
    changed_first = sorted(tensors, key=lambda t: t["status"] == "same")[:DIFF_ROWS]  # what changed, then the rest
    pooled = [f"{c.ref}: the first {DIFF_CALLS} of {c.call_count:,} calls" for c in (a, b) if c.call_count > DIFF_CALLS]
    inputs, outputs = _drift(view, a, b, "inputs"), _drift(view, a, b, "output")
    for rows in (changed_first, inputs[:DIFF_ROWS], outputs[:DIFF_ROWS]):
        _draw_overlays(view, a, b, rows)
    return {
        "title": f"diff {a.ref} → {b.ref}", "a": a.ref, "b": b.ref,
        "class_a": as_text(ma["module"].get("class", ""), 500), "class_b": as_text(mb["module"].get("class", ""), 500),
        "constructor": constructor[:DIFF_ROWS], "constructor_missing": [r.ref for r, c in ((a, ca), (b, cb)) if not c],
        "tensors": changed_first, "tensor_count": len(tensors),
        "identical": sum(t["status"] == "same" for t in tensors),
        "inputs": inputs[:DIFF_ROWS], "outputs": outputs[:DIFF_ROWS],
        "cut": [f"{what}: {len(rows) - DIFF_ROWS:,} more rows not shown" for what, rows in
                (("constructor", constructor), ("weights", tensors), ("inputs", inputs), ("outputs", outputs))
                if len(rows) > DIFF_ROWS],
        "pooled": "; ".join(pooled), "overlays_drawn": DIFF_OVERLAYS,
    }


def overlay_of(view: RepoView, a: StoredCapture, tensor_a: str, b: StoredCapture, tensor_b: str) -> dict[str, Any]:
    """Tensor ``tensor_a`` of A and ``tensor_b`` of B, their histograms over each other (what a click
    on a diff row shows; kept per pair: versions never change).

    Raises:
        UsageError: a tensor id the capture does not have.
    """
    from modulelens.errors import UsageError

    for capture, tid in ((a, tensor_a), (b, tensor_b)):
        if tid not in capture.metadata["tensors"]:
            raise UsageError(f"{capture.ref} has no tensor {tid[:100]!r}")
    return view.drawn(("overlay", a.ref, tensor_a, b.ref, tensor_b), lambda: _overlay(a, tensor_a, b, tensor_b))


def _overlay(a: StoredCapture, tensor_a: str, b: StoredCapture, tensor_b: str) -> dict[str, Any]:
    samples = []
    for capture, tid in ((a, tensor_a), (b, tensor_b)):
        entry = capture.metadata["tensors"][tid]
        if entry.get("shape_only"):
            return {"bars": None, "sampled": "", "error": f"{capture.ref}'s tensor was stored shape-only: no values to draw"}
        try:
            samples.append(capture.sample(tid, SAMPLE_ELEMENTS))
        except ModulelensError as error:  # a damaged payload must not break the page
            return {"bars": None, "sampled": "", "error": f"cannot read {capture.ref}'s tensor: {as_text(str(error), 300)}"}
    first, second = shared_histograms(samples[0], samples[1])
    sampled = [f"{c.ref}: a sample of {s.numel():,} values" for c, s, tid in ((a, samples[0], tensor_a), (b, samples[1], tensor_b))
               if s.numel() < math.prod(c.metadata["tensors"][tid]["shape"])]
    bars = charts.overlay_bars(first, second)
    return {"bars": bars, "error": None if bars else "no finite values to draw", "sampled": "; ".join(sampled)}


def _draw_overlays(view: RepoView, a: StoredCapture, b: StoredCapture, rows: list[dict[str, Any]]) -> None:
    """The overlay of the first :data:`~.shown.DIFF_OVERLAYS` rows that have a pair of tensors;
    the others are drawn on a click (``row["pair"]`` names the two tensors)."""
    drawn = 0
    for row in rows:
        row["overlay"] = None
        if row.get("pair") and drawn < DIFF_OVERLAYS:
            row["overlay"] = overlay_of(view, a, row["pair"][0], b, row["pair"][1])
            drawn += 1


def _pair(tensor_a: str | None, tensor_b: str | None) -> tuple[str, str] | None:
    return (tensor_a, tensor_b) if tensor_a is not None and tensor_b is not None else None


def _state_tensors(capture: StoredCapture) -> dict[str, str]:
    """Parameter and buffer name -> tensor id, in the first recorded state (what the weight diff compares)."""
    states = capture.metadata.get("states") or []
    if not states:
        return {}
    return {name: entry["tensor"] for part in ("parameters", "buffers") for name, entry in states[0][part].items()}


def _pooled(view: RepoView, capture: StoredCapture, part: str) -> dict[str, dict[str, Any]]:
    """Per leaf path, statistics pooled over the first recorded calls (from each tensor's summary),
    and the tensor of the first call that has that leaf (``first``: the one drawn in the overlay)."""
    pooled: dict[str, dict[str, Any]] = {}
    for call in (capture.call(i) for i in range(min(capture.call_count, DIFF_CALLS))):
        tree = call.get("inputs" if part == "inputs" else "output")
        if not isinstance(tree, dict) or not isinstance(tree.get("leaves"), list):
            continue
        window = Window.of(len(tree["leaves"]), 1, DIFF_LEAVES)
        leaves = tree["leaves"][:window.stop]
        for row in tree_rows(capture, {"leaves": leaves}, part, stats=False,
                             paths=spec_leaf_window(tree, part, 0, window.stop)):
            if row["kind"] != "tensor":
                continue
            summary = view.summary(capture, row["id"])["stats"]
            stats = summary if isinstance(summary, dict) else {}
            into = pooled.setdefault(row["path"], {"shape": row["shape"], "dtype": row["dtype"], "n": 0, "sum": 0.0,
                                                   "sq": 0.0, "min": math.inf, "max": -math.inf, "first": row["id"]})
            numbers = {k: real_number(stats.get(k)) for k in ("mean", "std", "min", "max")}
            count = (real_number(stats.get("numel")) or 0) - (real_number(stats.get("nonfinite")) or 0)
            if any(v is None for v in numbers.values()) or count <= 0:
                continue
            mean, std = float(numbers["mean"] or 0.0), float(numbers["std"] or 0.0)
            into["n"] += count
            into["sum"] += mean * count
            into["sq"] += (std ** 2 + mean ** 2) * count
            into["min"] = min(into["min"], float(numbers["min"] or 0.0))
            into["max"] = max(into["max"], float(numbers["max"] or 0.0))
    for into in pooled.values():
        n = into.pop("n")
        total, squares = into.pop("sum"), into.pop("sq")
        into["mean"] = total / n if n else None
        into["std"] = math.sqrt(max(squares / n - (total / n) ** 2, 0.0)) if n else None
        if not n:
            into["min"] = into["max"] = None
    return pooled


def _drift(view: RepoView, a: StoredCapture, b: StoredCapture, part: str) -> list[dict[str, Any]]:
    pa, pb = _pooled(view, a, part), _pooled(view, b, part)
    rows = []
    for path in dict.fromkeys([*pa, *pb]):
        sa, sb = pa.get(path), pb.get(path)
        row: dict[str, Any] = {"path": path, "a": _described(sa), "b": _described(sb), "shift": {},
                               "pair": _pair((sa or {}).get("first"), (sb or {}).get("first"))}
        if sa and sb:
            for key in ("mean", "std", "min", "max"):
                if sa[key] is not None and sb[key] is not None:
                    row["shift"][key] = human_number(sb[key] - sa[key])
        row["changed"] = any(v not in ("0", "-") for v in row["shift"].values()) or not (sa and sb)
        rows.append(row)
    return rows


def _described(stats: Mapping[str, Any] | None) -> str:
    if stats is None:
        return "-"
    head = f"{stats['dtype']}{stats['shape']}"
    if stats["mean"] is None:
        return head
    return (f"{head} mean {human_number(stats['mean'])} std {human_number(stats['std'])} "
            f"[{human_number(stats['min'])}, {human_number(stats['max'])}]")
