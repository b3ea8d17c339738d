"""Tensor tables for people and agents: shape, dtype, device and summary statistics.

Shared by the Jupyter HTML rendering (``html.py``), the IPython magics, the MCP server and the web
UI. Rows are plain JSON-ready dicts, built from a capture's metadata plus its memory-mapped tensors
(no decoding of call values is needed, so a capture whose inputs hold exotic types still renders).
Statistics come from the one statistics function, :func:`modulelens.format.shape_only.tensor_stats`;
:func:`tensor_summary` adds a histogram and, for big tensors, computes both from a sample of the
memory-mapped payload (:func:`value_sample`) so that a multi-GB tensor is never read whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from modulelens.errors import ModulelensError
from modulelens.format.tree import leaf_paths

if TYPE_CHECKING:
    import torch

    from modulelens.restore.calls import Call
    from modulelens.tools.recorded import RecordedTensors

# Statistics read every element; above this many elements they are skipped (the table says so).
MAX_STATS_NUMEL = 1 << 24
# tensor_summary reads at most this many elements of a tensor: 64 evenly spaced runs of 4,096 (1 MiB
# of float32). Statistics and a 40-bin histogram of 262,144 values are as good as of all of them for a
# page (the mean's standard error is std/512), and computing them is what a capture page spends its
# time on: at 1,048,576 per tensor, a 1 GiB capture's page took 4x as long (benchmarks/bench_ui.py).
SAMPLE_ELEMENTS = 1 << 18
_SAMPLE_RUNS = 64
HISTOGRAM_BINS = 40


def display_stats(capture: RecordedTensors, tid: str) -> dict[str, object] | None:
    """Statistics of recorded tensor ``tid`` for a table, or ``None`` when it is empty, shape-only
    or over :data:`MAX_STATS_NUMEL` elements (reading it all would make a summary slow)."""
    from modulelens.format.shape_only import tensor_stats

    entry = capture.metadata["tensors"][tid]
    numel = 1
    for size in entry["shape"]:
        numel *= size
    if entry.get("shape_only"):
        return entry.get("stats")
    if numel == 0 or numel > MAX_STATS_NUMEL:
        return None
    return tensor_stats(capture.tensor(tid), quantiles=False)


def tensor_row(capture: RecordedTensors, tid: str, label: str, *, stats: bool = True) -> dict[str, object]:
    """One table row for recorded tensor ``tid`` (device is where it lived in the original job)."""
    entry = capture.metadata["tensors"][tid]
    row: dict[str, Any] = {"path": label, "kind": "tensor", "id": tid, "shape": list(entry["shape"]),
                           "dtype": entry["dtype"], "device": entry.get("device", "cpu"), "nbytes": entry["nbytes"],
                           "shape_only": bool(entry.get("shape_only")), "stats": None}
    if stats:
        try:
            row["stats"] = display_stats(capture, tid)
        except ModulelensError as error:  # a damaged payload must not break a summary
            row["stats_error"] = str(error)
    return row


def tree_rows(
    capture: RecordedTensors, tree: Mapping[str, Any] | None, prefix: str, *, stats: bool = True,
    paths: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Rows for every leaf of an encoded call tree (``prefix`` is ``"inputs"`` or ``"output"``).

    ``paths`` names the leaves instead of :func:`~modulelens.format.tree.leaf_paths` (which imports
    the container types the tree names; the web UI passes names read from the JSON alone)."""
    if tree is None:
        return []
    rows = []
    for path, leaf in zip(paths if paths is not None else leaf_paths(tree, prefix), tree["leaves"], strict=True):
        if isinstance(leaf, dict) and leaf.get("$type") == "tensor":
            rows.append(tensor_row(capture, leaf["id"], path, stats=stats))
        elif isinstance(leaf, dict) and leaf.get("$type") == "unrecorded":
            rows.append({"path": path, "kind": "unrecorded", "type": leaf.get("class"), "reason": leaf.get("reason")})
        else:
            rows.append({"path": path, "kind": "value", "value": _short_value(leaf)})
    return rows


def _short_value(leaf: object) -> object:
    if isinstance(leaf, (bool, int, float, str)) or leaf is None:
        return leaf
    text = repr(leaf)
    return text if len(text) <= 80 else text[:77] + "..."


def call_rows(call: Call, *, stats: bool = True) -> dict[str, list[dict[str, object]]]:
    """``{"inputs": rows, "outputs": rows}`` for one recorded call."""
    return {"inputs": tree_rows(call.capture, call.input_tree, "inputs", stats=stats),
            "outputs": tree_rows(call.capture, call.output_tree, "output", stats=stats)}


def state_rows(
    capture: RecordedTensors, index: int = 0, *, stats: bool = True, limit: int | None = None
) -> list[dict[str, object]]:
    """Rows for the parameters and buffers of recorded state ``index`` (first ``limit`` only)."""
    states = capture.metadata.get("states", [])
    if not states:
        return []
    state = states[index]
    entries = [(n, e["tensor"], "parameter") for n, e in state["parameters"].items()]
    entries += [(n, e["tensor"], "buffer") for n, e in state["buffers"].items()]
    rows = []
    for name, tid, role in entries[:limit] if limit is not None else entries:
        row = tensor_row(capture, tid, name, stats=stats)
        row["role"] = role
        rows.append(row)
    return rows


def sample_runs(numel: int, limit: int = SAMPLE_ELEMENTS) -> list[tuple[int, int]]:
    """``(start, length)`` of the runs of consecutive elements that sample a flat tensor of ``numel``
    elements: all of it when it has at most ``limit``, else 64 evenly spaced runs of ``limit // 64``.

    Runs, not a stride: a memory map or a file is read by the page, and a stride of a few elements
    would read every page.
    """
    if numel <= limit:
        return [(0, numel)]
    runs = min(_SAMPLE_RUNS, limit)
    run = limit // runs
    step = (numel - run) / (runs - 1) if runs > 1 else 0
    return [(round(i * step), run) for i in range(runs)]


def value_sample(tensor: torch.Tensor, limit: int = SAMPLE_ELEMENTS) -> torch.Tensor:
    """The values of ``tensor`` as one flat tensor: all of them when there are at most ``limit``,
    else a sample of about ``limit`` that reads only the parts it takes (:func:`sample_runs` of a
    contiguous tensor; any other layout, a view, row by row).

    Example::

        value_sample(torch.arange(10.0), limit=4).numel()   # 4 (two runs of 2 here)
    """
    import torch

    numel = tensor.numel()
    if numel <= limit:
        return tensor.detach().reshape(-1)
    if tensor.is_contiguous():
        flat = tensor.detach().view(-1)
        return torch.cat([flat[start:start + length] for start, length in sample_runs(numel, limit)])
    rows = tensor.shape[0]
    count = min(rows, _SAMPLE_RUNS, limit)
    picks = torch.linspace(0, rows - 1, count, dtype=torch.float64).round().to(torch.int64).tolist()
    return torch.cat([value_sample(tensor[i], max(1, limit // count)) for i in picks])


def histogram(values: torch.Tensor, bins: int = HISTOGRAM_BINS) -> dict[str, object] | None:
    """Counts of the finite ``values`` in ``bins`` equal bins between their min and max.

    Returns:
        ``{"low", "high", "counts", "total", "min", "max"}``: the bins span ``low`` to ``high``;
        ``min``/``max`` are the values' own (booleans: two bins, False and True, with ``labels``;
        integers with a range narrower than ``bins``: one bin per integer), or ``None`` when no
        value is finite.
    """
    import torch

    flat = values.detach().reshape(-1)
    if flat.dtype == torch.bool:
        true = int(flat.sum())
        return {"low": 0, "high": 1, "counts": [flat.numel() - true, true], "total": flat.numel(),
                "min": 0, "max": 1, "labels": ["False", "True"]}
    if flat.dtype.is_complex:
        flat = torch.view_as_real(flat).reshape(-1)
    flat = flat.to(torch.float64)
    flat = flat[torch.isfinite(flat)]
    if not flat.numel():
        return None
    low, high = smallest, largest = float(flat.min()), float(flat.max())
    if not values.dtype.is_floating_point and not values.dtype.is_complex and high - low + 1 <= bins:
        bins = int(high - low + 1)  # one bin per integer value
        low, high = low - 0.5, high + 0.5
    elif low == high:
        low, high, bins = low - 0.5, high + 0.5, 1
    counts = torch.histc(flat, bins=bins, min=low, max=high)
    return {"low": low, "high": high, "counts": [int(c) for c in counts.tolist()], "total": int(flat.numel()),
            "min": smallest, "max": largest}


def shared_histograms(first: torch.Tensor, second: torch.Tensor,
                      bins: int = HISTOGRAM_BINS) -> tuple[dict[str, object] | None, dict[str, object] | None]:
    """:func:`histogram` of two tensors' finite values over the same bins (from the smaller of
    their minimums to the larger of their maximums), so they can be drawn over each other (the web
    UI's diff). A tensor without a finite value has ``None``.

    Example::

        a, b = shared_histograms(torch.randn(1000), torch.randn(1000) + 1)
        a["low"] == b["low"] and len(a["counts"]) == len(b["counts"])   # True
    """
    import torch

    flats = [_finite(values) for values in (first, second)]
    present = [flat for flat in flats if flat.numel()]
    if not present:
        return None, None
    low = smallest = min(float(flat.min()) for flat in present)
    high = largest = max(float(flat.max()) for flat in present)
    whole = all(not v.dtype.is_floating_point and not v.dtype.is_complex for v in (first, second))
    if whole and high - low + 1 <= bins:
        bins, low, high = int(high - low + 1), low - 0.5, high + 0.5  # one bin per integer value
    elif low == high:
        low, high, bins = low - 0.5, high + 0.5, 1
    found: list[dict[str, Any] | None] = []
    for flat in flats:
        if not flat.numel():
            found.append(None)
            continue
        counts = torch.histc(flat, bins=bins, min=low, max=high)
        found.append({"low": low, "high": high, "counts": [int(c) for c in counts.tolist()], "total": int(flat.numel()),
                      "min": float(flat.min()), "max": float(flat.max()), "span_min": smallest, "span_max": largest})
    return found[0], found[1]


def _finite(values: torch.Tensor) -> torch.Tensor:
    """The finite values of ``values`` as one flat float64 tensor (booleans as 0 and 1, complex as
    their real and imaginary parts)."""
    import torch

    flat = values.detach().reshape(-1)
    if flat.dtype.is_complex:
        flat = torch.view_as_real(flat).reshape(-1)
    flat = flat.to(torch.float64)
    return flat[torch.isfinite(flat)]


def tensor_summary(capture: RecordedTensors, tid: str, *, bins: int = HISTOGRAM_BINS, limit: int = SAMPLE_ELEMENTS,
                   sample: Callable[[str, int], torch.Tensor] | None = None) -> dict[str, object]:
    """Statistics and a histogram of recorded tensor ``tid``, from a sample when it is big.

    Args:
        capture: the capture.
        tid: the tensor's id.
        bins: histogram bins.
        limit: at most this many elements are read (:func:`sample_runs`).
        sample: reads ``(tid, limit)``'s sample itself (the web UI reads a stored payload's runs
            without readahead); default :func:`value_sample` of ``capture.tensor(tid)``.

    Returns:
        ``{"stats", "histogram", "sampled", "shape_only", "error"}``: ``sampled`` is how many
        elements the numbers come from when that is fewer than all of them (``stats["numel"]``
        stays the tensor's own count); a shape-only tensor has its recorded statistics and no
        histogram; a payload that cannot be read has ``error`` (a summary never fails on it).
    """
    from modulelens.format.shape_only import tensor_stats

    entry = capture.metadata["tensors"][tid]
    summary: dict[str, Any] = {"stats": None, "histogram": None, "sampled": None,
                               "shape_only": bool(entry.get("shape_only")), "error": None}
    if summary["shape_only"]:
        summary["stats"] = entry.get("stats")
        return summary
    numel = 1
    for size in entry["shape"]:
        numel *= size
    if numel == 0:
        summary["stats"] = {"numel": 0}
        return summary
    try:
        values = sample(tid, limit) if sample is not None else value_sample(capture.tensor(tid), limit)
        stats = tensor_stats(values, quantiles=False)
    except ModulelensError as error:  # a damaged payload must not break a page
        summary["error"] = str(error)
        return summary
    stats["numel"] = numel
    summary["stats"] = stats
    summary["sampled"] = values.numel() if values.numel() < numel else None
    summary["histogram"] = histogram(values, bins)
    return summary


def describe_value(value: object) -> str:
    """A short one-line description of a bound value (``float32[4, 8] cpu``, ``tuple of 2``...)."""
    import torch

    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)} {value.device}"
    if isinstance(value, torch.nn.Module):
        return type(value).__name__
    if isinstance(value, (tuple, list)):
        inner = ", ".join(describe_value(v) for v in value[:4])
        more = ", ..." if len(value) > 4 else ""
        return f"{type(value).__name__} of {len(value)}" + (f": ({inner}{more})" if value else "")
    if isinstance(value, dict):
        keys = ", ".join(map(str, list(value)[:6]))
        return f"dict of {len(value)}" + (f": {keys}" if value else "")
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
