"""Restore: captures back as modules, recorded calls, and replay.

Names are imported on first use (PEP 562): ``restore.summary`` (``modulelens show``) reads
metadata without importing torch.
"""

from __future__ import annotations

import importlib

_TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~2 ms of a fresh `show`, issue 37)
if _TYPE_CHECKING:
    from typing import Any

    from modulelens.restore.calls import Call
    from modulelens.restore.compare import LeafResult, compare
    from modulelens.restore.divergence import Divergence, DivergenceRule, locate
    from modulelens.restore.loader import Capture, load
    from modulelens.restore.replay import CallReplay, ReplayReport
    from modulelens.restore.ulp import ulp_distance, ulp_error

_LAZY = {"LeafResult": "modulelens.restore.compare", "compare": "modulelens.restore.compare",
         "Call": "modulelens.restore.calls", "Capture": "modulelens.restore.loader", "load": "modulelens.restore.loader",
         "CallReplay": "modulelens.restore.replay", "ReplayReport": "modulelens.restore.replay",
         "Divergence": "modulelens.restore.divergence", "DivergenceRule": "modulelens.restore.divergence",
         "locate": "modulelens.restore.divergence", "ulp_distance": "modulelens.restore.ulp",
         "ulp_error": "modulelens.restore.ulp"}

__all__ = ["Call", "CallReplay", "Capture", "Divergence", "DivergenceRule", "LeafResult", "ReplayReport", "compare",
           "load", "locate", "ulp_distance", "ulp_error"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
