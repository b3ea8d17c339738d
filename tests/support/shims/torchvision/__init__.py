"""A stand-in for the parts of ``torchvision`` that ``timm`` imports at module level.

torchvision's wheels on PyPI require a newer torch than the CPU build the suite pins, so it cannot
be installed here. timm's models need only ``FrozenBatchNorm2d`` (a real implementation below);
its data pipeline imports ``torchvision.transforms``, which is present only as names that raise
when used. Put on ``sys.path`` by the zoo's worker processes only, never in the test process
(transformers would otherwise believe torchvision is installed).
"""

__version__ = "0.0.0+modulelens-shim"
