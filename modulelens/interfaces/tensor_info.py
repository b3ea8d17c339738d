"""Tensor tables for people and agents: shape, dtype, device and summary statistics.

Shared by the Jupyter HTML rendering (``html.py``), the IPython magics and the MCP server. Rows are
plain JSON-ready dicts, built from a capture's metadata plus its memory-mapped tensors (no decoding
of call values is needed, so a capture whose inputs hold exotic types still renders).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

if TYPE_CHECKING:
    from modulelens.restore.loader import Call, Capture

# Statistics read every element; above this many elements they are skipped (the table says so).
MAX_STATS_NUMEL = 1 << 24


def _finite(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def tensor_stats(tensor: torch.Tensor, max_numel: int = MAX_STATS_NUMEL) -> dict[str, Any] | None:
    """``{"min", "max", "mean", "std", "nan", "inf", "zeros"}`` of a tensor (finite values only for
    min/max/mean/std), or ``None`` when it is empty, too large, or not numeric."""
    numel = tensor.numel()
    if numel == 0 or numel > max_numel or tensor.device.type == "meta":
        return None
    with torch.no_grad():
        data = tensor.detach()
        if data.is_complex():
            data = data.abs()
        if data.dtype == torch.bool:
            data = data.to(torch.float64)
        elif not (data.dtype.is_floating_point or data.dtype in _INT_DTYPES):
            return None
        data = data.to("cpu", torch.float64).reshape(-1)
        finite_mask = torch.isfinite(data)
        nan = int(torch.isnan(data).sum())
        inf = int((~finite_mask).sum()) - nan
        finite = data[finite_mask]
        stats: dict[str, Any] = {"nan": nan, "inf": inf, "zeros": int((data == 0).sum())}
        if finite.numel():
            stats.update(min=_finite(float(finite.min())), max=_finite(float(finite.max())),
                         mean=_finite(float(finite.mean())),
                         std=_finite(float(finite.std())) if finite.numel() > 1 else 0.0)
        else:
            stats.update(min=None, max=None, mean=None, std=None)
    return stats


_INT_DTYPES = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}


def _leaf_paths(tree: dict[str, Any], prefix: str) -> list[str]:
    """Readable paths (``args[0]``, ``kwargs['mask']``, ``output[1]``) of an encoded tree's leaves."""
    count = len(tree["leaves"])
    try:
        from modulelens.format.tree import _decode_spec

        spec = _decode_spec(tree["spec"])
        paths = [pytree.keystr(kp) for kp, _ in pytree.tree_flatten_with_path(
            pytree.tree_unflatten(list(range(count)), spec))[0]]
        if len(paths) != count:
            raise ValueError("leaf count mismatch")
    except Exception:  # an unimportable container type: fall back to positions
        return [f"{prefix}[{i}]" for i in range(count)]
    if prefix != "inputs":
        return [prefix + p for p in paths]
    out = []
    for path in paths:  # inputs are (args, kwargs): "[0][2]" -> "args[2]", "[1]['x']" -> "kwargs['x']"
        if path.startswith("[0]"):
            out.append("args" + path[3:])
        elif path.startswith("[1]"):
            out.append("kwargs" + path[3:])
        else:
            out.append("inputs" + path)
    return out


def tensor_row(capture: Capture, tid: str, label: str, *, stats: bool = True) -> dict[str, Any]:
    """One table row for recorded tensor ``tid`` (device is where it lived in the original job)."""
    entry = capture.metadata["tensors"][tid]
    row: dict[str, Any] = {"path": label, "kind": "tensor", "shape": list(entry["shape"]), "dtype": entry["dtype"],
                           "device": entry.get("device", "cpu"), "stats": None}
    if stats:
        try:
            row["stats"] = tensor_stats(capture.tensor(tid))
        except Exception as error:  # a damaged payload must not break a summary
            row["stats_error"] = f"{type(error).__name__}: {error}"
    return row


def tree_rows(
    capture: Capture, tree: dict[str, Any] | None, prefix: str, *, stats: bool = True
) -> list[dict[str, Any]]:
    """Rows for every leaf of an encoded call tree (``prefix`` is ``"inputs"`` or ``"output"``)."""
    if tree is None:
        return []
    rows = []
    for path, leaf in zip(_leaf_paths(tree, prefix), tree["leaves"], strict=True):
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
    capture = call._capture
    return {"inputs": tree_rows(capture, call._data.get("inputs"), "inputs", stats=stats),
            "outputs": tree_rows(capture, call._data.get("output"), "output", stats=stats)}


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


def _tree_shapes(capture: Capture, tree: dict[str, Any] | None) -> str:
    if tree is None:
        return "-"
    parts = []
    for leaf in tree["leaves"][:4]:
        if isinstance(leaf, dict) and leaf.get("$type") == "tensor":
            entry = capture.metadata["tensors"][leaf["id"]]
            parts.append(f"{entry['dtype']}{entry['shape']}")
        elif isinstance(leaf, dict) and leaf.get("$type") == "unrecorded":
            parts.append(f"<unrecorded {leaf.get('class')}>")
        else:
            parts.append(repr(_short_value(leaf))[:20])
    if len(tree["leaves"]) > 4:
        parts.append("...")
    return ", ".join(parts) or "()"


def call_repr(call: Call) -> str:
    """Concise one-line repr of a call, from metadata only (nothing is decoded)."""
    mode = ("train" if call.training else "eval") + ("" if call.grad_enabled else ", no_grad")
    status = "" if call.finished else ", raised"
    return (f"<Call {call.index} of {call._capture.ref} ({mode}{status}): "
            f"inputs {_tree_shapes(call._capture, call._data.get('inputs'))} -> "
            f"output {_tree_shapes(call._capture, call._data.get('output'))}>")
