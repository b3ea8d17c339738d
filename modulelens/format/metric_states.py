"""torchmetrics' metric states: what a ``Metric`` registered with ``add_state`` (running sums,
counts, lists of predictions), kept as plain attributes, neither parameters nor buffers, and changed
by every ``update`` and ``forward``. The tracer records them with each state
(tracing/own_state.py) and, when a call changes them, their values after it (``buffers_after``,
tracing/buffer_watch.py); replay and verify compare a run's with those (restore/buffer_check.py).
Read only once the job has imported torchmetrics: a job without it pays nothing and imports nothing.
"""

from __future__ import annotations

import sys

import torch


def own_metric_states(module: torch.nn.Module) -> dict[str, object]:
    """``module``'s own metric states by name (a tensor, or a list of tensors for a ``cat`` state);
    ``{}`` for anything that is not a torchmetrics ``Metric``."""
    metric = _metric_class()
    defaults = getattr(module, "_defaults", None) if metric is not None and isinstance(module, metric) else None
    return {name: getattr(module, name) for name in defaults} if isinstance(defaults, dict) else {}


def metric_states(module: torch.nn.Module) -> dict[str, object]:
    """The metric states of ``module`` and its submodules, by dotted name (``"acc.tp"``), as
    ``named_buffers()`` names buffers; ``{}`` when the job has not imported torchmetrics."""
    if _metric_class() is None:
        return {}
    return {f"{path}.{name}" if path else name: value
            for path, sub in module.named_modules() for name, value in own_metric_states(sub).items()}


def _metric_class() -> type | None:
    metrics = sys.modules.get("torchmetrics")  # never imported here
    found = getattr(metrics, "Metric", None)
    return found if isinstance(found, type) else None


def set_metric_states(module: torch.nn.Module, values: dict[str, object]) -> None:
    """Give ``module``'s metric states the ``values`` named as :func:`metric_states` names them (the
    others are left as they are), as ``Metric._load_from_state_dict`` does: by assignment. A
    metric's cached ``compute()`` value belongs to the states it had, so it is dropped."""
    for name, value in values.items():
        path, _, leaf = name.rpartition(".")
        owner = module.get_submodule(path) if path else module
        if leaf in own_metric_states(owner):
            setattr(owner, leaf, value)
            if "_computed" in vars(owner):
                vars(owner)["_computed"] = None


def metric_versions(module: torch.nn.Module) -> tuple[int, ...]:
    """Each metric state's list length (``-1`` for a tensor) and each of its tensors' identity and
    version counter: changes whenever a metric's ``update`` adds into a state, replaces or appends."""
    found: list[int] = []
    for value in metric_states(module).values():
        parts = value if isinstance(value, list) else [value]
        found.append(len(parts) if isinstance(value, list) else -1)
        found.extend(v for t in parts for v in (id(t), t._version if isinstance(t, torch.Tensor) else 0))
    return tuple(found)


def own_copy(value: object) -> object:
    """A metric state (a tensor, or a list of them) in memory of its own."""
    if isinstance(value, list):
        return [own_copy(part) for part in value]
    return value.clone() if isinstance(value, torch.Tensor) else value
