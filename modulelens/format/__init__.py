"""The capture format: typed JSON metadata plus content-addressed raw tensor payloads.

Names are imported on first use (PEP 562), so reading metadata (``modulelens ls``/``show``)
does not import torch.
"""

from __future__ import annotations

import importlib

_TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (`ls` reads format.human: ~2 ms)
if _TYPE_CHECKING:
    from typing import Any

    from modulelens.format.op_trace import OpTrace
    from modulelens.format.shape_only import ShapeOnly
    from modulelens.format.spec import FORMAT_NAME, FORMAT_VERSION
    from modulelens.format.values import Unrecorded, register_codec, register_state_codec

_LAZY = {"FORMAT_NAME": "modulelens.format.spec", "FORMAT_VERSION": "modulelens.format.spec",
         "OpTrace": "modulelens.format.op_trace",
         "ShapeOnly": "modulelens.format.shape_only", "Unrecorded": "modulelens.format.values",
         "register_codec": "modulelens.format.values", "register_state_codec": "modulelens.format.values"}

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "OpTrace", "ShapeOnly", "Unrecorded", "register_codec",
           "register_state_codec"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
