"""Method entry points: targets such as ``vae:encode`` and the wrapper that records their calls.

torch's forward hooks see a module only when it is called as ``module(...)``. Users also run
modules through other methods: a VAE through ``encode``/``decode``, a flow through
``sample``/``log_prob``, an SDE through ``f``/``g``, a direct ``.forward(...)`` call, or a class's
own ``__call__`` that never reaches torch's hooks (gpytorch). A target ``PATTERN:METHOD`` names such
a method of the modules ``PATTERN`` matches (``":encode"`` is the root model's).

A method is wrapped on the module's class, not on the instance: an instance attribute would be
copied by ``copy.deepcopy`` (still bound to the original), seen by code that walks ``__dict__``,
and cannot take ``__call__`` at all (Python looks dunder methods up on the type). The wrapper
checks the instance against the targets it serves (one dict lookup) and otherwise calls the
original function, so other instances of the class run as before; it is removed again when the
capture of its last target ends, leaving the class as it was.

**A method the instance holds itself.** Some libraries bind a method to the instance in
``__init__``: torchmetrics' ``Metric`` sets ``self.update = self._wrap_update(self.update)`` (and
``compute``), a closure over the method as it was then. ``metric.update(...)`` finds that
attribute first and never reaches the class, so a target ``mse:update`` recorded nothing and said
the method was never called. Such a method is wrapped where the job finds it, on the instance
(:class:`_InstancePatch`), for the capture's time only: a copy or a pickle of the module sees the
library's own attribute, and the instance gets it back when the capture ends.
"""

from __future__ import annotations

import copy
import functools
import inspect
import threading
import types
from collections.abc import Callable
from typing import Any, SupportsIndex

import torch

from modulelens.errors import UsageError

SEPARATOR = ":"

# Handler of a wrapped call: (instance, the original function, args, kwargs) -> the call's result
Handler = Callable[[Any, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]


def split_target(pattern: str) -> tuple[str, str | None]:
    """``("vae", "encode")`` for ``"vae:encode"``; ``(pattern, None)`` for a module target.

    Example::

        split_target("vae:encode")    # ("vae", "encode")
        split_target(":sample")       # ("", "sample"): the root model's method
        split_target("blocks.*")      # ("blocks.*", None)
    """
    module_part, found, method = pattern.rpartition(SEPARATOR)
    if not found or not method.isidentifier():
        return pattern, None
    return module_part, method


def target_key(qualified: str, method: str | None) -> str:
    """The key of a target in a tracer's records: the qualified name, ``name:method`` for a method."""
    return qualified if method is None else f"{qualified}{SEPARATOR}{method}"


def target_capture_name(prefix: str, key: str) -> str:
    """The name a target's capture is saved as: ``<prefix>/<qualified name>`` (the root: ``<prefix>``),
    and for a method that name with ``.method`` (``sd/vae:encode`` -> ``sd/vae.encode``, the root's
    ``:sample`` -> ``flow.sample``): a capture name cannot hold ``:``, which separates a version.

    Example::

        target_capture_name("sd", "vae:encode")   # "sd/vae.encode"
        target_capture_name("flow", ":sample")    # "flow.sample"
    """
    qualified, method = split_target(key)
    name = f"{prefix}/{qualified}" if qualified else prefix
    return name if method is None else f"{name}.{method}"


def method_function(module: torch.nn.Module, method: str, pattern: str) -> Callable[..., object]:
    """The function a method target wraps, checked: a plain function of the module's class
    (``staticmethod``, ``classmethod`` and properties get no instance to record).

    Raises:
        UsageError: the class has no such method, or it is not a plain method.
    """
    cls = type(module)
    found = inspect.getattr_static(cls, method, None)
    if found is None:
        close = [n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n, None))
                 and method.lower() in n.lower()][:5]
        hint = f" (methods with that in their name: {', '.join(close)})" if close else ""
        raise UsageError(f"target {pattern!r}: {cls.__qualname__} has no method {method!r}{hint}")
    if not isinstance(found, types.FunctionType):
        raise UsageError(f"target {pattern!r}: {cls.__qualname__}.{method} is a {type(found).__name__}, not a "
                         "method of the instance; only methods called on the module can be recorded")
    return found


class _Patch:
    """One method of one class, wrapped while at least one target uses it."""

    def __init__(self, cls: type, name: str, original: Callable[..., object]) -> None:
        self.cls, self.name, self.original = cls, name, original
        self.owned = name in cls.__dict__  # else it is inherited: the wrapper is set on cls and deleted after
        self.handlers: dict[int, tuple[Any, Handler]] = {}  # id(instance) -> (instance, handler)

        def wrapper(instance: object, *args: object, **kwargs: object) -> object:
            found = self.handlers.get(id(instance))
            if found is None or found[0] is not instance:
                return original(instance, *args, **kwargs)
            return found[1](instance, original, args, kwargs)

        functools.update_wrapper(wrapper, original)
        wrapper.__modulelens_wrapped__ = True  # type: ignore[attr-defined]  # marks it for module_tree and users
        self.wrapper = wrapper
        setattr(cls, name, wrapper)

    def restore(self) -> None:
        if self.cls.__dict__.get(self.name) is not self.wrapper:
            return  # replaced again by someone else since: leave theirs
        if self.owned:
            setattr(self.cls, self.name, self.original)
        else:
            delattr(self.cls, self.name)


_PATCHES: dict[tuple[type, str], _Patch] = {}
_LOCK = threading.Lock()


class MethodHandle:
    """Removes one instance's handler (like a hook's ``RemovableHandle``); the class gets its method
    back when no instance is handled any longer."""

    id = -1  # not a torch hook: no hook id (Tracer._hook_ids)

    def __init__(self, patch: _Patch, instance: object) -> None:
        self._patch, self._key = patch, id(instance)

    def remove(self) -> None:
        with _LOCK:
            patch = self._patch
            patch.handlers.pop(self._key, None)
            if not patch.handlers and _PATCHES.get((patch.cls, patch.name)) is patch:
                del _PATCHES[(patch.cls, patch.name)]
                patch.restore()


class _InstancePatch:
    """A method the instance holds in its own ``__dict__`` (module docstring), sent to the handler;
    copied or pickled, what it replaced (so a copy holds the library's own attribute)."""

    id = -1  # not a torch hook (Tracer._hook_ids)

    def __init__(self, module: torch.nn.Module, name: str, original: Callable[..., object], handler: Handler) -> None:
        self.module, self.name, self.original, self.handler = module, name, original, handler
        functools.update_wrapper(self, original, updated=())  # (__name__, __doc__, __wrapped__)
        vars(module)[name] = self  # (not setattr: a Module routes tensors and modules elsewhere)

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self.handler(self.module, self._call_original, args, kwargs)

    def _call_original(self, _instance: object, *args: object, **kwargs: object) -> object:
        return self.original(*args, **kwargs)

    def __deepcopy__(self, memo: dict[int, object]) -> object:
        return copy.deepcopy(self.original, memo)

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        return self.original.__reduce_ex__(protocol)

    def remove(self) -> None:
        if vars(self.module).get(self.name) is self:  # replaced again by the job since: leave theirs
            vars(self.module)[self.name] = self.original


def wrap_method(module: torch.nn.Module, method: str, handler: Handler,
                pattern: str) -> MethodHandle | _InstancePatch:
    """Send calls of ``module.<method>(...)`` to ``handler`` until the handle is removed.

    Raises:
        UsageError: see :func:`method_function`.
    """
    cls = type(module)
    own = vars(module).get(method)
    if callable(own) and not isinstance(own, _InstancePatch):  # bound to the instance in __init__ (torchmetrics)
        method_function(module, method, pattern)  # the same checks: a method of the class
        return _InstancePatch(module, method, own, handler)
    with _LOCK:
        patch = _PATCHES.get((cls, method))
        if patch is None:
            patch = _PATCHES[(cls, method)] = _Patch(cls, method, method_function(module, method, pattern))
        patch.handlers[id(module)] = (module, handler)
    return MethodHandle(patch, module)


def own_call_class(module: torch.nn.Module) -> type | None:
    """The class whose own ``__call__`` keeps ``module(...)`` from reaching torch's
    ``Module.__call__`` (and so every forward hook), or ``None``: gpytorch's ``Module.__call__``
    calls ``self.forward`` itself. Read from the source of each ``__call__`` in the MRO above
    ``nn.Module``: one that never calls ``super().__call__`` (or torch's ``_call_impl``) ends the chain."""
    for cls in type(module).__mro__:
        if cls is torch.nn.Module:
            return None
        call = cls.__dict__.get("__call__")
        if call is None or getattr(call, "__modulelens_wrapped__", False):
            continue
        try:
            source = inspect.getsource(call)
        except (OSError, TypeError):
            return cls
        if "super(" not in source and "_call_impl" not in source:
            return cls
    return None
