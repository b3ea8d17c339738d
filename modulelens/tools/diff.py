"""``modulelens diff A B``: what changed between two captures (two versions, or two names).

* constructor: class and argument differences (positional arguments named from the class'
  signature when it can be imported; tensors compared by payload hash, nested modules by their
  own recorded construction);
* weights: per parameter / buffer (first recorded state of each), the max absolute difference and
  the relative norm ``||a - b|| / ||a||``; tensors with the same payload hash are identical without
  being read (their payloads are checked as a load checks them, and a note says so: a recorded hash
  is only as good as the check of the bytes behind it);
* inputs: per input leaf (over all recorded calls) mean / std / min / max of A and of B and the shift;
* outputs: B's module replayed on A's recorded inputs, compared with A's recorded outputs leaf by
  leaf (:func:`modulelens.restore.compare.compare`, per-dtype tolerances).
"""

from __future__ import annotations

import inspect
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from modulelens.format.imports import resolve_import
from modulelens.format.layouts import is_wrapper_subclass
from modulelens.format.tree import input_path
from modulelens.format.values import Unrecorded
from modulelens.restore.compare import compare
from modulelens.restore.replay import call_context
from modulelens.tools.recorded import refuse_ensemble
from modulelens.tools.reports import json_safe
from modulelens.tools.verify import error_means
from modulelens.tools.working_copy import run_device, working_module

if TYPE_CHECKING:
    from modulelens.repo import Repo
    from modulelens.restore.loader import Capture
    from modulelens.tools.recorded import RecordedTensors


@dataclass
class DiffReport:
    """Differences between captures ``a`` and ``b`` (``to_dict()``: docs/tools.md)."""

    a: str
    b: str
    class_a: str
    class_b: str
    constructor: list[dict[str, Any]] = field(default_factory=list)
    tensors: list[dict[str, Any]] = field(default_factory=list)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def changed_tensors(self) -> list[dict[str, object]]:
        return [t for t in self.tensors if t["status"] != "same"]

    @property
    def summary(self) -> dict[str, object]:
        return {
            "class_changed": self.class_a != self.class_b,
            "constructor_changes": len(self.constructor),
            "tensors": len(self.tensors),
            "tensors_changed": sum(t["status"] == "changed" for t in self.tensors),
            "tensors_only_in_a": sum(t["status"] == "only in a" for t in self.tensors),
            "tensors_only_in_b": sum(t["status"] == "only in b" for t in self.tensors),
            "tensors_reshaped": sum(t["status"] in ("shape changed", "dtype changed") for t in self.tensors),
            "output_calls_compared": len(self.outputs),
            "output_calls_differing": sum(not o["same"] for o in self.outputs),
        }

    def to_dict(self) -> dict[str, object]:
        return json_safe({"a": self.a, "b": self.b, "class_a": self.class_a, "class_b": self.class_b,
                          "summary": self.summary, "constructor": self.constructor, "tensors": self.tensors,
                          "inputs": self.inputs, "outputs": self.outputs, "notes": self.notes})

    def __str__(self) -> str:
        lines = [f"diff {self.a} -> {self.b}"]
        if self.class_a != self.class_b:
            lines.append(f"  class: {self.class_a} -> {self.class_b}")
        lines.extend(f"  constructor {c['argument']}: {c['a']} -> {c['b']}" for c in self.constructor)
        for t in self.changed_tensors:
            detail = (f"max abs diff {t['max_abs_diff']:.3g}, rel norm {t['rel_norm']:.3g}"
                      if t["status"] == "changed" else t["status"])
            lines.append(f"  {t['kind']} {t['name']}: {detail}")
        lines.append(f"  {len(self.tensors) - len(self.changed_tensors)}/{len(self.tensors)} tensors identical")
        for o in self.outputs:
            lines.append(f"  call {o['index']} (B on A's inputs): "
                         + (o["error"] or ("same" if o["same"] else f"differs, max abs err {o['max_abs_error']:.3g}")))
        return "\n".join(lines)

    __repr__ = __str__


# ------------------------------------------------------------------------------------------------
# Constructor


def _canonical(value: Any, capture: Capture, depth: int = 0) -> Any:
    """Encoded constructor value with tensor ids replaced by payload facts and module refs by
    their construction (ids differ between captures; content does not)."""
    if isinstance(value, list):
        return [_canonical(v, capture, depth) for v in value]
    if not isinstance(value, dict):
        return value
    tag = value.get("$type")
    if tag == "tensor":
        entry = capture.metadata["tensors"][value["id"]]
        return {"$type": "tensor", "dtype": entry["dtype"], "shape": entry["shape"], "payload": entry["payload"]}
    if tag == "module" and depth < 32:
        construction = capture.metadata["constructions"].get(value["ref"])
        if construction is None:
            return {"$type": "module", "class": None, "args": [], "kwargs": {}}
        return {"$type": "module", "class": construction.get("class"),
                "args": _canonical(construction.get("args", []), capture, depth + 1),
                "kwargs": _canonical(construction.get("kwargs", {}), capture, depth + 1)}
    return {k: _canonical(v, capture, depth) for k, v in value.items()}


def _show(value: object) -> str:
    if isinstance(value, dict) and value.get("$type") == "tensor":
        return f"tensor {value['dtype']}{value['shape']} ({value['payload'][:15]}...)"
    if isinstance(value, dict) and value.get("$type") == "module":
        return f"{value['class']}(...)"
    text = json.dumps(value, default=str)
    return text if len(text) <= 100 else text[:97] + "..."


def _construction(capture: Capture) -> tuple[list[Any], dict[str, Any]] | None:
    mid = capture.metadata["module"].get("construction")
    if mid is None:
        return None
    entry = capture.metadata["constructions"][mid]
    return _canonical(entry["args"], capture), _canonical(entry["kwargs"], capture)


def _signature(class_path: str) -> tuple[list[str], dict[str, object]]:
    """Positional parameter names of the class' ``__init__`` and its plain-JSON defaults."""
    try:
        cls = resolve_import(class_path, "module")
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except Exception:
        return [], {}
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    defaults = {p.name: p.default for p in params
                if p.default is not p.empty and (p.default is None or type(p.default) in (bool, int, float, str))}
    return names, defaults


def constructor_changes(a: Capture, b: Capture) -> list[dict[str, object]]:
    """Arguments that differ: ``{"argument", "a", "b", "a_value", "b_value"}`` (absent -> ``None``).

    Example::

        constructor_changes(load("mlp:v1"), load("mlp:v2"))  # [{"argument": "hidden", "a": "16", "b": "32", ...}]
    """
    ca, cb = _construction(a), _construction(b)
    if ca is None or cb is None:
        if ca is None and cb is None:
            return []
        return [{"argument": "<constructor>", "a": "recorded" if ca else "not recorded",
                 "b": "recorded" if cb else "not recorded", "a_value": None, "b_value": None}]
    names, defaults = _signature(b.module_class)
    if not names:
        names, defaults = _signature(a.module_class)
    absent = object()

    def label(i: int) -> str:
        return names[i] if i < len(names) else f"args[{i}]"

    def named(args: Sequence[object], kwargs: Mapping[str, object]) -> dict[str, object]:
        out = {label(i): v for i, v in enumerate(args)}
        out.update(kwargs)
        return out

    first, second = named(*ca), named(*cb)
    changes = []
    for key in list(dict.fromkeys([*first, *second])):
        va, vb = first.get(key, absent), second.get(key, absent)
        shown_a = "<absent>" if va is absent else _show(va)
        shown_b = "<absent>" if vb is absent else _show(vb)
        if va is absent and key in defaults:  # not passed: the signature's default applies
            va, shown_a = defaults[key], f"{_show(defaults[key])} (default)"
        if vb is absent and key in defaults:
            vb, shown_b = defaults[key], f"{_show(defaults[key])} (default)"
        if va != vb or type(va) is not type(vb):
            changes.append({"argument": key, "a": shown_a, "b": shown_b,
                            "a_value": None if va is absent else va, "b_value": None if vb is absent else vb})
    return changes


# ------------------------------------------------------------------------------------------------
# Weights


def _state_entries(capture: RecordedTensors) -> dict[str, tuple[str, str]]:
    states = capture.metadata.get("states", [])
    if not states:
        return {}
    state = states[0]
    entries = {name: ("parameter", e["tensor"]) for name, e in state["parameters"].items()}
    entries.update({name: ("buffer", e["tensor"]) for name, e in state["buffers"].items()})
    return entries


def tensor_changes(a: RecordedTensors, b: RecordedTensors) -> list[dict[str, Any]]:
    """Per parameter/buffer of the first recorded state: status, max abs diff, relative norm.

    Reads only the captures' metadata and recorded tensors (a :class:`Capture`, or the web UI's
    view of a stored one), chunk by chunk: two multi-GB weights are compared without a copy of
    either in memory, and tensors with the same payload hash are not read at all.

    Example::

        changed = [t["name"] for t in tensor_changes(a, b) if t["status"] != "same"]
    """
    ea, eb = _state_entries(a), _state_entries(b)
    rows = []
    for name in list(dict.fromkeys([*ea, *eb])):
        kind = (ea.get(name) or eb[name])[0]
        row: dict[str, Any] = {"name": name, "kind": kind, "status": "same", "shape_a": None, "shape_b": None,
                               "dtype_a": None, "dtype_b": None, "max_abs_diff": 0.0, "rel_norm": 0.0}
        meta_a = a.metadata["tensors"][ea[name][1]] if name in ea else None
        meta_b = b.metadata["tensors"][eb[name][1]] if name in eb else None
        if meta_a:
            row.update(shape_a=meta_a["shape"], dtype_a=meta_a["dtype"])
        if meta_b:
            row.update(shape_b=meta_b["shape"], dtype_b=meta_b["dtype"])
        if meta_a is None or meta_b is None:
            row.update(status="only in b" if meta_a is None else "only in a", max_abs_diff=None, rel_norm=None)
        elif meta_a["shape"] != meta_b["shape"]:
            row.update(status="shape changed", max_abs_diff=None, rel_norm=None)
        elif meta_a.get("shape_only") or meta_b.get("shape_only"):
            row.update(status="not compared (shape-only)", max_abs_diff=None, rel_norm=None)
        elif meta_a.get("payload") != meta_b.get("payload") or meta_a["dtype"] != meta_b["dtype"] or "payload" not in meta_a:
            max_abs, delta_norm, norm_a = _drift(a.tensor(ea[name][1]), b.tensor(eb[name][1]))
            row["max_abs_diff"] = max_abs
            row["rel_norm"] = delta_norm / norm_a if norm_a else (0.0 if not max_abs else math.inf)
            if meta_a["dtype"] != meta_b["dtype"]:
                row["status"] = "dtype changed"
            elif max_abs != 0.0:  # NaN included
                row["status"] = "changed"
        rows.append(row)
    return rows


def _check_same_hashes(a: RecordedTensors, b: RecordedTensors) -> int:
    """Open (and so check, as a load does) the payloads :func:`tensor_changes` called identical by
    their recorded hash without reading them; returns how many tensors that was.

    Raises:
        CorruptCaptureError: such a payload is missing or does not match its hash.
    """
    ea, eb = _state_entries(a), _state_entries(b)
    count = 0
    for name in ea.keys() & eb.keys():
        meta_a, meta_b = a.metadata["tensors"][ea[name][1]], b.metadata["tensors"][eb[name][1]]
        if "payload" in meta_a and meta_a.get("payload") == meta_b.get("payload") and meta_a["dtype"] == meta_b["dtype"] \
                and meta_a["shape"] == meta_b["shape"] and not (meta_a.get("shape_only") or meta_b.get("shape_only")):
            a.tensor(ea[name][1])
            b.tensor(eb[name][1])
            count += 1
    return count


_DRIFT_CHUNK = 1 << 22  # elements compared at a time (two float64 chunks: 64 MiB)


def _drift(ta: torch.Tensor, tb: torch.Tensor) -> tuple[float, float, float]:
    """``(max |b - a|, ||b - a||, ||a||)`` in float64, a chunk at a time (the first two NaN when a
    difference is)."""
    flat_a, flat_b = _flat_real(ta), _flat_real(tb)
    max_abs, delta_sq, a_sq = 0.0, 0.0, 0.0
    for start in range(0, flat_a.numel(), _DRIFT_CHUNK):
        chunk_a = flat_a[start:start + _DRIFT_CHUNK].to(torch.float64)
        delta = flat_b[start:start + _DRIFT_CHUNK].to(torch.float64) - chunk_a
        a_sq += float((chunk_a * chunk_a).sum())
        if math.isnan(max_abs):
            continue
        if bool(torch.isnan(delta).any()):
            max_abs = delta_sq = math.nan
            continue
        if delta.numel():
            max_abs = max(max_abs, float(delta.abs().max()))
        delta_sq += float((delta * delta).sum())
    return max_abs, math.sqrt(delta_sq), math.sqrt(a_sq)


def _flat_real(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as one flat real tensor (a view when it is contiguous: nothing is read yet); a
    quantized tensor subclass (torchao's weights) by the values it stands for."""
    if is_wrapper_subclass(tensor) and callable(getattr(tensor, "dequantize", None)):
        tensor = tensor.dequantize()
    flat = tensor.detach().reshape(-1)
    return torch.view_as_real(flat).reshape(-1) if flat.is_complex() else flat


# ------------------------------------------------------------------------------------------------
# Inputs


def _leaf_name(key_path: pytree.KeyPath) -> str:
    return input_path(pytree.keystr(key_path))  # "[0][1]" -> "args[1]", "[1]['mask']" -> "kwargs['mask']"


@dataclass
class _Stats:
    count: int = 0
    total: float = 0.0
    squares: float = 0.0
    low: float = math.inf
    high: float = -math.inf
    shape: list[int] | None = None
    dtype: str | None = None
    values: list[str] = field(default_factory=list)

    def add(self, value: object) -> None:
        if isinstance(value, torch.Tensor):
            self.shape = self.shape or list(value.shape)
            self.dtype = self.dtype or str(value.dtype).removeprefix("torch.")
            if value.numel() == 0:
                return
            data = value.detach().to("cpu")
            data = (data.abs() if data.is_complex() else data).to(torch.float64)
            self.count += data.numel()
            self.total += float(data.sum())
            self.squares += float((data * data).sum())
            self.low = min(self.low, float(data.min()))
            self.high = max(self.high, float(data.max()))
        elif not isinstance(value, Unrecorded):
            text = repr(value)[:40]
            if text not in self.values and len(self.values) < 5:
                self.values.append(text)

    def to_dict(self) -> dict[str, object]:
        if self.dtype is None:
            return {"values": self.values}
        if not self.count:
            return {"shape": self.shape, "dtype": self.dtype, "mean": None, "std": None, "min": None, "max": None}
        mean = self.total / self.count
        var = max(self.squares / self.count - mean * mean, 0.0) * (self.count / max(self.count - 1, 1))
        return {"shape": self.shape, "dtype": self.dtype, "mean": mean, "std": math.sqrt(var),
                "min": self.low, "max": self.high}


def _difference(before: object, after: object) -> float | None:
    """``after - before`` of two statistics, or ``None`` when either is missing."""
    if isinstance(before, (int, float)) and isinstance(after, (int, float)):
        return after - before
    return None


def _input_stats(capture: Capture) -> dict[str, _Stats]:
    stats: dict[str, _Stats] = {}
    for call in capture.calls:
        leaves, _ = pytree.tree_flatten_with_path(call.inputs)
        for key_path, value in leaves:
            stats.setdefault(_leaf_name(key_path), _Stats()).add(value)
    return stats


def input_shifts(a: Capture, b: Capture) -> list[dict[str, Any]]:
    """Per input leaf: A's and B's statistics over all their recorded calls, and B minus A.

    Example::

        for row in input_shifts(a, b):
            print(row["leaf"], row["shift"])   # args[0] {'mean': 0.94, 'std': 0.04, ...}
    """
    sa, sb = _input_stats(a), _input_stats(b)
    rows = []
    for leaf in list(dict.fromkeys([*sa, *sb])):
        da = sa[leaf].to_dict() if leaf in sa else None
        db = sb[leaf].to_dict() if leaf in sb else None
        shift = None
        if da and db and "mean" in da and "mean" in db:
            shift = {k: _difference(da[k], db[k]) for k in ("mean", "std", "min", "max")}
        rows.append({"leaf": leaf, "a": da, "b": db, "shift": shift})
    return rows


# ------------------------------------------------------------------------------------------------
# Outputs


def output_differences(a: Capture, b: Capture, *, device: str | torch.device | None = None,
                       rtol: float | None = None, atol: float | None = None) -> list[dict[str, object]]:
    """B's module (first recorded state) run on each of A's recorded calls vs A's recorded outputs.

    Example::

        rows = output_differences(load("mlp:v1"), load("mlp:v2"), rtol=1e-4)
        print([r["max_abs_error"] for r in rows])
    """
    refuse_ensemble(a, "diff")
    refuse_ensemble(b, "diff")
    run_on = run_device(a, device)
    module = working_module(b, 0, device=run_on, dtype=a.dtype)
    rows = []
    for position, call in enumerate(a.calls):
        row: dict[str, Any] = {"call": position, "index": call.index, "same": False, "error": None,
                               "max_abs_error": None, "max_rel_error": None, "mean_abs_error": None, "leaves": []}
        rows.append(row)
        if not call.finished:
            row["error"] = "A's call did not finish in the original job"
            continue
        try:
            args, kwargs = call.fresh_inputs(run_on, a.dtype)
            module.train(call.training)
            with call_context(call, run_on):
                output = a.entry_point(module)(*args, **kwargs)  # a method capture: that method
        except Exception as error:
            row["error"] = f"B's module raised {type(error).__name__}: {error}"
            continue
        leaves = compare(call.output, output, exact=False, rtol=rtol, atol=atol)
        row.update(same=all(leaf.passed for leaf in leaves), leaves=[leaf.to_dict() for leaf in leaves],
                   max_abs_error=max((leaf.max_abs_error for leaf in leaves), default=0.0),
                   max_rel_error=max((leaf.max_rel_error for leaf in leaves), default=0.0),
                   mean_abs_error=error_means(call.output, output)[0])
    return rows


def diff(
    a: Capture | str,
    b: Capture | str,
    *,
    repo: Repo | str | os.PathLike[str] | None = None,
    device: str | torch.device | None = None,
    outputs: bool = True,
    rtol: float | None = None,
    atol: float | None = None,
) -> DiffReport:
    """Compare two captures (``Capture`` objects or refs such as ``"ranker/mlp:v1"``).

    Example::

        report = diff("ranker/mlp:v1", "ranker/mlp:v2")
        for t in report.changed_tensors:
            print(t["name"], t["max_abs_diff"], t["rel_norm"])
    """
    from modulelens.restore.loader import load

    if isinstance(a, str):
        a = load(a, repo=repo, device=device)
    if isinstance(b, str):
        b = load(b, repo=repo, device=device)
    report = DiffReport(a=a.ref, b=b.ref, class_a=a.module_class, class_b=b.module_class)
    report.constructor = constructor_changes(a, b)
    report.tensors = tensor_changes(a, b)
    if by_hash := _check_same_hashes(a, b):
        report.notes.append(f"{by_hash} tensors with the same recorded payload hash in A and B were compared by that "
                            "hash: their payloads were checked as a load checks them (size; full hash of small ones and "
                            "of pack members; sampled chunks of large ones), not re-hashed in full (`modulelens fsck` is)")
    report.inputs = input_shifts(a, b)
    if outputs:
        try:
            report.outputs = output_differences(a, b, device=device, rtol=rtol, atol=atol)
        except Exception as error:  # B cannot be rebuilt: still report the metadata differences
            report.notes.append(f"outputs not compared: cannot rebuild {b.ref}: {type(error).__name__}: {error}")
    return report
