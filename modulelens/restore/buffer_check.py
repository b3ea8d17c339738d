"""The buffers a replayed or verified call changes, against those the recorded call changed.

A call can change its module as well as return an output: BatchNorm's running statistics, an EMA
codebook, a step counter. Comparing outputs alone passed a rewrite that forgot to update them
(its outputs in training mode use the batch's statistics, so they matched), and one that updated
them where the recorded call did not. The capture records each changed buffer's value after the
call (``calls[i].buffers_after``, tracing/buffer_watch.py); this compares the module's buffers
after the run with them, and, for captures that watched every buffer (their settings say
``"buffers_after": true``), checks that the others kept their recorded values. torchmetrics'
metric states (format/metric_states.py) are judged the same way, under their dotted names in the
same mapping: a metric's ``update`` returns ``None``, and its states after the call are all there
is to verify; the others are checked for captures whose settings say ``"metric_states_after":
true`` (older captures did not record them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from modulelens.format.layouts import clone, is_plain, version_counter
from modulelens.format.metric_states import metric_states
from modulelens.restore.compare import LeafResult, UlpTolerance, compare

if TYPE_CHECKING:
    from modulelens.restore.calls import Call
    from modulelens.restore.loader import Capture

MISSING_BUFFER = "missing buffer"  # the kind of a leaf that names a changed buffer the module does not have


class BufferCheck:
    """Made right before the run, on a module that holds the call's recorded state; :meth:`leaves`
    right after it, before anything puts the module back."""

    def __init__(self, capture: Capture, call: Call, module: torch.nn.Module) -> None:
        self._capture, self._call = capture, call
        settings = capture.metadata.get("capture", {})
        watched = settings.get("buffers_after") is True
        # the others' values on entry, to see a change the version counter misses (BatchNorm's
        # kernel writes its running statistics without moving it); a large one by its counter only
        self._entry = {name: (tensor, version_counter(tensor), tensor.detach().clone() if tensor.nbytes <= _COPIED_MAX_BYTES
                              else None)
                       for name, tensor in module.named_buffers(remove_duplicate=False)
                       if watched and is_plain(tensor) and not tensor.is_meta and name not in call.buffers_after}
        # metric states are small (running sums, counts, a list of predictions): copied whole
        self._metrics_entry = {name: _copied(value) for name, value in metric_states(module).items()
                               if settings.get("metric_states_after") is True and name not in call.buffers_after}

    def leaves(self, module: torch.nn.Module, *, exact: bool, rtol: float | None, atol: float | None,
               cross_device: bool, ulps: UlpTolerance | None) -> list[LeafResult]:
        """One result per buffer leaf the recorded call changed, and per buffer the run changed
        although the recorded call left it as it was."""
        expected = self._call.buffers_after
        metrics = metric_states(module)
        now: dict[str, object] = {**dict(module.named_buffers(remove_duplicate=False)), **metrics}
        found: list[LeafResult] = []
        for name, after in expected.items():
            kind = "metric state" if name in metrics or not isinstance(after, torch.Tensor) else "buffer"
            root = f"{'metric_states' if kind == 'metric state' else 'buffers'}['{name}'](after the call)"
            if name not in now:
                found.append(LeafResult(path=root, passed=True, kind=MISSING_BUFFER, compared=False,
                                        message=f"the recorded call changed this {kind} and the module has no {kind} "
                                                "of that name, so its update is not checked"))
                continue
            found += compare(after, now[name], exact=exact, rtol=rtol, atol=atol, cross_device=cross_device,
                             ulps=ulps, root=root)
        for name, before in self._metrics_entry.items():
            if name in metrics and not _same(before, metrics[name]):
                found += compare(before, metrics[name], exact=exact, rtol=rtol, atol=atol, cross_device=cross_device,
                                 ulps=ulps, root=f"metric_states['{name}'](after the call, which left it unchanged)")
        for name, (before, version, copy) in self._entry.items():
            tensor = now.get(name)
            if not isinstance(tensor, torch.Tensor):
                continue
            if copy is None:
                if tensor is before and version is not None and version_counter(tensor) == version:
                    continue
            elif copy.shape == tensor.shape and copy.dtype == tensor.dtype and torch.equal(copy, tensor):
                continue
            recorded = copy if copy is not None else self._recorded(name)
            if recorded is not None:
                found += compare(recorded, tensor, exact=exact, rtol=rtol, atol=atol, cross_device=cross_device,
                                 ulps=ulps, root=f"buffers['{name}'](after the call, which left it unchanged)")
        return found

    def _recorded(self, name: str) -> torch.Tensor | None:
        """Buffer ``name`` as the call's recorded state holds it (a fresh mapping: the module's own
        may be that storage), or ``None`` when the state does not hold it."""
        states = self._capture.metadata["states"]
        entry = states[self._call.state_index]["buffers"].get(name) if self._call.state_index < len(states) else None
        return None if entry is None else self._capture.fresh_tensor(entry["tensor"])


_COPIED_MAX_BYTES = 16 << 20


def _copied(value: object) -> object:
    """A metric state as it is now, kept apart from the module's (a tensor, or a list of them)."""
    if isinstance(value, list):
        return [_copied(part) for part in value]
    return clone(value.detach()) if isinstance(value, torch.Tensor) else value


def _same(before: object, now: object) -> bool:
    """Whether a metric state still holds what :func:`_copied` kept: the same list length, and
    each tensor the same shape, dtype and bits."""
    if isinstance(before, list) or isinstance(now, list):
        return isinstance(before, list) and isinstance(now, list) and len(before) == len(now) \
            and all(_same(b, n) for b, n in zip(before, now, strict=True))
    if isinstance(before, torch.Tensor) and isinstance(now, torch.Tensor):
        return before.shape == now.shape and before.dtype == now.dtype \
            and torch.equal(before, now.detach().to(before.device))
    return type(before) is type(now)


def starts_as_recorded(capture: Capture, call: Call, module: torch.nn.Module) -> bool:
    """Whether ``module`` holds the buffers ``call``'s recorded state starts from (a replay with the
    current weights: the module you pass, loaded with that state or left unchanged): only then do
    its buffers (and metric states) after the run say anything about the recorded call's."""
    states = capture.metadata["states"]
    if call.state_index >= len(states):
        return False
    held = dict(module.named_buffers(remove_duplicate=False))
    for name, entry in states[call.state_index]["buffers"].items():
        tensor = held.get(name)
        if tensor is None or not is_plain(tensor) or tensor.is_meta:
            return False
        recorded = capture.fresh_tensor(entry["tensor"])
        if recorded.shape != tensor.shape or recorded.dtype != tensor.dtype \
                or not torch.equal(recorded, tensor.detach().to(recorded.device)):
            return False
    metrics = metric_states(module)
    if metrics:  # a metric's calls start from its running states as well
        held_states = capture.fresh_module_state(call.state_index)
        if any(name not in held_states or not _same(held_states[name], value) for name, value in metrics.items()):
            return False
    return True
