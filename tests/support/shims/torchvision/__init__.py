"""A stand-in for the few torchvision names timm imports at import time (torchvision cannot be
installed next to the CPU build of torch used here: every wheel pins a CUDA torch). It is on the
path after site-packages, so a real torchvision always wins. Nothing here is under test."""
