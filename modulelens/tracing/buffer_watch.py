"""Which buffers a recorded call changed: BatchNorm's running statistics, an EMA codebook, a step
counter; and which torchmetrics metric states (format/metric_states.py), what a metric's ``update``
exists to change. Replay compares outputs; without the buffers after the call, a rewrite that forgot
to update its running statistics matched every recorded output and passed, and a metric's
``update`` (it returns ``None``) could not be verified at all (docs/fidelity.md, "Buffers a call
changes")."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from modulelens.format.layouts import is_plain
from modulelens.format.metric_states import metric_states
from modulelens.tracing.fingerprint import LiveState, fingerprints
from modulelens.tracing.snapshot import Snapshotter


@dataclass
class BufferWatch:
    """A target's buffers on entry to a recorded call: each one's identity and fingerprint (a write
    through ``.data``, the way EMA updates are often written, leaves the version counter alone);
    and its metric states' :func:`_metric_print`."""

    module: torch.nn.Module
    entry: dict[str, tuple[int, int]]  # buffer name -> (id of the tensor, fingerprint of its bits)
    metrics: dict[str, tuple[object, ...]]  # metric state name -> _metric_print on entry

    @classmethod
    def of(cls, module: torch.nn.Module, weights: LiveState) -> BufferWatch | None:
        """From :func:`~modulelens.tracing.fingerprint.live_state`'s values on entry (its
        fingerprints list the parameters first, then the buffers); ``None`` for a module without
        buffers or metric states, which costs nothing more then."""
        params, buffers, key = weights
        metrics = {name: _metric_print(value) for name, value in metric_states(module).items()}
        if not buffers and not metrics:
            return None
        prints = key[1]
        offset = len(params)
        return cls(module, {name: (id(tensor), prints[offset + i]) for i, (name, tensor) in enumerate(buffers.items())},
                   metrics)

    def changed(self) -> dict[str, object]:
        """The buffers (by name, live) that the call assigned anew or changed the bits of, and the
        metric states whose bits, shapes or list lengths it changed (:meth:`changed_metrics`). Only
        dense tensors of torch's own class on a real device are watched: a meta (offloaded) buffer
        has no bits here, a DTensor's local shard is not the module's value, and a sparse buffer is
        not stored (the constructor makes it). Where the bits cannot be read (a functorch wrapper
        during a ``functional_call``), every buffer is kept: more bytes, never a missed change."""
        return {**self._changed_buffers(), **self.changed_metrics()}

    def _changed_buffers(self) -> dict[str, object]:
        now = {name: tensor for name, tensor in self.module.named_buffers(remove_duplicate=False)
               if type(tensor) is torch.Tensor and is_plain(tensor) and not tensor.is_meta}
        if not now:
            return {}
        same = [name for name, tensor in now.items() if self.entry.get(name, (None,))[0] == id(tensor)]
        try:
            prints = dict(zip(same, fingerprints([now[name] for name in same]), strict=True))
        except RuntimeError:
            return dict(now)
        return {name: tensor for name, tensor in now.items()
                if name not in prints or prints[name] != self.entry[name][1]}

    def changed_metrics(self) -> dict[str, object]:
        """The metric states (by dotted name, live) the call changed, and those it added."""
        if not self.metrics:
            return {}
        return {name: value for name, value in metric_states(self.module).items()
                if self.metrics.get(name) != _metric_print(value)}

    def copies(self, snap: Snapshotter) -> dict[str, object]:
        """Copies of the :meth:`changed` buffers, made anew: BatchNorm's kernel writes its running
        statistics without moving their version counters, so the snapshot's memo would hand back
        their copies from the start of the call."""
        changed = self.changed()
        if not changed:
            return {}
        snap.forget([part for value in changed.values() for part in (value if isinstance(value, list) else [value])
                     if isinstance(part, torch.Tensor)])
        copied: dict[str, object] = snap.tree(changed)
        return copied


def _metric_print(value: object) -> tuple[object, ...]:
    """A metric state's list length (``-1`` for a tensor), and each tensor's shape, dtype and
    fingerprint: a metric replaces its state tensors as often as it changes them in place, and a
    ``cat`` state grows by appending."""
    parts = value if isinstance(value, list) else [value]
    tensors = [part for part in parts if isinstance(part, torch.Tensor)]
    try:
        prints: tuple[object, ...] = fingerprints(tensors)
    except RuntimeError:  # no storage to read (a functorch wrapper): never equal, so always recorded
        prints = (object(),)
    others = tuple(type(part).__name__ for part in parts if not isinstance(part, torch.Tensor))
    return (len(parts) if isinstance(value, list) else -1, tuple((tuple(t.shape), t.dtype) for t in tensors), prints, others)
