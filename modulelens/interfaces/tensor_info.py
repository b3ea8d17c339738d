"""Tensor tables for people and agents: shape, dtype, device and summary statistics.

Shared by the Jupyter HTML rendering (``html.py``), the IPython magics and the MCP server. Rows are
plain JSON-ready dicts, built from a capture's metadata plus its memory-mapped tensors (no decoding
of call values is needed, so a capture whose inputs hold exotic types still renders). Statistics
come from the one statistics function, :func:`modulelens.format.shape_only.tensor_stats`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from modulelens.errors import ModulelensError
from modulelens.format.tree import leaf_paths

if TYPE_CHECKING:
    from modulelens.restore.loader import Call, Capture

# Statistics read every element; above this many elements they are skipped (the table says so).
MAX_STATS_NUMEL = 1 << 24


def display_stats(capture: Capture, tid: str) -> dict[str, Any] | None:
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


def tensor_row(capture: Capture, tid: str, label: str, *, stats: bool = True) -> dict[str, Any]:
    """One table row for recorded tensor ``tid`` (device is where it lived in the original job)."""
    entry = capture.metadata["tensors"][tid]
    row: dict[str, Any] = {"path": label, "kind": "tensor", "shape": list(entry["shape"]), "dtype": entry["dtype"],
                           "device": entry.get("device", "cpu"), "stats": None}
    if stats:
        try:
            row["stats"] = display_stats(capture, tid)
        except ModulelensError as error:  # a damaged payload must not break a summary
            row["stats_error"] = str(error)
    return row


def tree_rows(
    capture: Capture, tree: dict[str, Any] | None, prefix: str, *, stats: bool = True
) -> list[dict[str, Any]]:
    """Rows for every leaf of an encoded call tree (``prefix`` is ``"inputs"`` or ``"output"``)."""
    if tree is None:
        return []
    rows = []
    for path, leaf in zip(leaf_paths(tree, prefix), tree["leaves"], strict=True):
        if isinstance(leaf, dict) and leaf.get("$type") == "tensor":
            rows.append(tensor_row(capture, leaf["id"], path, stats=stats))
        elif isinstance(leaf, dict) and leaf.get("$type") == "unrecorded":
            rows.append({"path": path, "kind": "unrecorded", "type": leaf.get("class"), "reason": leaf.get("reason")})
        else:
            rows.append({"path": path, "kind": "value", "value": _short_value(leaf)})
    return rows


def _short_value(leaf: Any) -> Any:
    if isinstance(leaf, (bool, int, float, str)) or leaf is None:
        return leaf
    text = repr(leaf)
    return text if len(text) <= 80 else text[:77] + "..."


def call_rows(call: Call, *, stats: bool = True) -> dict[str, list[dict[str, Any]]]:
    """``{"inputs": rows, "outputs": rows}`` for one recorded call."""
    return {"inputs": tree_rows(call.capture, call.input_tree, "inputs", stats=stats),
            "outputs": tree_rows(call.capture, call.output_tree, "output", stats=stats)}


def state_rows(
    capture: Capture, index: int = 0, *, stats: bool = True, limit: int | None = None
) -> list[dict[str, Any]]:
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


def describe_value(value: Any) -> str:
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
