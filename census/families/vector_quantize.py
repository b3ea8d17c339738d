"""vector-quantize-pytorch: every quantizer class it exports (VQ, residual and grouped VQ, FSQ,
LFQ, SimVQ, latent quantization, random projection, binary mapping, ...).

Constructor arguments come from the signature by name (``TYPICAL``: features of width 16, a
codebook of 32 codes, FSQ levels 8-5-5, two quantizers, two groups), the library's defaults
otherwise, so EMA codebooks update in train mode and k-means initialisation stays as the library
sets it. Inputs: the first of ``_candidates`` a quantizer accepts (a batch of 2 sequences of 8
vectors; an image feature map; the codebook width for FSQ without a projection). Captured: the
quantizer (its outputs: the quantized features, the code indices, the losses).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.construct import Inputs, construct, exported, first_accepted
from census.targets import CannotBuildError, Job, Sample, Target

DIM = 16
TYPICAL: dict[str, Any] = {
    "dim": DIM, "codebook_size": 32, "levels": [8, 5, 5], "num_quantizers": 2, "codebook_dim": 8, "scales": (1, 2),
}
# optional arguments without which a class refuses to build (LFQ: a width or a codebook size; ResidualVQ: a count)
SIZES: dict[str, Any] = {"num_quantizers": 2, "codebook_size": 32}
# the grouped quantizers pass their keyword arguments on to the residual quantizer of each group
GIVEN: dict[str, dict[str, Any]] = {
    "GroupedResidualFSQ": {"levels": [8, 5, 5], "num_quantizers": 2},
    "GroupedResidualLFQ": {"num_quantizers": 2, "codebook_size": 32},
    "GroupedResidualVQ": {"num_quantizers": 2, "codebook_size": 32},
}
NOT_TARGETS = {
    "Sequential": "a container (torch's Sequential re-exported)",
    "EvoLFQ": "an evolutionary search around an encoder and a decoder passed in, run through its own methods",
}


def _classes() -> dict[str, type[nn.Module]]:
    return exported(["vector_quantize_pytorch"])


def _build(name: str, cls: type[nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        if name in NOT_TARGETS:
            raise CannotBuildError(f"not a target: {NOT_TARGETS[name]}")
        return construct(cls, TYPICAL, {}, GIVEN.get(name, {}), SIZES, "census/families/vector_quantize.py TYPICAL")
    return build


def _candidates() -> list[Inputs]:
    def rand(*shape: int) -> Callable[[], tuple[torch.Tensor]]:
        return lambda: (torch.randn(*shape, generator=torch.Generator().manual_seed(16)),)

    return [rand(2, 8, DIM), rand(2, DIM, 4, 4), rand(2, DIM, 8), rand(2, 8, 3), rand(2, 8, 5), rand(2, 8)]


def _job(model: nn.Module) -> Job:
    return first_accepted(model, _candidates())


def targets(sample: Sample) -> list[Target]:
    classes = _classes()
    names = sample.pick(list(classes), str, quick_count=2)
    return [Target(name, _build(name, classes[name]), _job, submodules=lambda _m: {"model": ""}) for name in names]
