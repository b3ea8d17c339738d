"""Record the constructor arguments of every ``nn.Module`` built while tracking is on.

``nn.Module.__new__`` is replaced by a function that receives the same arguments as ``__init__``
and notes them for the new instance. Only the outermost class is seen (a subclass calling
``super().__init__`` is not recorded twice) and no user code changes.

The records live in a side table keyed by the module's identity, never in the module itself:
frameworks walk their modules' ``__dict__`` (Lightning's ``apply_to_collection`` over a
``ResultMetric`` rejects the frozen record it found there and killed the training job, issue 22),
pickle it, or compare it. An entry holds a weak reference to its module, whose callback removes the
entry, so a record lives exactly as long as its module; keying by ``id`` works for modules that
define ``__eq__`` without ``__hash__`` (unhashable). A module copied with ``copy.deepcopy`` or
``copy.copy`` (torchtune clones its layers this way) gets the record of the module it was copied
from: the copy is made by ``cls.__new__(cls)`` without arguments, called from ``copy._reconstruct``
(or a class's own ``__deepcopy__``), and the original is read from that frame. The cost is one
extra Python call and one weak reference per construction (see benchmarks/bench_capture.py).

Argument containers (lists, dicts, tuples, sets) are copied all the way down when the module is
built, before its ``__init__`` runs, so a builder that pops keys from its argument dicts (timm's
EfficientNet/MobileNetV3 block args) or a caller that reuses them does not change what is rebuilt.
Plain objects (configs, dataclasses) are copied later, at the first recorded call
(:func:`freeze_objects`); tensors, modules, classes and functions stay references (the state a
capture records supersedes a tensor's constructor value). Scalar-only arguments cost one loop.

A class with its own ``__new__`` (tensordict's ``TensorDictModuleBase``, neuraloperator's
``BaseModel``, torch.fx's ``GraphModule``) receives the constructor arguments there and calls the
tracked ``__new__`` without them, so its own ``__new__`` is wrapped instead: the wrapper records the
arguments it was given once the class's ``__new__`` returns (an instance of the class, or of a
subclass it generated: fx makes a ``GraphModuleImpl`` per instance). Classes that exist when
tracking starts are wrapped then, later ones when they are defined (``nn.Module.__init_subclass__``).
A module whose construction modulelens could not see gets the reason instead of a record
(:func:`construction_missing`), so a failed rebuild says what really happened.

Once installed, the replacement ``__new__`` stays for the life of the process and turning tracking
off only flips a flag: CPython cannot put ``object.__new__`` back into the slots of subclasses
that were created or updated meanwhile (they would then reject constructor arguments).
"""

from __future__ import annotations

import copy
import copyreg
import dataclasses
import enum
import functools
import inspect
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
from torch.jit._script import ScriptMeta
from torch.nn.modules.module import register_module_module_registration_hook
from torch.utils.hooks import RemovableHandle

from modulelens.format.values import has_codec

_lock = threading.Lock()
_registration_hook: Any = None
_enabled = False
_object_new = object.__new__


@dataclass(frozen=True)
class InitRecord:
    """The positional and keyword arguments a module was constructed with."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


_SCALARS = frozenset({int, float, str, bool, type(None), bytes, complex, torch.dtype, torch.device})
_CONTAINERS = frozenset({tuple, list, dict, set, frozenset})


class _Entry(weakref.ref[Any]):
    """A module's record, held by a weak reference to the module (its callback drops the entry).

    ``hooks_from``/``hooks_to`` bound the ids of the hooks its construction registered (torch numbers
    every hook handle from one counter): from the counter when ``__new__`` ran to the counter when the
    module was first registered as another module's child (``None`` until then). Hooks outside that
    span were added after construction and are not rebuilt with it (``tracing/module_tree.py``).
    """

    __slots__ = ("built", "hooks_from", "hooks_to", "key", "made_by", "missing", "record", "traced_training")
    key: int
    record: InitRecord | None  # None: the construction was seen but its arguments were not (``missing`` says why)
    missing: str | None
    made_by: str | None  # a tool that made it from the module ``record`` built (``"torch.jit.script"``)
    traced_training: bool | None  # torch.jit.trace: the mode its graph was traced in (the graph keeps it)
    hooks_from: int
    hooks_to: int | None
    built: type

    def __new__(cls, module: object, record: InitRecord | None, key: int) -> _Entry:
        self = super().__new__(cls, module, _forget)
        self.key, self.record, self.missing, self.made_by, self.traced_training = key, record, None, None, None
        self.hooks_from, self.hooks_to = RemovableHandle.next_id, None
        self.built = type(module)  # the class the arguments are for (a lazy module changes its class later)
        return self

    def __init__(self, module: object, record: InitRecord | None, key: int) -> None:
        super().__init__(module, _forget)  # type: ignore[call-arg]  # typeshed omits weakref.ref.__init__


# id(module) -> its entry. A lookup checks the reference, so a reused id never finds another's record.
_RECORDS: dict[int, _Entry] = {}


def _forget(ref: _Entry) -> None:
    if _RECORDS.get(ref.key) is ref:
        del _RECORDS[ref.key]


def _remember(module: object, record: InitRecord | None) -> _Entry | None:
    key = id(module)
    earlier = _RECORDS.get(key)
    try:
        entry = _RECORDS[key] = _Entry(module, record, key)
    except TypeError:  # not weakly referenceable (every nn.Module is; a C subclass might not be)
        return None
    if earlier is not None and earlier() is module:  # an inner __new__ recorded it first: its hooks count from there
        entry.hooks_from = earlier.hooks_from
    return entry


def _remember_missing(module: object, reason: str) -> None:
    entry = _remember(module, None)
    if entry is not None:
        entry.missing = reason


def _on_registered(parent: torch.nn.Module, name: str, child: torch.nn.Module | None) -> None:
    """torch's global module-registration hook: ``child`` became a child of ``parent``, so its own
    construction is over (the first time only: a later move keeps the first boundary)."""
    entry = _RECORDS.get(id(child))
    if entry is not None and entry.hooks_to is None and entry() is child:
        entry.hooks_to = RemovableHandle.next_id


def _recording_new(cls: type[torch.nn.Module], *args: object, **kwargs: object) -> torch.nn.Module:
    instance: Any = _object_new(cls)
    if _enabled:
        try:
            # A class with its own __new__ calls us with other arguments than __init__ gets (usually
            # none): its wrapper (_wrap_own_new) records them once that __new__ returns.
            new = cls.__new__
            if new is _recording_new:
                _record(instance, cls, args, kwargs, sys._getframe(1))
            elif getattr(new, "__wrapped__", None) is _recording_new:  # @deprecated (it passes the arguments on)
                _record(instance, cls, args, kwargs, sys._getframe(2))
            elif not getattr(new, _OWN_NEW_WRAPPED, False):  # a __new__ defined where no hook saw it
                _wrap_own_new(_defining_class(cls, new))  # its later instances are recorded
                _remember_missing(instance, f"its class's own __new__ ({getattr(new, '__qualname__', new)}) was not "
                                            "followed yet when it was built (the next instances are recorded)")
        except Exception as error:  # fail open: the user's module is built whatever happens here
            _remember_missing(instance, f"recording its construction failed ({type(error).__name__}: {error})")
    return instance


def _record(instance: object, cls: type, args: tuple[object, ...], kwargs: dict[str, object], caller: FrameType) -> None:
    """Note ``instance``'s constructor arguments (``caller``: the frame that asked for it)."""
    if type(cls) is not type and isinstance(cls, ScriptMeta):  # a TorchScript module (its metaclass)
        _record_scripted(instance, args, caller)
        return
    if not args and not kwargs:
        original = _copied_from(cls, caller)
        if original is not None:  # a copy is not constructed: it gets its original's record
            entry = _entry(original)
            if entry is not None:  # its hooks are copies too, with the original's ids
                copied = _remember(instance, entry.record)
                if copied is not None:
                    copied.hooks_from, copied.hooks_to, copied.built = entry.hooks_from, entry.hooks_to, entry.built
                    copied.missing = entry.missing
            return
        if _needs_arguments(cls):  # not constructed by calling its class: unpickled, or made by a tool
            _remember_missing(instance, f"it was not constructed by calling {cls.__qualname__}(...) (made without "
                                        "its constructor: unpickled, or created by a tool)")
            return
    # Inline loops: the cheapest scan measured for the common scalar-only case (issue 11 budget)
    for value in args:
        if type(value) in _CONTAINERS:
            args, kwargs = _copy_containers(args), _copy_containers(kwargs)
            break
    else:
        for value in kwargs.values():
            if type(value) in _CONTAINERS:
                kwargs = _copy_containers(kwargs)
                break
    _remember(instance, InitRecord(args, kwargs))


_OWN_NEW_WRAPPED = "__modulelens_own_new__"


def _tracked(deprecated_new: Callable[[type], object]) -> Callable[..., Any]:
    def __new__(cls: type, *args: object, **kwargs: object) -> object:  # noqa: N807 - replaces a __new__
        instance = deprecated_new(cls)  # its deprecation warning, then object.__new__
        if _enabled:
            try:
                _record(instance, cls, args, kwargs, sys._getframe(1))
            except Exception as error:  # fail open, as in _recording_new
                _remember_missing(instance, f"recording its construction failed ({type(error).__name__}: {error})")
        return instance

    setattr(__new__, _OWN_NEW_WRAPPED, True)
    return __new__


def _record_scripted(instance: object, args: tuple[object, ...], caller: FrameType | None) -> None:
    """A TorchScript module is constructed from a C++ module, which no record rebuilds: it gets the
    record of the eager module it was made from, marked with the tool (``constructed_as`` is that
    module's class), so a load rebuilds the eager module, which runs the same operations.
    ``torch.jit.trace`` passes the eager module to ``TracedModule(orig, ...)``; ``torch.jit.script``
    makes each module in ``create_script_module_impl(nn_module, ...)``, found among the callers."""
    if args and isinstance(args[0], torch.nn.Module) and not isinstance(args[0], torch.jit.ScriptModule):
        original, tool = args[0], "torch.jit.trace"
    else:
        original, tool, frame = None, "torch.jit.script", caller
        for _ in range(8):
            if frame is None:
                break
            if frame.f_code.co_name == "create_script_module_impl" and "nn_module" in frame.f_code.co_varnames:
                original = frame.f_locals.get("nn_module")
                break
            frame = frame.f_back
    entry = _entry(original) if isinstance(original, torch.nn.Module) else None
    if entry is None or entry.record is None:
        why = (f"it was made by {tool} from a {type(original).__qualname__} whose construction modulelens did not "
               f"see ({entry.missing if entry is not None and entry.missing else 'built before track_init() was on'})"
               if isinstance(original, torch.nn.Module) else
               "it is a TorchScript module not made from a Python module here (torch.jit.load?): no Python class "
               "rebuilds it")
        _remember_missing(instance, why)
        return
    made = _remember(instance, entry.record)
    if made is not None:
        made.built, made.made_by = entry.built, tool
        made.hooks_from, made.hooks_to = entry.hooks_from, entry.hooks_to
        if tool == "torch.jit.trace" and original is not None:  # its graph keeps this mode whatever .train() says
            made.traced_training = bool(original.training)


def _track_own_new_classes() -> None:
    """Wrap the ``__new__`` of every existing ``nn.Module`` subclass that defines its own (and the
    ``@deprecated`` wrappers, :func:`_track_deprecated_classes`); later classes are wrapped when
    defined (:func:`_on_subclass`)."""
    pending = list(torch.nn.Module.__subclasses__())
    seen: set[type] = set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        pending.extend(cls.__subclasses__())
        _wrap_own_new(cls)


def _on_subclass(cls: type, **kwargs: object) -> None:
    """``nn.Module.__init_subclass__`` while tracking is installed: a new class's own ``__new__``."""
    super(torch.nn.Module, cls).__init_subclass__(**kwargs)  # type: ignore[misc]  # object's, which takes none
    _wrap_own_new(cls)


def _defining_class(cls: type, new: object) -> type:
    """The class in ``cls``'s MRO whose own ``__new__`` is ``new``."""
    function = getattr(new, "__func__", new)
    for base in cls.__mro__:
        own = base.__dict__.get("__new__")
        if own is not None and getattr(own, "__func__", own) is function:
            return base
    return cls


def _wrap_own_new(cls: type) -> None:
    """Record the constructor arguments of ``cls``'s instances in its own ``__new__`` (if it has one).

    ``typing_extensions.deprecated`` (``warnings.deprecated``) replaces a class's ``__new__`` by a
    wrapper that warns and then calls the ``__new__`` the class had when it was decorated; for a
    class decorated when torch was imported (``nn.NLLLoss2d``) that is ``object.__new__``, so the
    tracked ``__new__`` never ran (found by the census). Such a wrapper is wrapped once more: it
    warns as before, and the arguments are recorded. One decorated later wraps the tracked
    ``__new__`` and passes the arguments on to it (:func:`_recording_new` reads them there).
    """
    new = cls.__dict__.get("__new__")
    function = getattr(new, "__func__", new)
    if function is None or function is _recording_new or getattr(function, _OWN_NEW_WRAPPED, False) \
            or not callable(function) or getattr(function, "__wrapped__", None) is _recording_new:
        return
    code = getattr(function, "__code__", None)  # functools.wraps gave it object.__new__'s names
    if getattr(function, "__wrapped__", None) is object.__new__ and code is not None and \
            "original_new" in code.co_freevars:
        cls.__new__ = staticmethod(_tracked(function))  # type: ignore[method-assign]
        return

    @functools.wraps(function)
    def __new__(klass: type, *args: object, **kwargs: object) -> object:  # noqa: N807 - replaces a __new__
        instance = function(klass, *args, **kwargs)
        if _enabled and isinstance(instance, klass):
            # the arguments as the caller passed them (the class's __new__ may have changed its own
            # copy: neuraloperator's adds its defaults to kwargs); the class the caller asked for
            # (fx's GraphModule returns an instance of a class it generated for it)
            try:
                _record(instance, klass, args, kwargs, sys._getframe(1))
                entry = _entry(instance)
                if entry is not None and entry.made_by is None:
                    entry.built = klass
            except Exception as error:  # fail open, as in _recording_new
                _remember_missing(instance, f"recording its construction failed ({type(error).__name__}: {error})")
        return instance

    setattr(__new__, _OWN_NEW_WRAPPED, True)
    cls.__new__ = staticmethod(__new__)  # type: ignore[method-assign, assignment]  # mypy reads it as type.__new__


@functools.lru_cache(maxsize=4096)
def _needs_arguments(cls: type) -> bool:
    """Whether ``cls(...)`` cannot be called without arguments (its ``__init__`` has required ones)."""
    try:
        init = next(vars(base)["__init__"] for base in cls.__mro__ if "__init__" in vars(base))
        parameters = list(inspect.signature(init).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    return any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               for p in parameters)


_NEWOBJ_CODE = copyreg.__newobj__.__code__  # type: ignore[attr-defined]  # typeshed omits copyreg.__newobj__
_RECONSTRUCT_CODE = copy._reconstruct.__code__  # type: ignore[attr-defined]  # private: typeshed omits it
_COPY_METHODS = frozenset({"__deepcopy__", "__copy__", "default_deepcopy"})  # default_deepcopy: torch parametrize


def _copied_from(cls: type, caller: FrameType) -> object:
    """The module being copied when ``cls.__new__(cls)`` is called by a copy, else ``None``.

    ``copy.deepcopy``/``copy.copy`` call ``copyreg.__newobj__(cls)`` from ``copy._reconstruct(x,
    ...)``, whose ``x`` is the original; a class's own ``__deepcopy__`` (torch's parametrized
    modules) calls ``self.__new__(cls)`` with ``self`` the original. Only frame identities are
    compared on the way, so a plain ``nn.ReLU()`` costs two attribute reads.
    """
    if caller.f_code is _NEWOBJ_CODE:
        outer = caller.f_back
        if outer is not None and outer.f_code is _RECONSTRUCT_CODE:
            original = outer.f_locals.get("x")
            return original if type(original) is cls else None
        return None
    if caller.f_code.co_name in _COPY_METHODS:
        original = caller.f_locals.get("self")
        return original if type(original) is cls else None
    return None


def _copy_containers(value: Any) -> Any:
    """``value`` with its lists, dicts, tuples and sets copied all the way down (other objects are
    the same objects: see :func:`freeze_objects`)."""
    kind = type(value)
    if kind is dict:
        return {k: _copy_containers(v) if type(v) in _CONTAINERS else v for k, v in value.items()}
    if kind in _CONTAINERS:
        return kind([_copy_containers(v) if type(v) in _CONTAINERS else v for v in value])
    return value


def freeze_objects(record: InitRecord) -> InitRecord:
    """``record`` with its plain objects (configs, dataclasses, named tuples: what a codec encodes)
    deep-copied as they are now.

    The tracer calls this at a target's first recorded call, not at construction: a module keeps
    its config object and reads it when it runs, and frameworks finish configs after the modules
    are built (transformers sets ``config._attn_implementation`` once the whole model exists), so
    the config as it was when the call ran is what rebuilds the module that made that call.
    """
    return InitRecord(_freeze(record.args), _freeze(record.kwargs))


def _freeze(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind in _CONTAINERS:
        items = value.items() if kind is dict else None
        if items is not None:
            return {k: _freeze(v) for k, v in items}
        return kind(_freeze(v) for v in value)
    if isinstance(value, (torch.Tensor, torch.nn.Module, type, enum.Enum)) or callable(value):
        return value
    if dataclasses.is_dataclass(value) or isinstance(value, tuple) or has_codec(value):
        try:
            return copy.deepcopy(value)
        except Exception:  # an object that cannot be copied is kept by reference, as before
            return value
    return value


def is_tracking() -> bool:
    return _enabled


def _set_enabled(on: bool) -> None:
    global _enabled
    global _registration_hook
    if on and _registration_hook is None:
        _registration_hook = register_module_module_registration_hook(_on_registered)
    installed = torch.nn.Module.__dict__.get("__new__")
    if on and getattr(installed, "__func__", installed) is not _recording_new:
        # A staticmethod, as a __new__ written in a class body is: looked up on an instance
        # (``self.__new__(cls)``, torch parametrize's deepcopy) a plain function would bind ``self``.
        torch.nn.Module.__new__ = staticmethod(_recording_new)  # type: ignore[method-assign, assignment]  # torch declares it Callable[[type[Self]], Self]
        torch.nn.Module.__init_subclass__ = classmethod(_on_subclass)  # type: ignore[assignment]
        _track_own_new_classes()
    _enabled = on


class track_init:  # noqa: N801 - used like a function: modulelens.track_init()
    """Turn constructor tracking on (idempotent). Also a context manager that turns it back off
    on exit if it was this call that turned it on.

    Example::

        modulelens.track_init()            # for the rest of the process
        with modulelens.track_init():      # or just for a block
            model = build_model()
    """

    def __init__(self) -> None:
        with _lock:
            self._turned_on = not is_tracking()
            if self._turned_on:
                _set_enabled(True)
        self._active = True

    def __enter__(self) -> track_init:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        with _lock:
            if not self._active:
                return
            self._active = False
            if self._turned_on:
                _set_enabled(False)


def stop_tracking() -> None:
    """Turn tracking off regardless of open handles (records already taken stay)."""
    with _lock:
        _set_enabled(False)


def get_init_record(module: torch.nn.Module) -> InitRecord | None:
    """The recorded constructor arguments of ``module``, or ``None`` if it was built untracked.

    Example::

        modulelens.track_init()
        lin = torch.nn.Linear(4, 8, bias=False)
        modulelens.get_init_record(lin)   # InitRecord(args=(4, 8), kwargs={'bias': False})
    """
    entry = _entry(module)
    return None if entry is None else entry.record


def construction_missing(module: torch.nn.Module) -> str:
    """Why ``module`` has no constructor record (:func:`get_init_record` returned ``None``), as a
    clause for messages: what modulelens saw of its construction, or that it saw none."""
    entry = _entry(module)
    if entry is not None and entry.missing is not None:
        return entry.missing
    return ("it was built before modulelens.track_init() was on, or without calling its class (unpickled, or "
            "created by a tool)")


def _entry(module: object) -> _Entry | None:
    entry = _RECORDS.get(id(module))
    return entry if entry is not None and entry() is module else None


def constructed_as(module: torch.nn.Module) -> type | None:
    """The class ``module`` was constructed as, which its recorded arguments are for (``None`` for a
    module built untracked). A lazy module (``nn.LazyLinear``) becomes another class at its first call."""
    entry = _entry(module)
    return None if entry is None else entry.built


def made_by_tool(module: torch.nn.Module) -> str | None:
    """The tool that made ``module`` from a module its record rebuilds (``"torch.jit.script"``,
    ``"torch.jit.trace"``), or ``None``."""
    entry = _entry(module)
    return None if entry is None else entry.made_by


def traced_training(module: torch.nn.Module) -> bool | None:
    """For a module ``torch.jit.trace`` made, the mode (``training``) it was traced in; else ``None``."""
    entry = _entry(module)
    return None if entry is None else entry.traced_training


def construction_hooks(module: torch.nn.Module) -> tuple[int, int | None] | None:
    """``(first, end)``: the hook ids that ``module``'s construction may have registered are
    ``first <= id < end`` (``end`` ``None``: it never became another module's child, so its end is
    unknown); ``None`` for a module built untracked."""
    entry = _entry(module)
    return None if entry is None else (entry.hooks_from, entry.hooks_to)
