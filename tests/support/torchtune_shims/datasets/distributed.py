"""See ``datasets/__init__.py``: a stand-in that raises if used."""

from __future__ import annotations

from typing import Any


def split_dataset_by_node(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("the modulelens test shim of `datasets` cannot split datasets")
