"""In-memory records the tracer fills while the job runs (encoded only when saved)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from modulelens.format.op_trace import OpTrace
from modulelens.tracing.init_tracking import InitRecord
from modulelens.tracing.module_tree import TreeNode


@dataclass
class StateSnapshot:
    """Parameters and buffers of a module at the start of a recorded call (copies)."""

    parameters: dict[str, torch.Tensor]
    requires_grad: dict[str, bool]
    buffers: dict[str, torch.Tensor]
    persistent: dict[str, bool]
    extra_state: dict[str, Any] = field(default_factory=dict)
    # submodule path -> what its own _save_to_state_dict adds (quantized modules' packed weights)
    module_state: dict[str, dict[str, Any]] = field(default_factory=dict)
    # non-persistent sparse/nested buffers, rebuilt by the constructor: name -> {"layout", "digest"}
    rebuilt_buffers: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass
class BackwardRecord:
    """Gradients of one recorded call (``capture(..., record=Recording(backward=True))``), module-local: the
    gradient that flowed into the outputs, and what the module's own backward made of it."""

    output_grads: Any  # the output's structure, a gradient (or None) per output leaf
    input_grads: Any  # the (args, kwargs) structure, a gradient (or None) per input leaf
    param_grads: dict[str, torch.Tensor | None]  # parameter name -> gradient (None: unused)


@dataclass
class CallRecord:
    """One recorded call: inputs as they were on entry, the output, and the state deciding it."""

    index: int  # the module's call number in the job, warm-up calls included
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    state_index: int
    training: bool
    grad_enabled: bool
    rng: dict[str, torch.Tensor] = field(default_factory=dict)
    autocast: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)  # libraries' global settings (format/library_settings.py)
    output: Any = None
    # input path (as ``deep_leaves`` names it) -> the value after the call, for each input the call
    # changed in place: state objects (caches) always, tensors whose version counter moved
    mutated_inputs: dict[str, Any] = field(default_factory=dict)
    # buffer name -> its value after the call, for each buffer the call changed (running statistics)
    buffers_after: dict[str, Any] = field(default_factory=dict)
    finished: bool = False
    error: str | None = None
    backward: BackwardRecord | None = None
    backward_pending: bool = False  # forward done, waiting for its backward pass
    # a call inside torch.func.vmap (an ensemble): {"size", "randomness", "inputs", "state", "output"},
    # the paths and names of the batched values, stored stacked along a first dimension
    vmap: dict[str, Any] | None = None
    op_trace: OpTrace | None = None  # Recording(op_trace=True): the aten ops the call ran


@dataclass
class ModuleRecord:
    """Everything captured about one target module."""

    qualified_name: str
    module_class: type
    construction: InitRecord | None
    module: torch.nn.Module | None  # the live module (for nested constructor records); dropped after save
    method: str | None = None  # a method entry point (``vae:encode``, tracing/methods.py); None: module(...)
    calls: list[CallRecord] = field(default_factory=list)
    states: list[StateSnapshot] = field(default_factory=list)
    seen_calls: int = 0
    complete: bool = False
    failed: str | None = None
    # At the first recorded call: plain attributes and submodule classes (format/module_state.py)
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)
    structure: dict[str, str] = field(default_factory=dict)
    tree: list[TreeNode] = field(default_factory=list)  # every submodule and how to put it back
    compiled: dict[str, Any] | None = None  # it ran torch.compile'd: how (tracing/compiled.py)

    @property
    def live_module(self) -> torch.nn.Module:
        """The live module, while the record has it (encoding needs it; a saved record has let it go)."""
        if self.module is None:
            raise RuntimeError(f"{self.qualified_name}: the record no longer holds its module (already saved)")
        return self.module
