from torchvision._unavailable import module_getattr

__getattr__ = module_getattr("torchvision.utils")
