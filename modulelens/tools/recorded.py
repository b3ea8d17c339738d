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


def refuse_ensemble(recorded: RecordedTensors, tool: str) -> None:
    """A tool that runs one module on the recorded inputs (verify, diff, profile) cannot run calls
    recorded inside ``torch.func.vmap``: their inputs and weights are the members' values stacked
    (docs/fidelity.md, "torch.func"); only replay runs them, under vmap again.

    Raises:
        ToolError: some call of the capture ran inside ``torch.func.vmap``.
    """
    from modulelens.errors import ToolError

    if any(call.get("vmap") for call in recorded.metadata.get("calls", [])):
        name, version = recorded.metadata.get("name"), recorded.metadata.get("version")
        raise ToolError(f"{name}:v{version}: its calls ran inside torch.func.vmap (an ensemble of stacked weights); "
                        f"{tool} runs one module on them: replay() runs the ensemble")
