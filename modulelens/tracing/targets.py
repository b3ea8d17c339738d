"""Which submodules a capture's target patterns name: a qualified-name glob, a class name or path,
``""`` for the model itself, ``name:method`` for a method target (tracing/methods.py), written
against the model with or without its DDP / DataParallel / FSDP / ``torch.compile`` wrappers.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

import torch

from modulelens.tracing.distributed import original_class
from modulelens.tracing.methods import own_call_class, split_target, target_key

_WRAPPER_CLASSES = ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel")


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The user's own module under DDP / DataParallel / FSDP1 / ``torch.compile`` wrappers."""
    seen = 0
    while seen < 8:
        seen += 1
        cls_name = type(model).__name__
        if cls_name in _WRAPPER_CLASSES and isinstance(inner := getattr(model, "module", None), torch.nn.Module):
            model = inner
        elif cls_name == "OptimizedModule" and isinstance(inner := getattr(model, "_orig_mod", None), torch.nn.Module):
            model = inner
        else:
            break
    return model


def is_wrapper(module: torch.nn.Module) -> bool:
    return unwrap_model(module) is not module


ROOT_PATTERNS = ("", ".")  # target the model itself (its class name works too)


def normalise_pattern(pattern: str, model: torch.nn.Module) -> str:
    """A target written against the wrapped model (``module.encoder``, ``_orig_mod.mlp``) names
    the same submodule as the unwrapped one does; ``""`` and ``"."`` name the model itself. A
    method target (``vae:encode``, tracing/methods.py) keeps its method."""
    module_pattern, method = split_target(pattern)
    if method is not None:
        return target_key(normalise_pattern(module_pattern, model), method)
    if pattern in ROOT_PATTERNS:
        return ""
    if is_wrapper(model):
        while pattern.startswith(("module.", "_orig_mod.")):
            pattern = pattern.partition(".")[2]
    return normalise_name(pattern)


def normalise_name(name: str) -> str:
    """Drop wrapper segments (``module.``, ``_orig_mod.``) from a qualified module name."""
    parts = [p for p in name.split(".") if p not in ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")]
    return ".".join(parts)


def matches(pattern: str, qualified_name: str, module: torch.nn.Module) -> bool:
    """A target pattern matches a qualified-name glob, a class name, or a full class path (the
    user's class, also under FSDP2's ``FSDP<Cls>``). A method target (``vae:encode``) matches the
    key of that method's target (:func:`~modulelens.tracing.methods.target_key`), never a module's."""
    pattern, method = split_target(pattern)
    qualified_name, key_method = split_target(qualified_name)
    return method == key_method and _matches_module(pattern, qualified_name, module)


def _matches_module(pattern: str, qualified_name: str, module: torch.nn.Module) -> bool:
    for cls in (type(module), original_class(type(module))):
        if pattern in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}"):
            return True
    if pattern in ROOT_PATTERNS:
        return qualified_name == ""
    return bool(qualified_name) and fnmatch.fnmatchcase(qualified_name, pattern)


def find_targets(model: torch.nn.Module, patterns: Sequence[str]) -> dict[str, torch.nn.Module]:
    """Target key -> module for every submodule matching any pattern (wrappers unwrapped): its
    qualified name, or ``name:method`` for a method target (tracing/methods.py)."""
    found: dict[str, torch.nn.Module] = {}
    seen: set[tuple[int, str | None]] = set()
    split = [split_target(p) for p in patterns]
    for raw_name, module in unwrap_model(model).named_modules():
        name = normalise_name(raw_name)
        if is_wrapper(module):
            continue  # a compiled/DDP submodule is found again as the module it wraps
        for module_pattern, method in split:
            if (id(module), method) not in seen and _matches_module(module_pattern, name, module):
                found[target_key(name, method)] = module
                seen.add((id(module), method))
    return found


def never_called_as_module(qualified: str, module: torch.nn.Module | None) -> str:
    """Why a module target saw no call although the module may have run: torch's forward hooks
    only see ``module(...)``; a class with its own ``__call__`` or a method called directly is
    invisible to them (tracing/methods.py), and is captured by naming the method."""
    name = qualified or ""
    own = own_call_class(module) if module is not None else None
    if own is not None:
        return (f"was never called through torch's Module.__call__: {own.__module__}.{own.__qualname__} defines its own "
                f"__call__, "
                f"which runs no forward hook; to record what module(...) does, target '{name}:__call__'")
    return (f"was never called as module(...) while capture was on (forward hooks saw nothing); if the code calls "
            f"a method of it directly (.forward(...), .encode(...)), target that method: '{name}:forward', "
            f"'{name}:encode'")
