"""What a module's constructor arguments do not tell: state set on it after construction.

Methods called after ``__init__`` change modules in two ways that a rebuild from the recorded
constructor arguments would lose (issue 11): plain attributes (timm's ``set_distilled_training``
sets ``distilled_training = True``; ``fuse``-style flags) and the structure itself
(re-parameterisation such as FastViT's ``reparameterize_model`` replaces branches by one conv).
The tracer records both at a target's first recorded call: plain attributes are restored on load,
and a structure the constructor does not rebuild is named in the load error.
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Iterable
from typing import Any

import torch

from modulelens.format.imports import import_checked

_PLAIN = (bool, int, float, str, type(None))
# Flags a library sets on every module as bookkeeping, not behaviour: transformers marks each module
# whose weights its initialiser has run with ``_is_hf_initialized = True`` (after construction, so
# every transformers capture recorded it and every load noted restoring it; issue 23). A restored
# module gets its weights from the capture, never from that initialiser.
# torch.compile marks the module it wraps (``_is_torch_compile``): a load compiles it again itself.
_BOOKKEEPING = frozenset({"_is_hf_initialized", "_output_capturing_hooks_installed", "_is_torch_compile"})
# Hooks a library installs on a module lazily, at its first call, under a flag that says they are
# there (transformers 5: ``_output_capturing_hooks_installed``, the forward hooks that collect
# ``hidden_states`` and ``attentions``). The flag is bookkeeping above, so it is not recorded: a
# rebuilt module installs the hooks again itself at its first call. Restoring the flag without the
# hooks made the rebuilt module skip them (aya_vision's vision tower then returned no hidden states).
_REINSTALLED_HOOKS = ("transformers.utils.output_capturing:",)
# Hooks that only move a sharded module's inputs and outputs between local shards and DTensors
# (tensor parallel's ``distribute_module``). A sharded capture records what forward itself sees,
# gathered into full tensors (docs/distributed.md), so the rebuilt single-device module replays
# exactly without them: naming them as missing was a false alarm on every tensor-parallel capture.
_SHARDING_HOOKS = ("torch.distributed.tensor._api:distribute_module.",)


# Hooks a tool registers after construction that a load registers again, by import path: plain
# functions of torch that read only the module they are called on. Eager-mode quantization's
# prepare() / prepare_qat() put each observer or fake-quantize module (``activation_post_process``,
# a child the recorded tree rebuilds) behind its module with these.
REREGISTERED_HOOKS = {
    "torch.ao.quantization.quantize:_observer_forward_hook": "forward",
    "torch.ao.quantization.quantize:_observer_forward_pre_hook": "forward_pre",
}


# torch.compile settings a load compiles a module with again (tracing/compiled.py): torch's own
# backends, and the inductor options torch.compile's modes set, all booleans. Nothing else a capture
# names reaches the compiler (an option such as cpp.cxx would choose a command to run).
COMPILE_BACKENDS = frozenset({"inductor", "eager", "aot_eager"})
COMPILE_OPTIONS = frozenset({"max_autotune", "coordinate_descent_tuning", "triton.cudagraphs", "epilogue_fusion",
                             "max_autotune_pointwise", "max_autotune_gemm", "shape_padding"})


def reproducible_compile(settings: object) -> bool:
    """Whether recorded ``torch.compile`` settings are ones a load applies (see COMPILE_BACKENDS)."""
    if not isinstance(settings, dict) or settings.get("backend") not in COMPILE_BACKENDS:
        return False
    options = settings.get("options") or {}
    return (isinstance(options, dict) and not set(options) - COMPILE_OPTIONS
            and all(isinstance(v, bool) for v in options.values())
            and settings.get("dynamic") in (None, True, False) and isinstance(settings.get("fullgraph", False), bool))


def needs_no_rebuild(hook: str) -> bool:
    """Whether a rebuilt module does without a hook (``pkg.mod:qualname``) the job added after
    construction: its library installs it again, or it only moved tensors between shards."""
    return hook.startswith(_REINSTALLED_HOOKS) or hook.startswith(_SHARDING_HOOKS)


@functools.lru_cache(maxsize=1)
def _module_internals() -> frozenset[str]:
    """Attribute names every ``nn.Module`` has (hook dicts, flags): torch's, not the user's state."""
    return frozenset(vars(torch.nn.Module())) | {"training"} | _BOOKKEEPING


def _is_plain(value: object) -> bool:
    if type(value) in _PLAIN:
        return not (type(value) is float and not math.isfinite(value))  # JSON has no inf/nan
    if type(value) is functools.partial:
        # transformers' gradient_checkpointing_enable() sets `gradient_checkpointing = True` and
        # `_gradient_checkpointing_func = partial(torch.utils.checkpoint.checkpoint, use_reentrant=...)`:
        # restoring the flag without the partial failed every replay (no attribute '_gradient_checkpointing_func')
        return (_is_importable_function(value.func) and all(_is_plain(v) for v in value.args)
                and all(_is_plain(v) for v in value.keywords.values()))
    return type(value) is tuple and all(_is_plain(v) for v in value)


def _is_importable_function(func: object) -> bool:
    """A function a capture stores by its import path and a load may resolve (format/imports.py's
    rules): one that is not would make the save or the load fail where leaving it out did not."""
    if not isinstance(func, types.FunctionType) or "<" in func.__qualname__:
        return False
    try:
        return import_checked(f"{func.__module__}:{func.__qualname__}") is func
    except Exception:  # denied, or not found at its own name
        return False


def plain_attributes(module: torch.nn.Module,
                     modules: Iterable[tuple[str, torch.nn.Module]] | None = None) -> dict[str, dict[str, Any]]:
    """``{submodule path: {attribute: value}}`` of the scalar, string, bool and tuple-of-those
    attributes (and ``functools.partial``s of a module's function with such arguments) of ``module``
    and its submodules (``""`` is ``module`` itself); ``modules``: the
    ``(path, submodule)`` pairs to look at instead of ``module.named_modules()``."""
    internals = _module_internals()
    found: dict[str, dict[str, Any]] = {}
    pairs = module.named_modules(remove_duplicate=False) if modules is None else modules
    for path, sub in pairs:
        if isinstance(sub, torch.jit.ScriptModule) or type(sub).__module__ == "torch.export.unflatten":
            continue  # a TorchScript module's state lives in C++, an unflattened one's in its graph: vars() is bookkeeping
        # a GraphModule's _code is the Python fx generated from its graph, which a rebuild generates again
        skipped = internals | {"_code"} if isinstance(sub, torch.fx.GraphModule) else internals
        values = {k: v for k, v in vars(sub).items()
                  if k not in skipped and not k.startswith("__") and not k.startswith("_modulelens") and _is_plain(v)}
        if values:
            found[path] = values
    return found


def structure(module: torch.nn.Module) -> dict[str, str]:
    """``{submodule path: class name}`` for ``module`` and every submodule."""
    return {path: type(sub).__qualname__ for path, sub in module.named_modules(remove_duplicate=False)}


def structure_difference(recorded: dict[str, str], rebuilt: dict[str, str], limit: int = 5) -> str:
    """A one-line description of how two structures differ ("" when they do not)."""
    parts = []
    added = sorted(set(recorded) - set(rebuilt))
    removed = sorted(set(rebuilt) - set(recorded))
    changed = sorted(p for p in set(recorded) & set(rebuilt) if recorded[p] != rebuilt[p])
    if added:
        parts.append("captured but not rebuilt: " + ", ".join(f"{p or '<root>'} ({recorded[p]})" for p in added[:limit]))
    if removed:
        parts.append("rebuilt but not captured: " + ", ".join(f"{p or '<root>'} ({rebuilt[p]})" for p in removed[:limit]))
    if changed:
        parts.append("different class: " + ", ".join(f"{p or '<root>'} ({rebuilt[p]} -> {recorded[p]})"
                                                      for p in changed[:limit]))
    return "; ".join(parts)
