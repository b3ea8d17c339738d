"""Placeholders for torchvision names that timm imports (or subclasses) but the zoo never uses."""

from typing import Any


class _Placeholder(type):
    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return unavailable(f"{cls.__qualname__}.{attr}")


def unavailable(name: str) -> type:
    """A class that can be named and subclassed but raises when used."""

    def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"torchvision {name} is not available (modulelens test shim)")

    return _Placeholder(name.rpartition(".")[2], (), {"__init__": refuse, "__call__": refuse, "__qualname__": name})


def module_getattr(module: str) -> Any:
    def lookup(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return unavailable(f"{module}.{name}")
    return lookup
