"""A compact, JSON-ready description of a stored capture (for `show`, IPython and MCP)."""

from __future__ import annotations

import json

from modulelens.errors import CorruptCaptureError
from modulelens.format.constants import hooks_not_rebuilt

# typing.TYPE_CHECKING without importing typing (~2 ms), and the repo package (~25 ms) for types
# only: `show`'s quick path (interfaces/cli/_quick_show.py) runs without either
_TYPE_CHECKING = False
if _TYPE_CHECKING:
    from typing import Any

    from modulelens.format.spec import OpTraceDocument
    from modulelens.repo import Repo


def _leaf_summaries(tree: dict[str, Any] | None, tensors: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    if tree is None:
        return []
    out = []
    for i, leaf in enumerate(tree["leaves"]):
        if isinstance(leaf, dict) and leaf.get("$type") == "tensor":
            entry = tensors[leaf["id"]]
            out.append({"leaf": f"{prefix}[{i}]", "kind": "shape-only" if entry.get("shape_only") else "tensor",
                        "shape": entry["shape"], "dtype": entry["dtype"],
                        "device": entry.get("device", "cpu"), "stats": entry.get("stats")})
        elif isinstance(leaf, dict) and leaf.get("$type") == "unrecorded":
            out.append({"leaf": f"{prefix}[{i}]", "kind": "unrecorded", "type": leaf.get("class")})
        else:
            out.append({"leaf": f"{prefix}[{i}]", "kind": "value", "value": leaf})
    return out


def describe(repo: Repo, ref: str, *, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """Metadata, state size, per-call input/output shapes, environment and report history.
    ``metadata``: the version's, already read (parsing and checking it is most of the time on a
    capture of 50,000 calls: ``show`` reads it once for this and its own rendering)."""
    name, version = repo.resolve(ref)
    meta = repo.read_metadata(name, version) if metadata is None else metadata
    info = repo.info(name, version, metadata=meta)
    return describe_metadata(meta, info.to_dict(), repo.reports(info.ref))


def describe_metadata(meta: dict[str, Any], listed: dict[str, Any], reports: list[dict[str, object]]) -> dict[str, Any]:
    """:func:`describe` of a version whose checked metadata ``meta``, listing row ``listed``
    (``VersionInfo.to_dict()``) and stored ``reports`` (``Repo.reports``) the caller has read:
    ``show``'s quick path (interfaces/cli/_quick_show.py) reads them without the repo package.

    Example::

        describe_metadata(meta, repo.info("mlp", 3, metadata=meta).to_dict(), repo.reports("mlp:v3"))
    """
    tensors = meta.get("tensors", {})
    states = meta.get("states", [])
    first_state = states[0] if states else {"parameters": {}, "buffers": {}}
    param_numel = 0
    for entry in first_state["parameters"].values():
        n = 1
        for s in tensors[entry["tensor"]]["shape"]:
            n *= s
        param_numel += n
    module = meta["module"]
    construction = meta.get("constructions", {}).get(module.get("construction") or "", None)
    return {
        "ref": listed["ref"],
        "name": listed["name"],
        "version": listed["version"],
        "aliases": list(listed["aliases"]),
        "tags": list(listed["tags"]),
        "created": meta.get("created"),
        "path": listed["path"],
        "module_class": module["class"],
        "qualified_name": module.get("qualified_name"),
        "method": module.get("method"),  # the calls went through module.<method>(...) (docs/fidelity.md)
        "construction": construction,
        "construction_missing": module.get("construction_missing"),
        "parameters": {n: tensors[e["tensor"]]["shape"] for n, e in first_state["parameters"].items()},
        "parameter_count": param_numel,
        "buffers": {n: tensors[e["tensor"]]["shape"] for n, e in first_state["buffers"].items()},
        "states": len(states),
        "payload_bytes": listed["payload_bytes"],
        "calls": [
            {"index": c["index"], "training": c["training"], "grad_enabled": c["grad_enabled"], "state": c["state"],
             "finished": c.get("finished", True),
             "inputs": _leaf_summaries(c["inputs"], tensors, "in"),
             "outputs": _leaf_summaries(c.get("output"), tensors, "out"),
             "op_trace": {k: v for k, v in c["op_trace"].items() if k != "text_id"} if c.get("op_trace") else None}
            for c in meta.get("calls", [])
        ],
        "unrecorded": meta.get("unrecorded", []),
        "hooks_not_rebuilt": hooks_not_rebuilt(module),
        "capture": meta.get("capture", {}),
        "environment": meta.get("environment", {}),
        "metadata": meta.get("metadata", {}),
        "reports": [{"kind": r.get("kind"), "created": r.get("created"), "path": r.get("path"),
                     "passed": r.get("passed")} for r in reports],
    }


def op_trace_document(repo: Repo, ref: str, position: int) -> OpTraceDocument | None:
    """The op trace of recorded call ``position`` of ``ref`` as its checked JSON document (no torch:
    ``show --ops``), or ``None`` when the call was recorded without one.

    Raises:
        CorruptCaptureError: the stored trace is damaged (docs/format.md, "Op traces").

    Example::

        doc = op_trace_document(repo, "gpt/blocks.3:v1", 0)
        print(doc["ops"][0]["op"])          # aten::native_layer_norm
    """
    from modulelens.format.validate_trace import validate_op_trace  # here: only `show --ops` checks traces

    name, version = repo.resolve(ref)
    meta = repo.read_metadata(name, version)
    summary = meta["calls"][position].get("op_trace")
    if summary is None:
        return None
    where = f"{name}:v{version}: calls[{position}].op_trace"
    tensors = meta.get("tensors", {})
    raw = repo.payloads(meta).read_bytes(tensors[summary["text_id"]])
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise CorruptCaptureError(f"{where}: not JSON ({error})") from None
    return validate_op_trace(data, where, tensors.get)


def op_rows(document: OpTraceDocument) -> list[dict[str, Any]]:
    """One JSON-ready row per op of a trace document: position, module path, op, source line, and
    each output's dtype, shape, fingerprint and statistics (``show --ops``)."""
    modules, sources = document["modules"], document["sources"]
    return [{"index": i, "module": modules[op["module"]]["path"], "op": op["op"],
             "source": sources[op["source"]] if op["source"] >= 0 else None,
             "outputs": [{k: v for k, v in out.items() if k != "value"} | {"kept": "value" in out}
                         for out in op["outputs"]]}
            for i, op in enumerate(document["ops"])]
