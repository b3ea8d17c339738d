"""The hooks the tracer puts on a user's modules: forward hooks (TorchScript modules too), and
a ``load_state_dict`` pre-hook, each of which leaves the module as copyable and picklable as before.

**TorchScript.** ``register_forward_pre_hook`` and ``register_forward_hook`` raise on a
``ScriptModule`` ("is not supported on ScriptModules"), yet calling one from Python goes through
``nn.Module.__call__``, which runs the hook tables like any module's. So a scripted or traced
module can be a capture target: the tracer's hooks are put into those tables the way the register
methods would (a ``RemovableHandle`` over the same dicts, so ``handle.remove()`` works as usual).
Every other module uses torch's own methods.

**Copies and pickles.** A hook lives in the module's own tables, so whatever copies the module
copies it: a job that saves a whole model (``torch.save(model, path)``) while a capture records
failed with "Can't pickle local object", and a ``copy.deepcopy`` of the model (an EMA copy, the
best model so far) had its calls recorded as the target's own. Each hook is a :class:`_ModuleHook`:
it runs only for the module it was put on, and a copy or a pickle of it is a no-op of the standard
library's (``contextlib.nullcontext().__exit__``, which takes any arguments and returns ``None``),
so a model saved during a capture loads where modulelens is not installed. The copy keeps that
no-op in its tables (nothing can take it out); a capture of the copy passes over it, as a capture
passes over another capture's hooks on the same module (:func:`is_modulelens_hook`).

**``torch.jit.script`` of a hooked module.** Scripting compiles every forward hook in a module's
tables (``torch.jit._recursive.get_hook_stubs``), and ours are Python objects, not TorchScript: a
job that scripted its model for export while a capture recorded stopped with an error. Once the
tracer has put a hook anywhere, that function sees each module's tables without ours (nor the
no-ops of copies), so the scripted module compiles the job's own hooks only and, as a copy, is not
recorded.

**``torch.compile``.** A hook that torch.compile traces runs inside the compiled graph, where the
tracer's reads of values, its locks and its copies do not belong: each hook runs eagerly at a graph
break instead (:func:`run_eagerly`), whichever came first, the capture or the compile. A graph
compiled with ``fullgraph=True`` refuses that break (the job's call stopped with dynamo's error):
there the hook does nothing and says so once.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, cast

import torch
from torch.utils.hooks import RemovableHandle


class _RunEagerly:
    """``fn``, run eagerly where torch.compile traces a call of it (:func:`run_eagerly`)."""

    __slots__ = ("__weakref__", "fn", "in_whole_graph")

    def __init__(self, fn: Callable[..., object], in_whole_graph: Callable[[], object]) -> None:
        self.fn = fn
        self.in_whole_graph = in_whole_graph

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self.fn(*args, **kwargs)


_waiting_for_dynamo: weakref.WeakSet[_RunEagerly] = weakref.WeakSet()
_waiting_lock = threading.Lock()


_Function = TypeVar("_Function", bound=Callable[..., object])


def run_eagerly(fn: _Function, in_whole_graph: Callable[[], object]) -> _Function:
    """``fn`` wrapped by ``torch.compiler.disable``: where torch.compile traces it, a graph break,
    and ``fn`` runs eagerly (nothing it calls is compiled). That import of ``torch._dynamo`` took
    ~8 s on the first capture of a process that compiles nothing (issue 11), so until the job
    imports it, ``fn`` is plain and is wrapped the moment it is imported (a post-import hook). A
    job that compiled its model after the capture attached (``torch.compile`` inside ``with
    capture(model)``; under ``modulelens run``, a model called once eagerly before it is compiled)
    had the plain hooks traced into its graph, and every target dropped.

    Where the graph being compiled may not break (``fullgraph=True``), a call of ``fn`` is
    ``None`` instead, and ``in_whole_graph()`` is called at that compile (:func:`_outside_whole_graphs`).
    """
    eager = _RunEagerly(fn, in_whole_graph)
    with _waiting_lock:  # (the check and the add at once: _disable_waiting takes the waiting under it)
        waits = "torch._dynamo" not in sys.modules
        if waits:
            _waiting_for_dynamo.add(eager)
            first = len(_waiting_for_dynamo) == 1
    if not waits:
        return cast(_Function, _outside_whole_graphs(fn, in_whole_graph))  # no object around it: a frame less
    if first:  # (outside the lock: wrapt calls the hook at once if torch._dynamo was imported since)
        import wrapt  # here: a capture that compiles nothing never needs it

        wrapt.register_post_import_hook(_disable_waiting, "torch._dynamo")
    return cast(_Function, eager)


def _disable_waiting(_dynamo: object) -> None:
    """Wrap the waiting hooks. Never raises: an exception here would fail the job's import of
    ``torch._dynamo`` (wrapt passes it on); a hook left plain is traced as before."""
    with _waiting_lock:
        waiting = list(_waiting_for_dynamo)
        _waiting_for_dynamo.clear()
    for eager in waiting:
        try:
            eager.fn = _outside_whole_graphs(eager.fn, eager.in_whole_graph)
        except Exception:  # fail open: this one stays plain
            continue


def _outside_whole_graphs(fn: Callable[..., object], in_whole_graph: Callable[[], object]) -> Callable[..., object]:
    """``fn`` run eagerly at a graph break where torch.compile traces it; where the graph may not
    break (``fullgraph=True``, or the job's ``torch._dynamo.error_on_graph_break``), skipped.

    Dynamo runs a function marked ``assume_constant_result`` while it traces and compiles its
    result in as a constant, so the test below costs the compiled graph nothing and picks the
    branch per compile: a graph that may break calls ``fn`` eagerly, a whole graph never does.
    Run eagerly, the test is one read of a thread-local (no compile is tracing)."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)  # torch.compiler.disable: torch >= 2.1
    if disable is None:
        return fn
    eager = disable(fn)
    from torch._dynamo import symbolic_convert  # imported by now: this runs once the job imported torch._dynamo

    def whole_graph_traced() -> bool:
        try:
            tracing = getattr(symbolic_convert.tls, "current_tx", None)
            whole = bool(getattr(tracing, "one_graph", False) or getattr(tracing, "error_on_graph_break", False))
        except Exception:  # a torch without these: the hook breaks the graph as before
            return False
        if whole:
            with contextlib.suppress(Exception):  # fail open: the compile goes on
                in_whole_graph()
        return whole

    whole_graph_traced._dynamo_marked_constant = True  # type: ignore[attr-defined]  # torch._dynamo.assume_constant_result

    def outside_whole_graphs(*args: object, **kwargs: object) -> object:
        return None if whole_graph_traced() else eager(*args, **kwargs)

    return outside_whole_graphs


class _ModuleHook:
    """``hook``, run only when the module it was put on is the one called (a shallow copy of a
    module shares its hook tables) or one of ``nn.DataParallel``'s replicas of it (whose calls are
    the target's, on each device); copied or pickled, a no-op (module docstring)."""

    __slots__ = ("hook", "owner")

    def __init__(self, module: torch.nn.Module, hook: Callable[..., object]) -> None:
        self.hook = hook
        self.owner = weakref.ref(module)

    def __call__(self, module: torch.nn.Module, *args: Any) -> object:
        if module is not self.owner() and not getattr(module, "_is_replica", False):
            return None  # a shallow copy; nn.DataParallel's replicas (shallow copies too) run the target
        return self.hook(module, *args)

    def __reduce__(self) -> tuple[Any, ...]:
        return getattr, (contextlib.nullcontext(), "__exit__")


def is_modulelens_hook(hook: object) -> bool:
    """Whether ``hook`` is one of these (another capture's, on the same module) or what a copy or a
    pickle of one became (a no-op): not the job's, so a capture passes over it, as over a hook a
    rebuild need not register."""
    return isinstance(hook, _ModuleHook) or getattr(hook, "__func__", None) is contextlib.nullcontext.__exit__


def forward_pre_hook(module: torch.nn.Module, hook: Callable[..., object], *, prepend: bool = False,
                     with_kwargs: bool = False) -> RemovableHandle:
    """``module.register_forward_pre_hook(hook, prepend=..., with_kwargs=...)``, TorchScript modules too."""
    hook = _ModuleHook(module, hook)
    _hide_from_torchscript()
    if not isinstance(module, torch.jit.ScriptModule):
        return module.register_forward_pre_hook(hook, prepend=prepend, with_kwargs=with_kwargs)
    handle = RemovableHandle(module._forward_pre_hooks, extra_dict=module._forward_pre_hooks_with_kwargs)
    _insert(module._forward_pre_hooks, handle.id, hook, prepend)
    if with_kwargs:
        module._forward_pre_hooks_with_kwargs[handle.id] = True
    return handle


def forward_hook(module: torch.nn.Module, hook: Callable[..., object], *, prepend: bool = False,
                 with_kwargs: bool = False, always_call: bool = False) -> RemovableHandle:
    """``module.register_forward_hook(hook, ...)``, TorchScript modules too."""
    hook = _ModuleHook(module, hook)
    _hide_from_torchscript()
    if not isinstance(module, torch.jit.ScriptModule):
        return module.register_forward_hook(hook, prepend=prepend, with_kwargs=with_kwargs, always_call=always_call)
    handle = RemovableHandle(module._forward_hooks, extra_dict=[module._forward_hooks_with_kwargs,
                                                                module._forward_hooks_always_called])
    _insert(module._forward_hooks, handle.id, hook, prepend)
    if with_kwargs:
        module._forward_hooks_with_kwargs[handle.id] = True
    if always_call:
        module._forward_hooks_always_called[handle.id] = True
    return handle


def load_state_dict_pre_hook(module: torch.nn.Module, hook: Callable[..., object]) -> RemovableHandle:
    """``module.register_load_state_dict_pre_hook(hook)``: runs before a ``load_state_dict`` reaches
    ``module`` (called on it or on a module holding it). Through the private method that the public
    one calls: the public one came with torch 2.5, and modulelens supports 2.4. A module that takes
    no such hook (a TorchScript module raises "not supported on ScriptModules") gets none: a handle
    whose removal does nothing."""
    try:
        return module._register_load_state_dict_pre_hook(_ModuleHook(module, hook), with_module=True)
    except (RuntimeError, AttributeError, TypeError):
        return RemovableHandle(collections.OrderedDict())  # (a plain dict takes no weak reference)


def move_hooks(module: torch.nn.Module, handles: Iterable[object], *, outermost: bool) -> bool:
    """Put the forward hooks of ``handles`` (found by their ids; other handles are passed over)
    outermost among ``module``'s hooks (pre-hook first, forward hook last: the call as the parent
    sees it) or innermost (pre-hook last, forward hook first: what forward itself sees, after
    tensor parallel's hooks, tracing/distributed.py), where hooks the job added since moved them.
    Returns whether one had to move."""
    moved = False
    pre_hooks, post_hooks = module._forward_pre_hooks, module._forward_hooks
    for handle in handles:
        key = getattr(handle, "id", None)
        if key in pre_hooks and next(iter(pre_hooks) if outermost else reversed(pre_hooks)) != key:
            pre_hooks.move_to_end(key, last=not outermost)  # type: ignore[attr-defined]  # torch's stubs say dict: an OrderedDict
            moved = True
        if key in post_hooks and next(reversed(post_hooks) if outermost else iter(post_hooks)) != key:
            post_hooks.move_to_end(key, last=outermost)  # type: ignore[attr-defined]  # as above
            moved = True
    return moved


def _insert(table: dict[int, Callable[..., object]], key: int, hook: Callable[..., object], prepend: bool) -> None:
    table[key] = hook
    if prepend:
        table.move_to_end(key, last=False)  # type: ignore[attr-defined]  # torch's stubs say dict: an OrderedDict


def _hide_from_torchscript() -> None:
    """Make ``torch.jit.script`` compile a module's hooks without ours (module docstring); once."""
    recursive: Any = getattr(torch.jit, "_recursive", None)
    compile_hooks = getattr(recursive, "get_hook_stubs", None)
    if compile_hooks is None or getattr(compile_hooks, "__modulelens_wrapped__", False):
        return  # (a torch without that private function: scripting a hooked model fails as before)

    @functools.wraps(compile_hooks)
    def get_hook_stubs(nn_module: torch.nn.Module) -> Any:
        with _without_ours(nn_module):
            return compile_hooks(nn_module)

    get_hook_stubs.__modulelens_wrapped__ = True  # type: ignore[attr-defined]
    recursive.get_hook_stubs = get_hook_stubs


@contextlib.contextmanager
def _without_ours(module: torch.nn.Module) -> Iterator[None]:
    """``module``'s forward hook tables without our hooks for the time of the block; then ours are
    back where they were (a hook the job added meanwhile comes before them)."""
    tables = [module._forward_pre_hooks, module._forward_hooks]
    taken = [[(key, hook) for key, hook in table.items() if is_modulelens_hook(hook)] for table in tables]
    order = [list(table) for table in tables]
    for table, ours in zip(tables, taken, strict=True):
        for key, _ in ours:
            del table[key]
    try:
        yield
    finally:
        for table, ours, keys in zip(tables, taken, order, strict=True):
            table.update(ours)
            for key in keys:
                if key in table:
                    table.move_to_end(key)  # type: ignore[attr-defined]  # torch's stubs say dict: an OrderedDict
