"""Names timm only imports (datasets, transforms): placeholders that fail when used."""

from __future__ import annotations

from typing import Any


class _Missing(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder(f"{cls.__name__}.{name}")


def placeholder(name: str) -> type:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"torchvision.{name} is not available: this is the test stand-in (tests/support/shims)")

    return _Missing(name, (), {"__init__": fail, "__call__": fail})
