"""``torch.fx.Graph`` as data: the graph of a ``GraphModule`` (``symbolic_trace``, ``torch.export``'s
``.module()``, quantization's ``prepare_fx``), so a load rebuilds the module with torch.fx's own code
generation instead of refusing a class generated at run time (issue 34, defect 3).

Installed lazily (``format/values.py``) once ``torch.fx`` is imported (torch imports it).

A graph is stored node by node: its operation, name, target and arguments, and the graph's code
generator (plain, or the pytree one of exported programs, with its input and output specs as
torch's own JSON, ``treespec_dumps``). Arguments are values of the codecs, with a node used as an
argument written ``{"$fx_node": name}``. Targets:

* ``call_function`` of a Python function: an ``import`` value, resolved under the capture's import
  rules like any function a capture names;
* an operator of torch's dispatcher (``torch.ops.aten.linear.default``, what exported graphs
  call): ``"op:aten::linear.default"``, looked up in ``torch.ops`` (namespaces of torch's own
  operators only: :data:`OP_NAMESPACES`);
* ``getattr`` (fx's ``x.shape`` and the like): ``"builtin:getattr"``, never with a special
  attribute name (``__class__``, ``__globals__``...);
* ``call_method``, ``call_module``, ``get_attr``: their names and attribute paths, never special
  ones either.

A graph is code: which functions run, with which arguments. So nothing here makes one from a
capture unless the capture may run code (restore/classes.py checks that before decoding one:
``trust_source``, or a capture of your own), exactly as for stored source (docs/security.md).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx.immutable_collections import immutable_dict, immutable_list

from modulelens.errors import UnsupportedValueError, UntrustedCodeError
from modulelens.format.values import register_codec

CODEC = "torch.fx.Graph"
# the dispatcher namespaces of torch's own operators (exported, decomposed and quantized graphs)
OP_NAMESPACES = frozenset({"aten", "prims", "quantized_decomposed", "quantized", "_quantized"})
_BUILTINS = {"getattr": getattr}
_NODE = "$fx_node"


def _special(name: object) -> bool:
    return not isinstance(name, str) or any(part.startswith("__") and part.endswith("__") for part in name.split("."))


# --------------------------------------------------------------------------------------------- encode

def encode_graph(graph: torch.fx.Graph) -> dict[str, object]:
    """The graph as data."""
    nodes = []
    for node in graph.nodes:
        nodes.append({"op": node.op, "name": node.name, "target": _encode_target(node),
                      "args": _with_refs(node.args), "kwargs": _with_refs(dict(node.kwargs))})
    return {"nodes": nodes, "codegen": _encode_codegen(graph)}


def _encode_target(node: torch.fx.Node) -> object:
    target = node.target
    if node.op != "call_function":
        if _special(target):
            raise UnsupportedValueError(f"fx node {node.name}: {node.op} target {target!r} is not stored")
        return target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        name = target.name() if isinstance(target, torch._ops.OpOverload) else target._qualified_op_name
        return f"op:{name}"
    if target is getattr:
        return "builtin:getattr"
    return target  # a function, stored as an import value


def _with_refs(value: object) -> object:
    """``value`` with each fx node replaced by ``{"$fx_node": name}`` (containers rebuilt; fx's
    ``immutable_list``/``immutable_dict``, what graph transformations leave, as plain ones)."""
    if isinstance(value, torch.fx.Node):
        return {_NODE: value.name}
    if type(value) is list or type(value) is immutable_list:
        return [_with_refs(v) for v in value]
    if type(value) is tuple:
        return tuple(_with_refs(v) for v in value)
    if type(value) is dict or type(value) is immutable_dict:
        return {k: _with_refs(v) for k, v in value.items()}
    if type(value) is slice:
        return slice(_with_refs(value.start), _with_refs(value.stop), _with_refs(value.step))
    return value


def _encode_codegen(graph: torch.fx.Graph) -> dict[str, object]:
    from torch.fx.graph import _PyTreeCodeGen
    from torch.utils._pytree import treespec_dumps

    codegen = graph._codegen
    if type(codegen) is torch.fx.graph.CodeGen:
        return {"kind": "python"}
    if type(codegen) is _PyTreeCodeGen:
        info = codegen.pytree_info
        return {"kind": "pytree", "orig_args": list(info.orig_args),
                "in_spec": treespec_dumps(info.in_spec) if info.in_spec is not None else None,
                "out_spec": treespec_dumps(info.out_spec) if info.out_spec is not None else None}
    raise UnsupportedValueError(f"an fx graph with code generator {type(codegen).__qualname__} is not stored")


# --------------------------------------------------------------------------------------------- decode

def decode_graph(_cls: type, data: dict[str, Any]) -> torch.fx.Graph:
    """The graph from its data (the caller checked that the capture may run code)."""
    graph = torch.fx.Graph()
    made: dict[str, torch.fx.Node] = {}
    for entry in data["nodes"]:
        op, name = entry["op"], entry["name"]
        if op not in ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output"):
            raise UntrustedCodeError(f"fx graph: unknown operation {op!r}")
        if not isinstance(name, str) or not name.isidentifier():
            raise UntrustedCodeError(f"fx graph: malformed node name {name!r}")
        target = _decode_target(op, entry["target"], entry["args"])
        args, kwargs = _resolve_refs(entry["args"], made), _resolve_refs(entry["kwargs"], made)
        if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
            raise UntrustedCodeError(f"fx graph: node {name!r} has malformed arguments")
        made[name] = graph.create_node(op, target, tuple(args), dict(kwargs), name=name)
        if made[name].name != name:
            raise UntrustedCodeError(f"fx graph: node name {name!r} is used twice")
    _decode_codegen(graph, data["codegen"])
    graph.lint()
    return graph


def _decode_target(op: str, target: object, args: Sequence[object]) -> str | Callable[..., object]:
    if op != "call_function":
        if not isinstance(target, str) or _special(target):
            raise UntrustedCodeError(f"fx graph: {op} target {target!r} names a special attribute; refused")
        return target
    if isinstance(target, str) and target.startswith("op:"):
        return _operator(target[3:])
    if isinstance(target, str) and target.startswith("builtin:"):
        builtin = _BUILTINS.get(target[8:])
        if builtin is None:
            raise UntrustedCodeError(f"fx graph: builtin {target[8:]!r} is never called from a capture")
        if builtin is getattr and (len(args) < 2 or _special(args[1])):
            raise UntrustedCodeError("fx graph: getattr of a special attribute (or of a computed name); refused")
        return builtin
    if callable(target):  # an import value, resolved under the import rules when it was decoded
        if target in (operator.attrgetter, operator.methodcaller):
            raise UntrustedCodeError(f"fx graph: {target!r} is never called from a capture")
        return target
    raise UntrustedCodeError(f"fx graph: call_function target {target!r} is not a function")


def _operator(name: str) -> Callable[..., object]:
    """``"aten::linear.default"`` -> ``torch.ops.aten.linear.default``, for torch's own namespaces."""
    namespace, _, rest = name.partition("::")
    op_name, _, overload = rest.partition(".")
    if namespace not in OP_NAMESPACES or not op_name.isidentifier() or (overload and not overload.isidentifier()):
        raise UntrustedCodeError(f"fx graph: operator {name!r} is not one of torch's own; refused")
    try:
        packet = getattr(getattr(torch.ops, namespace), op_name)
        return getattr(packet, overload) if overload else packet
    except (AttributeError, RuntimeError) as error:
        raise UnsupportedValueError(f"fx graph: operator {name} does not exist in torch {torch.__version__}") from error


def _resolve_refs(value: object, made: dict[str, torch.fx.Node]) -> object:
    if type(value) is dict and set(value) == {_NODE}:
        node = made.get(value[_NODE])
        if node is None:
            raise UntrustedCodeError(f"fx graph: node {value[_NODE]!r} is used before it is defined")
        return node
    if type(value) is list or type(value) is tuple:
        return type(value)(_resolve_refs(v, made) for v in value)
    if type(value) is dict:
        return {k: _resolve_refs(v, made) for k, v in value.items()}
    if type(value) is slice:
        return slice(_resolve_refs(value.start, made), _resolve_refs(value.stop, made), _resolve_refs(value.step, made))
    return value


def _decode_codegen(graph: torch.fx.Graph, data: dict[str, Any]) -> None:
    from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo
    from torch.utils._pytree import treespec_loads

    if data.get("kind") == "python":
        return
    if data.get("kind") != "pytree":
        raise UntrustedCodeError(f"fx graph: unknown code generator {data.get('kind')!r}")
    orig_args = data["orig_args"]
    if not all(isinstance(a, str) and a.isidentifier() for a in orig_args):
        raise UntrustedCodeError("fx graph: malformed argument names")
    specs = [treespec_loads(s) if s is not None else None for s in (data["in_spec"], data["out_spec"])]
    graph._codegen = _PyTreeCodeGen(_PyTreeInfo(orig_args, specs[0], specs[1]))  # type: ignore[arg-type]  # an output may have no spec


def install() -> None:
    register_codec(torch.fx.Graph, encode_graph, decode_graph, name=CODEC, subclasses=False)
    # values fx graphs hold as arguments (x.contiguous(memory_format=...), empty(layout=...))
    register_codec(torch.memory_format, lambda v: str(v).removeprefix("torch."), _torch_constant,
                   name="torch.memory_format", subclasses=False)
    register_codec(torch.layout, lambda v: str(v).removeprefix("torch."), _torch_constant,
                   name="torch.layout", subclasses=False)


def _torch_constant(cls: type, name: str) -> object:
    value = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(value, cls):
        raise UnsupportedValueError(f"torch has no {cls.__name__} {name!r}")
    return value
