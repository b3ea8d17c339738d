"""Stand-in for Hugging Face ``datasets`` in the torchtune test's process only.

``import torchtune`` imports its dataset builders, which import ``datasets`` (and with it pyarrow
and pandas, ~270 MB) at module level; the tests build torchtune models and never load a dataset.
Every name here raises if used, so a test that did need the real package would fail loudly.
"""

from __future__ import annotations

from typing import Any


def load_dataset(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("the modulelens test shim of `datasets` cannot load datasets")
