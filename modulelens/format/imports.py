"""Resolving the import paths a capture names, without running code from the capture.

Capture metadata names classes and functions by ``"package.module:Qual.Name"`` (the module class,
constructor argument types, pytree node types, codec classes, ``"import"`` values). Metadata can
come from anyone, so an import path is only a *request*: :func:`resolve_import` grants it when

1. the path is well formed (identifiers only, no dunder attribute such as ``__globals__``);
2. its module is not on the deny list (process, file, network, import and serialization
   machinery: ``builtins``, ``os``, ``subprocess``, ``importlib``, ``sys``, ``shutil``, ``pickle``,
   ``torch.hub``, ``torch.serialization``... and every standard-library module outside a short
   allowlist of data types: :data:`STDLIB_ALLOWED`);
3. a module that is not imported yet is *importable*: found on ``sys.path`` outside the directories
   the caller forbids (the repo), and outside the current directory (``''``, ``'.'`` or the working
   directory) unless an entry of ``PYTHONPATH`` finds the same file or the caller allows it (a
   capture of your own that recorded that very file), checked before anything is imported;
4. the object is of the kind its use needs (:data:`Kind`), checked before it is called:
   ``"module"``: an ``nn.Module`` subclass; ``"node"``: a type torch's pytree registered;
   ``"class"``: a class (the caller checks namedtuple/dataclass/codec type); ``"value"``: a class,
   a function or a builtin (never an arbitrary object).

See docs/security.md for the whole trust model and what it does not guarantee.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import torch
import torch.utils._pytree as pytree

from modulelens.errors import UntrustedCodeError

Kind = Literal["module", "node", "class", "value"]

# Standard-library modules whose classes and functions are plain data or arithmetic.
STDLIB_ALLOWED = frozenset({
    "math", "cmath", "operator", "collections", "enum", "functools", "fractions", "decimal", "datetime", "numbers",
})
# Builtins that are data types (``dtype=float`` is a common constructor argument); nothing else.
BUILTIN_TYPES_ALLOWED = frozenset({
    "bool", "int", "float", "complex", "str", "bytes", "bytearray", "tuple", "list", "dict", "set",
    "frozenset", "slice", "range", "object",
})
# Third-party modules (and their submodules) that reach files, processes, the network or code
# loading: never resolved from a capture. The standard library is handled by STDLIB_ALLOWED.
DENIED_MODULES = frozenset({
    "torch.hub", "torch.serialization", "torch.utils.cpp_extension", "torch.package", "torch.jit",
    "torch.distributed", "torch.multiprocessing", "torch.library", "torch.ops", "torch.classes",
    "torch.utils.data", "torch._dynamo", "torch._inductor", "torch.compiler", "torch.utils.checkpoint",
    "torch.onnx", "torch.export", "torch.utils.tensorboard", "torch.profiler", "torch.backends",
    "torch._C", "torch.cuda.memory", "torch._logging",
    "pip", "setuptools", "pkg_resources", "_distutils_hack", "IPython", "ipykernel", "jupyter_client",
    "requests", "urllib3", "httpx", "fsspec", "huggingface_hub", "numpy.lib.npyio", "numpy.f2py",
    "modulelens", "modulelens_pytest", "pytest", "_pytest", "typer", "click", "rich", "blake3",
})
# ...except modulelens's own demo model (its documentation captures it) and torch's operator namespaces.
_ALLOWED_INSIDE_DENIED = frozenset({
    "modulelens.demo", "torch._C._nn", "torch._C._fft", "torch._C._linalg", "torch._C._special",
})
# Callables that turn data into attribute access or method calls on whatever they are given.
_NAMES_DENIED = frozenset({("operator", "attrgetter"), ("operator", "methodcaller"), ("functools", "reduce")})
_TORCH_NAMES_DENIED = frozenset({"load", "save", "compile", "hub", "ops", "classes", "library", "jit", "package"})


def parse_import_path(path: object) -> tuple[str, list[str]]:
    """``"pkg.mod:Qual.Name"`` -> ``("pkg.mod", ["Qual", "Name"])``; malformed -> UntrustedCodeError."""
    if not isinstance(path, str) or path.count(":") != 1 or len(path) > 500:
        raise UntrustedCodeError(f"malformed import path {path!r} (expected 'package.module:Name')")
    module_name, _, qualname = path.partition(":")
    parts = qualname.split(".")
    if not all(p.isidentifier() for p in (*module_name.split("."), *parts)):
        raise UntrustedCodeError(f"malformed import path {path!r}")
    if any(p.startswith("__") and p.endswith("__") for p in (*module_name.split("."), *parts)):
        raise UntrustedCodeError(f"import path {path!r} names a special attribute; refused")
    return module_name, parts


def module_denied(module_name: str) -> bool:
    """Whether ``module_name`` may never be resolved from a capture (see the module docstring)."""
    top = module_name.split(".")[0]
    if top == "builtins":
        return False  # builtins is judged name by name (BUILTIN_TYPES_ALLOWED)
    if top in sys.stdlib_module_names and top not in STDLIB_ALLOWED:
        return True
    if any(module_name == a or module_name.startswith(a + ".") for a in _ALLOWED_INSIDE_DENIED):
        return False
    return any(module_name == d or module_name.startswith(d + ".") for d in DENIED_MODULES)


def _inside(path: str, folders: Iterable[Path]) -> bool:
    real = os.path.realpath(path)
    return any(real == str(f) or real.startswith(str(f) + os.sep) for f in folders)


def _is_current_dir(entry: str) -> bool:
    """Whether a ``sys.path`` entry is the working directory: ``''`` (IPython, Jupyter,
    ``python -c``), ``'.'``, or its path (``python -m``, a script run from its own folder)."""
    return entry in ("", ".") or os.path.realpath(entry) == os.path.realpath(os.getcwd())


def _path_entry(module_name: str) -> str | None:
    """The ``sys.path`` entry a top-level module would be imported from (first match wins)."""
    for entry in sys.path:
        if isinstance(entry, str) and importlib.machinery.PathFinder.find_spec(module_name, [entry]) is not None:
            return entry
    return None


def _locations(spec: importlib.machinery.ModuleSpec) -> list[str]:
    """The file a module would run (a package's ``__init__``), or a namespace package's folders."""
    origin = spec.origin if spec.has_location else None
    return [origin] if origin else list(spec.submodule_search_locations or [])


def _named_in_pythonpath(module_name: str, locations: list[str]) -> bool:
    """Whether an entry of ``PYTHONPATH`` finds the very module found: the user named its folder
    on purpose, even when ``''`` or the working directory comes first on ``sys.path`` and finds it
    there (IPython and ``python -c`` put ``''`` before ``PYTHONPATH``). Empty entries (a stray
    ``:``) name nothing."""
    found = [os.path.realpath(loc) for loc in locations]
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if not entry:
            continue
        spec = importlib.machinery.PathFinder.find_spec(module_name, [entry])
        if spec is not None and [os.path.realpath(loc) for loc in _locations(spec)] == found:
            return True
    return False


AllowHere = Callable[[str, importlib.machinery.ModuleSpec], bool]
"""``(top-level module name, its spec) -> bool``: whether a module found in the working directory
may be imported anyway (a capture of your own names it: :mod:`modulelens.restore.classes`)."""


def _check_findable(module_name: str, forbidden: list[Path], allow_here: AllowHere | None) -> None:
    """Refuse a module not yet imported that would come from a folder the caller forbids (the
    repo), from the current directory (unless ``PYTHONPATH`` names it or ``allow_here`` allows
    it), or from nowhere. Nothing runs: parents are imported first, then ``find_spec`` only
    locates the module."""
    if module_name in sys.modules:
        return
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError) as error:
        raise ImportError(f"cannot find module {module_name}: {error}") from None
    if spec is None:
        raise ImportError(f"no module named {module_name!r}")
    locations = _locations(spec)
    where = next((loc for loc in locations if _inside(loc, forbidden)), None)
    if where is not None:  # even when PYTHONPATH names it: a repo's files come with its captures
        raise ImportError(f"module {module_name} would be imported from {where}, inside the repo, which modulelens "
                          "never imports from")
    if "." in module_name or not locations:
        return
    entry = _path_entry(module_name)
    if entry is None or not _is_current_dir(entry) or _named_in_pythonpath(module_name, locations):
        return
    if allow_here is not None and allow_here(module_name, spec):
        return
    raise ImportError(
        f"module {module_name} would be imported from {locations[0]}, in the current directory, which modulelens "
        "never imports from for a capture that is not your own; add its folder to PYTHONPATH (or import it "
        "yourself first) if you trust it")


def _import_module(module_name: str, forbidden: list[Path], allow_here: AllowHere | None) -> types.ModuleType:
    parts = module_name.split(".")
    module: types.ModuleType | None = None
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        _check_findable(name, forbidden, allow_here)
        module = importlib.import_module(name)
    assert module is not None
    return module


def import_checked(path: str, forbidden: Iterable[str | os.PathLike[str]] = (),
                   allow_here: AllowHere | None = None) -> Any:
    """The object at ``path`` if its module may be imported (rules 1-3); no kind check.
    ``allow_here`` may allow a top-level module found in the current directory (see :data:`AllowHere`).

    Raises:
        UntrustedCodeError: the path is malformed or denied.
        ImportError / AttributeError: the module or name does not exist here, or would be imported
            from the current directory or a forbidden folder.
    """
    module_name, parts = parse_import_path(path)
    if module_denied(module_name) and path not in _FUNCTIONS_ALLOWED_INSIDE_DENIED:
        raise UntrustedCodeError(f"{path}: module {module_name} is never imported from a capture (only plain data "
                                 "types of the standard library are, and no package that reaches files, "
                                 "processes, the network or code loading)")
    if module_name == "builtins" and (len(parts) != 1 or parts[0] not in BUILTIN_TYPES_ALLOWED):
        raise UntrustedCodeError(f"{path}: only builtin data types are resolved from a capture")
    if (module_name, parts[0]) in _NAMES_DENIED or (module_name == "torch" and parts[0] in _TORCH_NAMES_DENIED):
        raise UntrustedCodeError(f"{path}: {module_name}.{parts[0]} is never resolved from a capture")
    if (module_name.split(".")[0] in sys.stdlib_module_names) and any(p.startswith("_") for p in parts):
        raise UntrustedCodeError(f"{path}: private names of the standard library are never resolved")
    obj: Any = _import_module(module_name, [Path(os.path.realpath(f)) for f in forbidden], allow_here)
    for part in parts:
        obj = getattr(obj, part)
        # Attribute hops must not lead out of what rule 2 allows (``torch:serialization.load``).
        if isinstance(obj, types.ModuleType) and module_denied(obj.__name__):
            raise UntrustedCodeError(f"{path} leads into module {obj.__name__}; refused")
    _check_home(obj, path)
    return obj


# Classes of denied modules that captures may name: a random generator passed to a module is stored
# by its state (format/values.py's torch.Generator codec, which accepts that exact class only).
_CLASSES_ALLOWED_INSIDE_DENIED = (torch.Generator,)
# Functions of denied modules that captures may name: transformers' gradient checkpointing keeps
# `partial(torch.utils.checkpoint.checkpoint, use_reentrant=...)` on every block
# (format/module_state.py). `checkpoint` runs only the function and arguments it is handed (and a
# `context_fn`), each of which passes these rules on its own: it reaches nothing they do not.
_FUNCTIONS_ALLOWED_INSIDE_DENIED = frozenset({"torch.utils.checkpoint:checkpoint"})


def _check_home(obj: object, path: str) -> None:
    """The module an object was defined in must pass rule 2 too (a re-export does not launder it)."""
    home = getattr(obj, "__module__", None)
    if not isinstance(home, str) or any(obj is allowed for allowed in _CLASSES_ALLOWED_INSIDE_DENIED):
        return
    if path in _FUNCTIONS_ALLOWED_INSIDE_DENIED and f"{home}:{getattr(obj, '__qualname__', '')}" == path:
        return
    if home.startswith("_") and "." not in home and not module_denied(home[1:]) and \
            getattr(sys.modules.get(home[1:]), getattr(obj, "__name__", ""), None) is obj:
        return  # a C accelerator's function its public module exports (_operator.getitem is operator.getitem)
    if home == "builtins":
        if not (isinstance(obj, type) and obj.__name__ in BUILTIN_TYPES_ALLOWED):
            raise UntrustedCodeError(f"{path} is the builtin {getattr(obj, '__name__', obj)!r}; refused")
    elif module_denied(home):
        raise UntrustedCodeError(f"{path} is defined in {home}, which is never resolved from a capture")


def check_kind(obj: Any, kind: Kind, path: str) -> Any:
    """``obj`` if it is of the kind its use needs (rule 4); else :class:`UntrustedCodeError`."""
    if kind == "module":
        if not (isinstance(obj, type) and issubclass(obj, torch.nn.Module)):
            raise UntrustedCodeError(f"{path} is not an nn.Module subclass; refused as a module class")
    elif kind == "node":
        if obj not in pytree.SUPPORTED_NODES:
            raise UntrustedCodeError(f"{path} is not a pytree container type; refused")
    elif kind == "class":
        if not isinstance(obj, type):
            raise UntrustedCodeError(f"{path} is not a class; refused")
    elif not isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
        raise UntrustedCodeError(f"{path} is neither a class nor a function; refused as a value")
    return obj


def resolve_import(path: str, kind: Kind = "value", forbidden: Iterable[str | os.PathLike[str]] = ()) -> Any:
    """Resolve a recorded import path under the rules of this module.

    Args:
        path: ``"package.module:Qual.Name"`` as the capture recorded it.
        kind: what the object is used as (``"module"``, ``"node"``, ``"class"``, ``"value"``).
        forbidden: folders nothing may be imported from (the repo holding the capture).

    Returns:
        The class or function.

    Raises:
        UntrustedCodeError: the path is refused (denied module, wrong kind, current directory).
        ImportError / AttributeError: it does not exist in this environment.

    Example::

        resolve_import("torch.nn.modules.linear:Linear", "module")   # -> torch.nn.Linear
        resolve_import("os:system")                                   # UntrustedCodeError
    """
    return check_kind(import_checked(path, forbidden), kind, path)
