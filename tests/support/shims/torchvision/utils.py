"""Placeholders for torchvision names timm imports (see torchvision/__init__.py)."""

from torchvision._placeholder import placeholder


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return placeholder(name)
