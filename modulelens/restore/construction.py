"""Running a recorded class's constructor without changing the process around it.

A rebuild constructs the module's class from its recorded arguments and then gives it the recorded
tensors, so whatever values its constructor computes for parameters and buffers are thrown away:
they need neither memory nor initialisation work. ``with torch.device("meta")`` around the
constructor did that by putting *every* tensor created meanwhile on the meta device, and so
poisoned the process (issue 34, defect 1): a library imported for the first time inside kept its
module-level tensors on meta (torchdiffeq's Dormand-Prince tableau: every later ``dopri5`` solve in
the process failed, the user's own included), and a constructor that fills an ``lru_cache`` cached
meta tensors (e3nn's Clebsch-Gordan tables: every later e3nn model failed).

:func:`empty_weights` moves only what a module registers as a parameter or buffer to the meta
device, through torch's global registration hooks (``register_module_parameter_registration_hook``,
the public form of what accelerate's ``init_empty_weights`` patches in), and only on the thread
that builds. Every other tensor is an ordinary CPU tensor, so tables, caches and module-level
constants hold real values. :func:`random_state_kept` puts torch's, numpy's and Python's random
generators back as they were: a constructor that draws its initial weights (``torch.randn`` before
registering them) must not shift the user's own random stream.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.modules.module import (
    register_module_buffer_registration_hook,
    register_module_parameter_registration_hook,
)
from torch.nn.parameter import UninitializedTensorMixin  # type: ignore[attr-defined]  # torch's parameter.pyi omits it

from modulelens.format.host_rng import host_states, set_host_states

_META = torch.device("meta")
_META_COPY_WARNING = r"for .*: copying from a non-meta parameter in the checkpoint to a meta parameter"
# What constructors initialise weights with, by name (``torch.nn.init``'s, and the copies libraries
# keep, such as transformers' ``initialization.normal_``), and the in-place random and fill methods.
_INITIALISERS = frozenset({
    "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_", "xavier_uniform_",
    "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_", "zero_", "fill_",
    "bernoulli_", "exponential_", "geometric_", "log_normal_", "cauchy_", "random_",
})


class _EmptyParameter(torch.nn.Parameter):
    """A meta parameter whose initialisers are no-ops: on the meta device they compute nothing
    anyway, but ``normal_`` there runs torch's reference implementation in Python, ~0.2 ms a
    call (transformers initialises every Linear with it: a 4-layer Llama took 15 ms to build
    instead of 6). Anything else runs as on a plain meta tensor and returns plain tensors; the
    recorded state replaces these parameters before the module is handed out."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        if getattr(func, "__name__", None) in _INITIALISERS:
            target = args[0] if args else next(iter((kwargs or {}).values()), None)
            if isinstance(target, _EmptyParameter):
                return target
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class EmptyWeights:
    """The modules that registered parameters or buffers inside :func:`empty_weights` (weakly: a
    child a rebuild replaced is gone once nothing holds it)."""

    def __init__(self) -> None:
        self._seen: dict[int, weakref.ref[torch.nn.Module]] = {}

    def note(self, module: torch.nn.Module) -> None:
        """``module`` registered a parameter or buffer during the block."""
        if id(module) not in self._seen:
            self._seen[id(module)] = weakref.ref(module)

    def outside(self, root: torch.nn.Module) -> list[torch.nn.Module]:
        """Modules holding meta weights that are alive but not in ``root``'s tree: a constructor
        kept a module somewhere else (e3nn keeps the code it generates, with its constant tables as
        buffers, in a plain attribute), so the recorded state never reaches their tensors."""
        tree = {id(m) for m in root.modules()}

        def left() -> list[torch.nn.Module]:
            found = (ref() for key, ref in self._seen.items() if key not in tree)
            return [m for m in found if m is not None and _holds_meta(m)]

        alive = left()
        if alive:  # a replaced child may only wait for the cycle collector: ask it once
            gc.collect()
            alive = left()
        return alive


def _holds_meta(module: torch.nn.Module) -> bool:
    return any(t is not None and t.is_meta for t in (*module._parameters.values(), *module._buffers.values()))


@contextlib.contextmanager
def empty_weights() -> Iterator[EmptyWeights]:
    """Parameters and buffers registered on this thread inside the block are meta tensors (no
    memory, no data); nothing else changes. Nested blocks and other threads are unaffected. Yields
    the record of the modules it changed (:meth:`EmptyWeights.outside`)."""
    builder = threading.get_ident()
    changed = EmptyWeights()

    def parameter(module: torch.nn.Module, _name: str, param: torch.nn.Parameter) -> torch.nn.Parameter | None:
        if threading.get_ident() != builder:
            return None
        changed.note(module)  # a meta tensor it is given (copied from another module) counts too
        if param.is_meta or isinstance(param, UninitializedTensorMixin):
            return None
        try:
            moved = param.detach().to(_META)
            if type(param) is torch.nn.Parameter:
                return _EmptyParameter(moved, requires_grad=param.requires_grad)
            # a Parameter subclass (bitsandbytes', torchao's): its own attributes, as accelerate does
            return type(param)(moved, **{**param.__dict__, "requires_grad": param.requires_grad})
        except Exception:  # a subclass that cannot live on meta keeps its real values (the state replaces them)
            return None

    def buffer(module: torch.nn.Module, _name: str, tensor: torch.Tensor | None) -> torch.Tensor | None:
        if threading.get_ident() != builder:
            return None
        changed.note(module)
        if tensor is None or tensor.is_meta:
            return None
        try:
            return tensor.to(_META)
        except Exception:  # as above
            return None

    # torch's stubs type these hooks as returning None; a hook may return the replacement tensor
    handles = [register_module_parameter_registration_hook(parameter),  # type: ignore[arg-type]
               register_module_buffer_registration_hook(buffer)]  # type: ignore[arg-type]
    try:
        with warnings.catch_warnings():
            # A constructor that loads a state dict into its own new layers (sentence-transformers'
            # WordEmbeddings) copies into meta parameters here: a no-op torch warns about, harmless
            # because the recorded state replaces every parameter after construction.
            warnings.filterwarnings("ignore", message=_META_COPY_WARNING, category=UserWarning)
            yield changed
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def random_state_kept() -> Iterator[None]:
    """Torch's CPU generator and numpy's and Python's global generators are as they were on
    entry when the block ends (each read in microseconds, and set back only if it moved)."""
    torch_state = torch.get_rng_state()
    host = host_states()
    try:
        yield
    finally:
        if not torch.equal(torch.get_rng_state(), torch_state):
            torch.set_rng_state(torch_state)
        after = host_states()
        moved = {name: state for name, state in host.items()
                 if after.get(name) is not state and not torch.equal(after.get(name, state), state)}
        if moved:
            set_host_states(moved)
