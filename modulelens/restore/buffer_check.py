"""The buffers a replayed or verified call changes, against those the recorded call changed.

A call can change its module as well as return an output: BatchNorm's running statistics, an EMA
codebook, a step counter. Comparing outputs alone passed a rewrite that forgot to update them
(its outputs in training mode use the batch's statistics, so they matched), and one that updated
them where the recorded call did not. The capture records each changed buffer's value after the
call (``calls[i].buffers_after``, tracing/buffer_watch.py); this compares the module's buffers
after the run with them, and, for captures that watched every buffer (their settings say
``"buffers_after": true``), checks that the others kept their recorded values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from modulelens.format.layouts import is_plain, version_counter
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
        watched = capture.metadata.get("capture", {}).get("buffers_after") is True
        # the others' values on entry, to see a change the version counter misses (BatchNorm's
        # kernel writes its running statistics without moving it); a large one by its counter only
        self._entry = {name: (tensor, version_counter(tensor), tensor.detach().clone() if tensor.nbytes <= _COPIED_MAX_BYTES
                              else None)
                       for name, tensor in module.named_buffers(remove_duplicate=False)
                       if watched and is_plain(tensor) and not tensor.is_meta and name not in call.buffers_after}

    def leaves(self, module: torch.nn.Module, *, exact: bool, rtol: float | None, atol: float | None,
               cross_device: bool, ulps: UlpTolerance | None) -> list[LeafResult]:
        """One result per buffer leaf the recorded call changed, and per buffer the run changed
        although the recorded call left it as it was."""
        expected = self._call.buffers_after
        now = dict(module.named_buffers(remove_duplicate=False))
        found: list[LeafResult] = []
        for name, after in expected.items():
            root = f"buffers['{name}'](after the call)"
            if name not in now:
                found.append(LeafResult(path=root, passed=True, kind=MISSING_BUFFER, compared=False,
                                        message="the recorded call changed this buffer and the module has no buffer "
                                                "of that name, so its update is not checked"))
                continue
            found += compare(after, now[name], exact=exact, rtol=rtol, atol=atol, cross_device=cross_device,
                             ulps=ulps, root=root)
        for name, (before, version, copy) in self._entry.items():
            tensor = now.get(name)
            if tensor is None:
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


def starts_as_recorded(capture: Capture, call: Call, module: torch.nn.Module) -> bool:
    """Whether ``module`` holds the buffers ``call``'s recorded state starts from (a replay with the
    current weights: the module you pass, loaded with that state or left unchanged): only then do
    its buffers after the run say anything about the recorded call's."""
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
    return True
