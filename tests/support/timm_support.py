"""``import_timm()``: timm without torchvision, which cannot be installed next to the CPU build of
torch used here (every torchvision wheel pins a CUDA torch).

timm imports a few torchvision names at import time (``FrozenBatchNorm2d``; datasets and
transforms it only uses for data loading). While timm is imported, ``shims/torchvision`` stands in
for them; it is then taken off the path and out of ``sys.modules`` again, so that other libraries
(transformers checks ``find_spec("torchvision")``) still see no torchvision. A real torchvision,
when installed, is used instead. Models are built from timm's own code, unchanged.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SHIMS = str(Path(__file__).resolve().parent / "shims")


def import_timm() -> ModuleType:
    if "timm" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        import timm

        return timm
    sys.path.insert(0, SHIMS)
    try:
        import timm
    finally:
        sys.path.remove(SHIMS)
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
    return timm
