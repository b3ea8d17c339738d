"""What a recorded call carries besides its values: the autocast and random generators' states on
entry, what ``torch.func.vmap`` batches, and which inputs it may change in place (their version
counters on entry, compared after it returns); and whether a call is the job's at all
(:func:`torchs_own_run`).

Each runs once per recorded call, inside the job's forward (tracing/tracer.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from modulelens.format.host_rng import host_states
from modulelens.format.layouts import version_counter
from modulelens.format.tree import Flattened
from modulelens.tracing.fingerprint import LiveState
from modulelens.tracing.snapshot import vmap_batch

UNWATCHED = -1  # an inference tensor: it keeps no version counter, so an in-place change cannot be seen


@dataclass
class InputWatch:
    """A call's inputs that it may change in place (:func:`modulelens.format.tree.mutable_values`)."""

    values: list[Any]  # the live tensors and state objects
    versions: list[int | None]  # each tensor's version counter on entry (None: a state object; UNWATCHED)
    paths: Callable[[], list[str]]  # their paths, built only when a call changed one

    def changed(self) -> list[int]:
        """Positions of the inputs to record again after the call: every state object (a cache:
        attribute updates leave no version trace) and every tensor whose version counter moved."""
        return [i for i, (value, version) in enumerate(zip(self.values, self.versions, strict=True))
                if version is None or (version != UNWATCHED and value._version != version)]


def torchs_own_run() -> bool:
    """Whether torch itself runs the module now, not the job:

    * autograd's engine, in a backward pass on this thread: the module recomputes its forward for
      gradient checkpointing (``checkpoint(..., use_reentrant=True)``, transformers'
      ``gradient_checkpointing_enable()``), a second run of a call the tracer saw in the forward,
      which was recorded as a call of its own and used up ``max_calls``;
    * ``torch.jit.trace``, building a graph from a run of the module: the tracer's reads of the
      values (its fingerprints, ``.tolist()``) gave the job's trace one "might cause the trace to be
      incorrect" warning each, and the trace's runs used up ``max_calls``. (Its check afterwards
      runs the module eagerly: that run is recorded, a call with the job's example inputs.)"""
    return torch._C._current_graph_task_id() != -1 or torch.jit.is_tracing()


def tensor_version(value: object) -> int | None:
    """What tells whether a call changed an input in place: a tensor's version counter, ``None``
    for a state object (always recorded again after the call). A tensor made under
    ``torch.inference_mode()`` (sentence-transformers' ``encode``) has no counter: reading it raised
    and dropped the capture; its entry value is recorded, its change in place is not."""
    if not isinstance(value, torch.Tensor):
        return None
    version = version_counter(value)
    return UNWATCHED if version is None else version


def vmapped(inputs: Flattened, weights: LiveState) -> dict[str, object] | None:
    """What a call inside one ``torch.func.vmap`` batches (model ensembling: ``functional_call``
    over ``stack_module_state``'s weights): the batch size, vmap's ``randomness``, the paths of the
    batched inputs and the names of the batched parameters and buffers; ``None`` outside vmap."""
    params, buffers, _ = weights
    state = {**params, **buffers}
    found = vmap_batch([*inputs.leaves, *state.values()])
    if found is None:
        return None
    size, randomness, positions = found
    count = len(inputs.leaves)
    names = list(state)
    return {"size": size, "randomness": randomness,
            "inputs": inputs.paths(tuple(p for p in positions if p < count)),
            "state": [names[p - count] for p in positions if p >= count], "output": []}


def autocast_state() -> dict[str, str]:
    """The autocast dtype per device type where autocast is on (``{"cpu": "bfloat16"}``)."""
    state: dict[str, str] = {}
    for device in ("cpu", "cuda"):
        try:
            if torch.is_autocast_enabled(device):
                state[device] = str(torch.get_autocast_dtype(device)).removeprefix("torch.")
        except (RuntimeError, TypeError, AttributeError):
            continue
    return state


def rng_state(input_leaves: Sequence[object]) -> dict[str, torch.Tensor]:
    """The random generators' states on entry: the CPU's, numpy's and Python's, and each CUDA device an input is on."""
    state = {"cpu": torch.get_rng_state(), **host_states()}  # numpy's and Python's too (format/host_rng.py)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        devices = {t.device for t in input_leaves if isinstance(t, torch.Tensor) and t.device.type == "cuda"}
        for device in devices:
            state[str(device)] = torch.cuda.get_rng_state(device)
    return state
