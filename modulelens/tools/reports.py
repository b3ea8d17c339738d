"""Reports of the tools: JSON-safe numbers, the facts that make a measurement comparable, and
keeping a report with the capture's version."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from modulelens.restore.loader import Capture


def json_safe(value: Any) -> Any:
    """Replace NaN/inf (not valid JSON) by their string names, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "to_dict"):
        return json_safe(value.to_dict())
    return value


def store_report(capture: Capture, kind: str, data: Mapping[str, object]) -> str | None:
    """Store a tool report with the capture's version; returns its path (None if the repo is read-only)."""
    try:
        return str(capture.repo.add_report(capture.ref, kind, json_safe(data)))
    except OSError:
        return None


def environment_facts(device: torch.device) -> dict[str, object]:
    """torch version, device, CPU threads (and GPU name) for a report."""
    facts: dict[str, object] = {"torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads()}
    if device.type == "cuda":
        facts["gpu_name"] = torch.cuda.get_device_name(device)
    return facts
