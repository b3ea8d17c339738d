"""Call inputs and outputs as pytrees: structure as typed JSON, leaves as encoded values.

torch's own pytree flattens the structure (so types registered with it, such as transformers'
``ModelOutput`` or torchrec's ``KeyedJaggedTensor``, work unchanged). The tree spec is written
node by node: the node type by import path and its context through the typed value encoding, which
handles what ``treespec_dumps`` cannot (namedtuples, non-string dict keys).
"""

from __future__ import annotations

from typing import Any

import torch.utils._pytree as pytree

from modulelens.errors import UnsupportedValueError
from modulelens.format.values import (
    JSON,
    DecodeContext,
    EncodeContext,
    decode_value,
    encode_value,
    import_object,
    import_path,
)

_LEAF = "*"


def encode_tree(tree: Any, ctx: EncodeContext, path: str) -> JSON:
    leaves_with_paths, spec = pytree.tree_flatten_with_path(tree)
    leaves = [encode_value(leaf, ctx, path + pytree.keystr(kp)) for kp, leaf in leaves_with_paths]
    return {"spec": _encode_spec(spec, path), "leaves": leaves}


def decode_tree(data: JSON, ctx: DecodeContext) -> Any:
    leaves = [decode_value(leaf, ctx) for leaf in data["leaves"]]
    return pytree.tree_unflatten(leaves, _decode_spec(data["spec"]))


def tree_leaves(data: JSON) -> list[JSON]:
    """The encoded leaves of an encoded tree, in flattening order."""
    return list(data["leaves"])


def _encode_spec(spec: pytree.TreeSpec, path: str) -> JSON:
    if spec.is_leaf():
        return _LEAF
    node_type = spec.type
    try:
        type_path = import_path(node_type)
    except UnsupportedValueError as error:
        raise UnsupportedValueError(f"{path}: container type {node_type!r}: {error}") from None
    children = [_encode_spec(child, path) for child in spec.children()]
    strict = EncodeContext(add_tensor=_no_tensors)
    try:
        context = {"value": encode_value(spec.context, strict, path)}
    except UnsupportedValueError:
        node = pytree.SUPPORTED_NODES.get(node_type)
        if node is None or node.to_dumpable_context is None:
            raise UnsupportedValueError(
                f"{path}: cannot store the structure of {type_path} (its pytree context has no encoding)"
            ) from None
        context = {"dumpable": node.to_dumpable_context(spec.context)}
    return {"type": type_path, "context": context, "children": children}


def _decode_spec(data: JSON) -> pytree.TreeSpec:
    if data == _LEAF:
        return pytree.treespec_leaf()
    node_type = import_object(data["type"])
    context_data = data["context"]
    if "dumpable" in context_data:
        node = pytree.SUPPORTED_NODES[node_type]
        context = node.from_dumpable_context(context_data["dumpable"])
    else:
        context = decode_value(context_data["value"], DecodeContext(get_tensor=_no_tensor_ids))
    return pytree.TreeSpec(node_type, context, [_decode_spec(child) for child in data["children"]])


def _no_tensors(_tensor: Any, path: str) -> str:
    raise UnsupportedValueError(f"{path}: a tensor inside a pytree context")


def _no_tensor_ids(_id: str) -> Any:
    raise UnsupportedValueError("a tensor reference inside a pytree context")
