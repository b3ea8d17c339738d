"""Names timm's data pipeline imports; using any of them raises (no image transforms here)."""

from enum import Enum

from torchvision._unavailable import module_getattr


class InterpolationMode(Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


__getattr__ = module_getattr("torchvision.transforms")
