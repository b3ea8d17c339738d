"""Which buffers a recorded call changed: BatchNorm's running statistics, an EMA codebook, a step
counter. Replay compares outputs; without the buffers after the call, a rewrite that forgot to
update its running statistics matched every recorded output and passed (docs/fidelity.md,
"Buffers a call changes")."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from modulelens.format.layouts import is_plain
from modulelens.tracing.fingerprint import LiveState, fingerprints
from modulelens.tracing.snapshot import Snapshotter


@dataclass
class BufferWatch:
    """A target's buffers on entry to a recorded call: each one's identity and fingerprint (a write
    through ``.data``, the way EMA updates are often written, leaves the version counter alone)."""

    module: torch.nn.Module
    entry: dict[str, tuple[int, int]]  # buffer name -> (id of the tensor, fingerprint of its bits)

    @classmethod
    def of(cls, module: torch.nn.Module, weights: LiveState) -> BufferWatch | None:
        """From :func:`~modulelens.tracing.fingerprint.live_state`'s values on entry (its
        fingerprints list the parameters first, then the buffers); ``None`` for a module without
        buffers, which costs nothing more then."""
        params, buffers, key = weights
        if not buffers:
            return None
        prints = key[1]
        offset = len(params)
        return cls(module, {name: (id(tensor), prints[offset + i]) for i, (name, tensor) in enumerate(buffers.items())})

    def changed(self) -> dict[str, torch.Tensor]:
        """The buffers (by name, live) that the call assigned anew or changed the bits of. Only
        dense tensors of torch's own class on a real device are watched: a meta (offloaded) buffer
        has no bits here, a DTensor's local shard is not the module's value, and a sparse buffer is
        not stored (the constructor makes it). Where the bits cannot be read (a functorch wrapper
        during a ``functional_call``), every buffer is kept: more bytes, never a missed change."""
        now = {name: tensor for name, tensor in self.module.named_buffers(remove_duplicate=False)
               if type(tensor) is torch.Tensor and is_plain(tensor) and not tensor.is_meta}
        if not now:
            return {}
        same = [name for name, tensor in now.items() if self.entry.get(name, (None,))[0] == id(tensor)]
        try:
            prints = dict(zip(same, fingerprints([now[name] for name in same]), strict=True))
        except RuntimeError:
            return now
        return {name: tensor for name, tensor in now.items()
                if name not in prints or prints[name] != self.entry[name][1]}

    def copies(self, snap: Snapshotter) -> dict[str, object]:
        """Copies of the :meth:`changed` buffers, made anew: BatchNorm's kernel writes its running
        statistics without moving their version counters, so the snapshot's memo would hand back
        their copies from the start of the call."""
        changed = self.changed()
        if not changed:
            return {}
        snap.forget(list(changed.values()))
        copied: dict[str, object] = snap.tree(changed)
        return copied
