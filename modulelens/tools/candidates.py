"""Candidate implementations for ``verify``: load them from a spec and build them like the original.

A spec is ``path/to/file.py:ClassName`` (the file is executed as a fresh module: that runs the
user's code, which is the point) or ``package.module:ClassName``. A candidate class is built with
``cls.from_original(reference_module)`` when it defines that classmethod, else with the recorded
constructor arguments of the captured module.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeAlias

import torch

from modulelens.errors import CandidateError, ModulelensError, RestoreError
from modulelens.tools.working_copy import working_module

if TYPE_CHECKING:
    from modulelens.restore.loader import Capture


# What verify() takes as a candidate: an instance, a class or factory that builds one, or a spec naming either.
Candidate: TypeAlias = "torch.nn.Module | Callable[..., torch.nn.Module] | str"


def load_candidate(spec: str) -> Any:
    """The object a ``"file.py:Name"`` or ``"package.module:Name"`` spec names; a bare
    ``"file.py"`` names the one ``nn.Module`` class defined in it (or the one called ``Candidate``).

    Example::

        cls = load_candidate("kernels/fused_mlp.py:FusedMLP")
        cls = load_candidate("mypkg.layers:FusedMLP")
        cls = load_candidate("kernels/fused_mlp.py")
    """
    if spec.endswith(".py"):  # a file holding exactly one candidate class
        return _only_module_class(_import_file(Path(spec), spec), spec)
    source, sep, qualname = spec.rpartition(":")
    if not sep or not source or not qualname:
        raise CandidateError(
            f"candidate {spec!r}: use path/to/file.py:ClassName, path/to/file.py or package.module:ClassName")
    if source.endswith(".py") or "/" in source or "\\" in source:
        module = _import_file(Path(source), spec)
    else:
        try:
            module = importlib.import_module(source)
        except ImportError as error:
            raise CandidateError(f"candidate {spec!r}: cannot import {source}: {error}") from None
    obj: Any = module
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CandidateError(f"candidate {spec!r}: {source} has no attribute {qualname!r}") from None
    return obj


def _only_module_class(module: ModuleType, spec: str) -> type:
    """The one ``nn.Module`` subclass defined in ``module`` (or the one named ``Candidate``)."""
    classes = [obj for obj in vars(module).values()
               if isinstance(obj, type) and issubclass(obj, torch.nn.Module) and obj.__module__ == module.__name__]
    if len(classes) == 1:
        return classes[0]
    named = [cls for cls in classes if cls.__name__ == "Candidate"]
    if len(named) == 1:
        return named[0]
    found = ", ".join(sorted(cls.__name__ for cls in classes)) or "none"
    raise CandidateError(f"candidate {spec!r}: name the class as {spec}:ClassName "
                         f"(nn.Module classes defined there: {found})")


def _import_file(path: Path, spec: str) -> ModuleType:
    path = path.expanduser().resolve()
    if not path.is_file():
        raise CandidateError(f"candidate {spec!r}: no such file {path}")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"modulelens_candidate_{path.stem}_{digest}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise CandidateError(f"candidate {spec!r}: {path} cannot be imported as Python")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses, pickling-free typing helpers and relative lookups need it
    sys.path.insert(0, str(path.parent))  # so the file can import its neighbours
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(name, None)
        raise CandidateError(f"candidate {spec!r}: importing {path} failed: {type(error).__name__}: {error}") from error
    finally:
        if sys.path and sys.path[0] == str(path.parent):
            sys.path.pop(0)
    return module


def describe_candidate(candidate: Candidate) -> str:
    """How a candidate is named in reports: its spec, or its class as ``module:Qualname``."""
    if isinstance(candidate, str):
        return candidate
    cls = candidate if isinstance(candidate, type) else type(candidate)
    return f"{cls.__module__}:{cls.__qualname__}"


def recorded_init_arguments(capture: Capture) -> tuple[tuple[object, ...], dict[str, object]]:
    """The captured module's constructor arguments, decoded (nested modules rebuilt).

    Example::

        args, kwargs = recorded_init_arguments(cap)
        fused = FusedMLP(*args, **kwargs)
    """
    arguments = capture.init_arguments
    if arguments is None:
        reason = capture.metadata["module"].get("construction_missing", "no constructor record")
        raise RestoreError(f"{capture.ref}: constructor arguments were not recorded ({reason}); "
                           "give the candidate a from_original(module) classmethod or pass an instance")
    return arguments


def build_candidate(candidate: Candidate, capture: Capture, state_index: int = 0) -> tuple[torch.nn.Module, str]:
    """An ``nn.Module`` from a spec, class or instance, and how it was built:
    ``"instance"``, ``"from_original"`` or ``"constructor"``.

    Example::

        module, how = build_candidate("kernels/fused.py:FusedMLP", cap)
    """
    if isinstance(candidate, str):
        candidate = load_candidate(candidate)
    if isinstance(candidate, torch.nn.Module):
        return candidate, "instance"
    if not isinstance(candidate, type) and not callable(candidate):
        raise CandidateError(f"candidate {candidate!r} is neither an nn.Module class nor an instance")
    from_original = getattr(candidate, "from_original", None)
    try:
        if callable(from_original):
            built, how = from_original(working_module(capture, state_index)), "from_original"
        else:
            args, kwargs = recorded_init_arguments(capture)
            built, how = candidate(*args, **kwargs), "constructor"
    except (ModulelensError, KeyboardInterrupt):
        raise
    except Exception as error:
        raise CandidateError(
            f"building candidate {describe_candidate(candidate)} failed: {type(error).__name__}: {error}") from error
    if not isinstance(built, torch.nn.Module):
        name = describe_candidate(candidate)
        raise CandidateError(f"candidate {name} built a {type(built).__name__}, not an nn.Module")
    return built, how
