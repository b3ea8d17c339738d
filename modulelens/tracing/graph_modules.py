"""``GraphModule``s recorded as their graph and the objects it names (issue 34, defect 3).

A ``torch.fx.GraphModule`` (``symbolic_trace``, ``torch.export(...).module()``, quantization's
``prepare_fx``) is an instance of a class fx generates for it (``GraphModuleImpl``, not importable)
whose ``forward`` is code generated from its graph. Its recorded constructor arguments, when there
are any, name the module it was traced from and a graph that later passes may have changed. So its
construction is recorded as what rebuilds it as it is when it runs: ``GraphModule(root, graph,
class_name)`` with ``graph`` its current graph (format/fx_codecs.py) and ``root`` a dict of the
submodules, parameters and buffers the graph uses, by target, each a module of its own record or a
recorded tensor. The class is the GraphModule subclass it was built as, or ``GraphModule`` itself
where that class is one the import rules never resolve (``torch.export``'s
``_StatefulGraphModule``; its forward is the same generated code). ``torch.export``'s guard check
(``_guards_fn``, a module whose forward is code ``torch.export`` generated, with no users in the
graph) is left out: the rebuilt module computes the same and does not check its inputs' shapes.
"""

from __future__ import annotations

import copy
from typing import cast

import torch

from modulelens.errors import UnsupportedValueError
from modulelens.format.imports import module_denied


def is_graph_module(module: torch.nn.Module) -> bool:
    """A GraphModule, or a module of ``torch.export.unflatten`` (an ``UnflattenedModule`` and its
    ``InterpreterModule``s run a graph the same way, through an interpreter)."""
    return isinstance(module, torch.fx.GraphModule) or _unflattened_kind(module) is not None


def _unflattened_kind(module: torch.nn.Module) -> str | None:
    cls = type(module)
    if cls.__module__ == "torch.export.unflatten" and cls.__name__ in ("UnflattenedModule", "InterpreterModule"):
        return cls.__name__
    return None


def graph_module_construction(module: torch.nn.Module, cls: type) -> tuple[type, tuple[object, ...], dict[str, object]]:
    """``(class, args, kwargs)`` that rebuild ``module`` (``cls``: the class it was constructed as)."""
    graph = cast(torch.fx.Graph, module.graph)
    guards = [node for node in graph.nodes if node.op == "call_module" and not node.users
              and _is_guards(module, node.target)]
    unflattened = _unflattened_kind(module) == "UnflattenedModule"
    if guards or unflattened:  # a copy: the job's graph is never changed
        graph = copy.deepcopy(graph)
        for node in [n for n in graph.nodes if n.name in {g.name for g in guards}]:
            graph.erase_node(node)
        if unflattened:  # it flattens its inputs and unflattens its output itself: the same, as code
            graph._codegen = _pytree_codegen(module)
    root = {node.target: _attribute(module, node.target) for node in graph.nodes if node.op in ("get_attr", "call_module")}
    if module_denied(cls.__module__) or not _constructed_like_graph_module(cls):
        cls = torch.fx.GraphModule
    return cls, (root, graph), {"class_name": type(module).__name__}


def _constructed_like_graph_module(cls: type) -> bool:
    """Whether ``cls`` is a GraphModule subclass built by GraphModule's own ``__init__(root, graph,
    class_name)`` (a subclass with its own, such as e3nn's ``Legendre``, is rebuilt as a GraphModule:
    its forward is the same generated code)."""
    if not (isinstance(cls, type) and issubclass(cls, torch.fx.GraphModule)):
        return False
    return all("__init__" not in vars(base) for base in cls.__mro__[:cls.__mro__.index(torch.fx.GraphModule)])


def _pytree_codegen(module: torch.nn.Module) -> torch.fx.graph._PyTreeCodeGen:
    """The code generator of exported programs (``ep.module()``'s) for an ``UnflattenedModule``:
    its inputs flattened and its output unflattened by the specs of its call signature."""
    from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo

    signature = module.module_call_graph[0].signature  # type: ignore[index, union-attr]  # torch.export's own
    in_spec = signature.in_spec
    if in_spec.type is not tuple or len(in_spec.children_specs) != 2 or in_spec.children_specs[1].type is not dict:
        raise UnsupportedValueError(f"an unflattened module whose inputs are {in_spec} is not stored")
    positional, keywords = in_spec.children_specs
    names = [f"arg{i}" for i in range(positional.num_children)] + list(keywords.context)
    return _PyTreeCodeGen(_PyTreeInfo(names, in_spec, signature.out_spec))


def _attribute(module: torch.nn.Module, target: str) -> object:
    owner: object = module
    for part in target.split("."):
        owner = getattr(owner, part)
    return owner


def _is_guards(module: torch.nn.Module, target: object) -> bool:
    if not isinstance(target, str):  # fx's call_module targets are names; anything else is no guard
        return False
    try:
        found = _attribute(module, target)
    except AttributeError:
        return False
    return is_export_guards(found)


def is_export_guards(module: object) -> bool:
    """Whether ``module`` is ``torch.export``'s guard check (``_guards_fn``), which is not rebuilt."""
    return type(module).__name__ == "GuardsFn" and type(module).__module__ == "torch.export._unlift"
