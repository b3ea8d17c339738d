"""What a tool reads of a stored capture without rebuilding its module.

Comparing weights, summarising tensors or drawing their distributions needs a capture's metadata
and its recorded tensors by id, nothing else. :class:`~modulelens.restore.loader.Capture` provides
both; so does the web UI's read-only view of a stored capture, which imports nothing the capture
names (docs/ui.md). Functions that need only this take a :class:`RecordedTensors`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


class RecordedTensors(Protocol):
    """A capture's metadata (``capture.json``, docs/format.md) and its recorded tensors by id."""

    @property
    def metadata(self) -> Mapping[str, Any]: ...

    def tensor(self, tid: str) -> torch.Tensor:
        """The recorded tensor ``tid`` as stored (memory-mapped: reading part of it reads that part)."""
        ...
