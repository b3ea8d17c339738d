"""Encoded values (docs/format.md, "Encoded values") as Python-like text, without decoding them.

Decoding a value imports the classes it names (``restore``, under the trust rules of
docs/security.md); showing it must not: a page or a summary of a capture someone sent you imports
nothing. So this reads the JSON encoding itself and writes what the value looked like in Python
(``MLP(sizes=[64, 32], activation=torch.nn.modules.activation.ReLU)``), naming classes by their
recorded import path and tensors by dtype, shape and payload hash. Used by the web UI's capture
and diff pages; the output is plain text (callers escape it for HTML).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# Past this many characters a value is cut (a constructor argument holding a 10,000-entry list).
MAX_CHARS = 4000
_MAX_DEPTH = 32


def python_like(value: Any, metadata: Mapping[str, Any] | None = None, *, limit: int = MAX_CHARS) -> str:
    """``value`` (encoded) as Python-like text.

    Args:
        value: an encoded value from a capture's metadata (a constructor argument, a call leaf).
        metadata: the capture's metadata, to describe tensors (``tensors``) and nested modules
            (``constructions``) by what they are; without it they are shown by id.
        limit: cut the text at this many characters (``...`` marks the cut).

    Returns:
        One line of text such as ``(64, {'bias': True})`` or ``tensor(float32[4, 8], blake3:3f2a...)``.

    Example::

        >>> python_like({"$type": "tuple", "items": [1, {"$type": "dtype", "value": "float16"}]})
        '(1, torch.float16)'
    """
    text = _text(value, metadata or {}, 0)
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def construction_text(construction: Mapping[str, Any], metadata: Mapping[str, Any] | None = None) -> str:
    """A recorded construction (``{"class", "args", "kwargs"}``) as a call: ``Linear(4, 8, bias=True)``."""
    return _call(construction, metadata or {}, 0)


def argument_texts(construction: Mapping[str, Any], metadata: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Each constructor argument as text, by label: ``args[0]``, ``args[1]``..., then keyword names.

    Example::

        argument_texts({"class": "m:Lin", "args": [4], "kwargs": {"bias": True}})  # {'args[0]': '4', 'bias': 'True'}
    """
    meta = metadata or {}
    texts = {f"args[{i}]": python_like(v, meta) for i, v in enumerate(construction.get("args") or [])}
    kwargs = construction.get("kwargs") or {}
    if isinstance(kwargs, Mapping):
        texts.update({str(k): python_like(v, meta) for k, v in kwargs.items()})
    return texts


def short_class(path: Any) -> str:
    """``"torch.nn.modules.linear:Linear"`` -> ``"Linear"`` (any other value as text)."""
    return str(path).rpartition(":")[2] if isinstance(path, str) else repr(path)


def dotted(path: Any) -> str:
    """``"torch.nn.modules.linear:Linear"`` -> ``"torch.nn.modules.linear.Linear"``."""
    return str(path).replace(":", ".") if isinstance(path, str) else repr(path)


def _call(construction: Mapping[str, Any], metadata: Mapping[str, Any], depth: int) -> str:
    args = [_text(v, metadata, depth + 1) for v in construction.get("args") or []]
    kwargs = construction.get("kwargs") or {}
    if isinstance(kwargs, Mapping):
        args += [f"{k}={_text(v, metadata, depth + 1)}" for k, v in kwargs.items()]
    return f"{short_class(construction.get('class'))}({', '.join(args)})"


def _items(value: Mapping[str, Any]) -> list[Any]:
    items = value.get("items")
    return items if isinstance(items, list) else []


def _text(value: Any, metadata: Mapping[str, Any], depth: int) -> str:
    if depth > _MAX_DEPTH:
        return "..."
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if isinstance(value, list):
        return "[" + ", ".join(_text(v, metadata, depth + 1) for v in value) + "]"
    if not isinstance(value, Mapping):
        return repr(value)
    tag = value.get("$type")
    inner = [_text(v, metadata, depth + 1) for v in _items(value)]
    if tag == "tuple":
        return "(" + ", ".join(inner) + ("," if len(inner) == 1 else "") + ")"
    if tag == "dict":
        pairs = [p for p in _items(value) if isinstance(p, list) and len(p) == 2]
        return "{" + ", ".join(f"{_text(k, metadata, depth + 1)}: {_text(v, metadata, depth + 1)}" for k, v in pairs) + "}"
    if tag in ("set", "frozenset"):
        body = "{" + ", ".join(inner) + "}" if inner else "()"
        return body if tag == "set" and inner else f"{tag}({body if inner else ''})"
    if tag == "float":
        return f"float({str(value.get('value'))!r})"
    if tag == "tensor":
        return _tensor(value.get("id"), metadata)
    if tag == "module":
        construction = (metadata.get("constructions") or {}).get(value.get("ref"))
        return _call(construction, metadata, depth + 1) if isinstance(construction, Mapping) else "<module>"
    if tag == "dtype":
        return f"torch.{value.get('value')}"
    if tag == "device":
        return f"device({str(value.get('value'))!r})"
    if tag == "size":
        return f"torch.Size({_text(value.get('value'), metadata, depth + 1)})"
    if tag == "complex":
        return repr(complex(_number(value.get("real")), _number(value.get("imag"))))
    if tag == "bytes":
        try:
            return repr(bytes.fromhex(str(value.get("hex"))))
        except ValueError:
            return "b'?'"
    if tag == "slice":
        return "slice(" + ", ".join(inner) + ")"
    if tag == "ellipsis":
        return "..."
    if tag == "import":
        return dotted(value.get("path"))
    if tag == "namedtuple":
        return f"{short_class(value.get('class'))}({', '.join(inner)})"
    if tag == "dataclass":
        fields = value.get("fields")
        pairs = [p for p in _items(fields) if isinstance(p, list) and len(p) == 2] if isinstance(fields, Mapping) else []
        body = ", ".join(f"{k if isinstance(k, str) else _text(k, metadata, depth + 1)}={_text(v, metadata, depth + 1)}"
                         for k, v in pairs)
        return f"{short_class(value.get('class'))}({body})"
    if tag == "codec":
        return f"{short_class(value.get('class'))}({_text(value.get('value'), metadata, depth + 1)})"
    if tag == "unrecorded":
        return f"<not recorded: {value.get('class')}: {value.get('reason')}>"
    return f"<{tag}>" if isinstance(tag, str) else "{" + ", ".join(f"{k!r}: ..." for k in list(value)[:8]) + "}"


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


def _tensor(tid: Any, metadata: Mapping[str, Any]) -> str:
    entry = (metadata.get("tensors") or {}).get(tid) if isinstance(tid, str) else None
    if not isinstance(entry, Mapping):
        return f"tensor(<{tid}>)"
    described = f"{entry.get('dtype')}{list(entry.get('shape') or [])}"
    if entry.get("shape_only"):
        return f"tensor({described}, shape-only)"
    payload = entry.get("payload")
    return f"tensor({described}, {str(payload)[:19]}...)" if payload else f"tensor({described})"


def spec_leaf_paths(tree: Mapping[str, Any], prefix: str) -> list[str]:
    """Readable paths of an encoded tree's leaves, read from its stored structure alone.

    :func:`modulelens.format.tree.leaf_paths` rebuilds the pytree spec, which imports each
    container type the capture names; this reads the spec as JSON: positions for sequences and
    for containers whose keys it cannot see, the stored keys for dicts. Nothing is imported.

    Args:
        tree: an encoded tree (``{"spec", "leaves"}``).
        prefix: ``"inputs"`` (paths become ``args[0]``, ``kwargs['x']``) or a root name such as
            ``"output"`` (paths become ``output[1]``).

    Returns:
        One path per leaf, in leaf order (positions only when the structure does not add up).
    """
    from modulelens.format.tree import input_path

    leaves = tree.get("leaves") or []
    keys: list[str] = []
    try:
        _walk_spec(tree.get("spec"), "", keys, 0)
    except (ValueError, TypeError):
        keys = []
    if len(keys) != len(leaves):
        return [f"{prefix}[{i}]" for i in range(len(leaves))]
    return [input_path(k) for k in keys] if prefix == "inputs" else [prefix + k for k in keys]


def _walk_spec(spec: Any, path: str, out: list[str], depth: int) -> None:
    if spec == "*":
        out.append(path)
        return
    if not isinstance(spec, Mapping) or depth > _MAX_DEPTH * 2:
        raise ValueError("not a stored tree structure")
    children = spec.get("children")
    if not isinstance(children, list):
        raise ValueError("not a stored tree structure")
    for key, child in zip(_child_keys(spec, len(children)), children, strict=True):
        _walk_spec(child, path + key, out, depth + 1)


def _child_keys(spec: Mapping[str, Any], count: int) -> list[str]:
    """``['mask']`` for a dict's children (keys stored in its context), else ``[0]``, ``[1]``..."""
    context = spec.get("context")
    stored = context.get("value") if isinstance(context, Mapping) else None
    mapping = str(spec.get("type", "")).rpartition(":")[2] in ("dict", "OrderedDict")
    if mapping and isinstance(stored, list) and len(stored) == count and all(isinstance(k, (str, int)) for k in stored):
        return [f"[{k!r}]" for k in stored]
    return [f"[{i}]" for i in range(count)]
