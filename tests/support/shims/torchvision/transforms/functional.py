from torchvision._unavailable import module_getattr
from torchvision.transforms import InterpolationMode  # noqa: F401

__getattr__ = module_getattr("torchvision.transforms.functional")
