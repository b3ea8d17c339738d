"""State a module keeps outside its parameters, buffers and extra state, which a call's result
may depend on: recorded with each state snapshot (``states[i].module_state``, docs/format.md) and
loaded back through the module's own ``_load_from_state_dict``.

* **What its own ``_save_to_state_dict`` adds**: dynamically quantized Linears keep their weights
  packed outside parameters (``_packed_params``: the quantized weight and bias; ``scale``,
  ``zero_point``).
* **torchmetrics' metric states.** A ``Metric`` keeps what ``add_state`` registered (running sums,
  counts, lists of predictions) as plain attributes, neither buffers nor in ``_save_to_state_dict``,
  and changes them at every ``update``: a ``compute`` call, or a model whose output reads a running
  metric, replayed on the state the module had at its first recorded call and FAILed, and every call
  shared one snapshot. They are recorded, and a change of them makes a new snapshot like a weight
  update does (:func:`own_state_key`); ``Metric._load_from_state_dict`` puts them back by name.
  Looked for only once the job has imported torchmetrics (format/metric_states.py); their values
  after a call that changes them are recorded too (tracing/buffer_watch.py).
"""

from __future__ import annotations

from typing import Any

import torch

from modulelens.format.metric_states import metric_states, own_metric_states
from modulelens.tracing.fingerprint import fingerprints


def own_state(module: torch.nn.Module) -> dict[str, object]:
    """``module``'s own state beyond parameters, buffers and extra state (module docstring), by the
    names its ``_load_from_state_dict`` takes; ``{}`` for most modules."""
    state: dict[str, object] = {}
    if type(module)._save_to_state_dict is not torch.nn.Module._save_to_state_dict:
        destination: dict[str, Any] = {}
        module._save_to_state_dict(destination, "", keep_vars=True)
        known = {*module._parameters, *module._buffers, "_extra_state"}
        state.update((key, value) for key, value in destination.items() if key not in known)
    state.update(own_metric_states(module))
    return state


def own_state_key(module: torch.nn.Module) -> tuple[object, ...]:
    """What changes when the metric states of ``module`` and its submodules change: their names,
    list lengths and a fingerprint of every tensor's bits (``()`` where there are none). A metric
    replaces its state tensors as often as it changes them in place, so identities alone could
    repeat (a freed tensor's id reused)."""
    names: list[object] = []
    tensors: list[torch.Tensor] = []
    for name, value in metric_states(module).items():
        parts = value if isinstance(value, list) else [value]
        names.append((name, len(parts) if isinstance(value, list) else -1))
        tensors.extend(p for p in parts if isinstance(p, torch.Tensor))
    return (tuple(names), fingerprints(tensors)) if names else ()
