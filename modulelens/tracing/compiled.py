"""How a module that ran ``torch.compile``d was compiled, so a load compiles it the same way.

Inductor rounds differently from eager (a conv + batch-norm block 1e-8 apart): a compiled module
replayed eagerly does not compute what the job computed. So the settings of its ``torch.compile``
wrapper are recorded (the backend's name and, for inductor, the options its ``mode`` set) and a
load compiles the rebuilt module with them (``module.compile(...)``, in place); the replay then runs
the kernels inductor generates from the same graph (tested bit-exact; docs/fidelity.md). Only
torch's own backends are recorded, and only inductor options from a fixed list (the ones the
``mode`` presets set): a capture never chooses a compiler command or any other setting. And
whether a target runs in a ``fullgraph=True`` graph, where its hooks cannot run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from modulelens.format.module_state import reproducible_compile


def compile_settings(wrapper: torch.nn.Module) -> dict[str, object]:
    """``{"backend", "options", "dynamic", "fullgraph"}`` of a ``torch.compile`` wrapper
    (``OptimizedModule``); ``{"backend": None}`` when they are not among those a load reproduces
    (module_state.COMPILE_BACKENDS)."""
    context = getattr(wrapper, "dynamo_ctx", None)
    backend: Any = getattr(getattr(context, "callback", None), "_torchdynamo_orig_backend", None)
    for _ in range(6):  # CatchErrorsWrapper -> ConvertFrame -> WrapBackendDebug -> the backend's wrapper
        inner = getattr(backend, "_torchdynamo_orig_backend", None)
        if inner is None or inner is backend:
            break
        backend = inner
    options = getattr(backend, "config", None) or {}
    dynamic = getattr(context, "_dynamic", None)
    settings = {"backend": getattr(backend, "compiler_name", None),
                "options": dict(options) if isinstance(options, dict) else None,
                "dynamic": dynamic if isinstance(dynamic, bool) else None,
                "fullgraph": bool(getattr(context, "fullgraph", False))}
    return settings if reproducible_compile(settings) else {"backend": None}


def wrapper_of(model: torch.nn.Module, module: torch.nn.Module) -> torch.nn.Module | None:
    """The ``torch.compile`` wrapper of ``module`` in ``model`` (``model`` itself or a child), if any."""
    for candidate, _context, compiled in _compiled_modules(model):
        if candidate is not compiled and compiled is module:
            return candidate
    return None


def one_graph_around(model: torch.nn.Module, module: torch.nn.Module) -> torch.nn.Module | None:
    """The module of ``model`` compiled with ``fullgraph=True`` (a ``torch.compile`` wrapper, or a
    module compiled in place by ``module.compile(...)``) whose graph ``module`` runs in, if any.
    The tracer's hooks run eagerly at graph breaks (tracing/module_hooks.py), which fullgraph
    refuses: the job's next call would stop with dynamo's error."""
    for candidate, context, compiled in _compiled_modules(model):
        if getattr(context, "fullgraph", False) is True and any(m is module for m in compiled.modules()):
            return candidate
    return None


def _compiled_modules(model: torch.nn.Module) -> Iterator[tuple[torch.nn.Module, object, torch.nn.Module]]:
    """``(module, its torch.compile context, the module compiled)`` for each compiled module of
    ``model``: a wrapper (``OptimizedModule``, which compiles its ``_orig_mod``), or a module compiled
    in place (``module.compile(...)``: its ``_call_impl``, by a closure over the context)."""
    for candidate in model.modules():
        if type(candidate).__name__ == "OptimizedModule":
            inner = vars(candidate).get("_modules", {}).get("_orig_mod")
            if isinstance(inner, torch.nn.Module):
                yield candidate, getattr(candidate, "dynamo_ctx", None), inner
        else:
            compiled_call = vars(candidate).get("_compiled_call_impl")
            if compiled_call is not None:
                yield candidate, _closure_context(compiled_call), candidate


def _closure_context(compiled: object) -> object:
    """The ``torch.compile`` context a compiled function closes over (named ``self`` in torch's
    wrapper), or ``None``."""
    code, cells = getattr(compiled, "__code__", None), getattr(compiled, "__closure__", None)
    if code is None or not cells:
        return None
    for name, cell in zip(code.co_freevars, cells, strict=False):
        if name == "self":
            try:
                return cell.cell_contents
            except ValueError:  # an empty cell
                return None
    return None
