"""kornia: every module class of its augmentation, filters, color, enhance, geometry.transform,
losses, feature, contrib and models packages (vision without torchvision).

Classes are what those packages export (``census.construct.exported``; base classes and
dispatchers left out); constructor arguments come from the signature, by name (``TYPICAL``;
``GIVEN`` where one name means different things in different classes), keeping kornia's
defaults otherwise, so the augmentations apply with their default probability (0.5, drawn from
torch's generator in both modes) and ``pretrained`` is turned off where it would download weights.
Inputs: the first of ``_candidates`` each module accepts: a batch of 16 px RGB images, grayscale,
RGBA, a 3D volume, image pairs, logits with labels, 32/41 px patches, descriptor sets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.construct import Inputs, construct, exported, first_accepted
from census.targets import CannotBuildError, Job, Sample, Target

PACKAGES = ["kornia.augmentation", "kornia.filters", "kornia.color", "kornia.enhance", "kornia.geometry.transform",
            "kornia.losses", "kornia.feature", "kornia.contrib", "kornia.models"]
B, H = 2, 16  # batch, image side


def _rgb() -> torch.Tensor:
    return torch.tensor([0.5, 0.4, 0.3])


TYPICAL: dict[str, Any] = {
    "size": (8, 8), "max_size": 12, "degrees": 10.0, "mean": _rgb(), "std": _rgb(), "kernel_size": 3,
    "sigma": (1.0, 1.0), "sigma_color": 0.1, "sigma_space": (1.5, 1.5), "angle": 15.0, "direction": 0.5,
    "center_x": torch.tensor([-0.3, 0.3]), "center_y": torch.tensor([-0.3, 0.3]), "gamma": torch.tensor([0.9, 1.0]),
    "times": (-1.0, 1.0), "shear": 10.0, "eps": 0.01, "lower": (0.2, 0.2, 0.2), "upper": (0.8, 0.8, 0.8),
    "alpha_val": 1.0, "alpha": 0.5, "beta": 0.5, "brightness_factor": 0.2, "contrast_factor": 1.2,
    "hue_factor": 0.1, "saturation_factor": 1.3, "factor": 0.5, "thresh": 0.5, "height": H, "width": H,
    "num_features": 4, "k": 0.04, "window_size": 3, "max_val": 1.0, "original_size": (H, H), "num_in_ch": 3,
    "num_out_ch": 3, "p": 0.5, "p_batch": 1.0,
}
GIVEN: dict[str, dict[str, Any]] = {
    "AddWeighted": {"alpha": 0.5, "beta": 0.5, "gamma": 0.0},
    "AdjustGamma": {"gamma": 1.5},
    "Rotate": {"angle": torch.tensor([15.0, -15.0])},
    "Scale": {"scale_factor": torch.tensor([[1.2, 1.2], [0.8, 0.8]])},
    "Translate": {"translation": torch.tensor([[1.0, 2.0], [-1.0, 0.0]])},
    "transform.Shear": {"shear": torch.tensor([[0.1, 0.0], [0.0, 0.1]])},
    "transform.Rotate": {"angle": torch.tensor([15.0, -15.0])},
    "transform.Scale": {"scale_factor": torch.tensor([[1.2, 1.2], [0.8, 0.8]])},
    "transform.Translate": {"translation": torch.tensor([[1.0, 2.0], [-1.0, 0.0]])},
    "augmentation.RandomMotionBlur3D": {"angle": 15.0, "direction": 0.5},
    "augmentation.RandomRotation90": {"times": (-1, 2)},
    "contrib.CombineTensorPatches": {"original_size": (H, H), "window_size": (4, 4), "stride": (4, 4)},
    "contrib.ExtractTensorPatches": {"window_size": 4},
    "transform.Affine": {"angle": torch.tensor([15.0, -15.0])},
}
# optional arguments given where the class takes them: no weights from a hub (no network)
SIZES: dict[str, Any] = {"pretrained": False}
CLASS_SIZES: dict[str, dict[str, Any]] = {"feature.LoFTR": {"pretrained": None}}
FACTORIES: dict[str, Callable[[], Any]] = {
    "cfa": lambda: __import__("kornia").color.CFA.BG,
    "colormap": lambda: __import__("kornia").color.ColorMap("autumn"),
    "reference_signal": lambda: torch.rand(B, 1, H, H, generator=torch.Generator().manual_seed(3)),
}
NOT_TARGETS = {
    "augmentation.ManyToManyAugmentationDispather": "a dispatcher of other augmentations (no transform of its own)",
    "augmentation.ManyToOneAugmentationDispather": "a dispatcher of other augmentations (no transform of its own)",
    "augmentation.ImageSequential": "a container (empty by default)", "augmentation.VideoSequential": "a container",
    "augmentation.AugmentationSequential": "a container", "augmentation.PatchSequential": "a container",
    "transform.ImageRegistrator": "an optimisation loop (its forward fits a model to two images)",
    # over the census's CPU budget: 35-75 s a call on a 16 px image (they work at a fixed large scale)
    "feature.SIFTFeatureScaleSpace": "over the census's time budget (75 s a call without capture)",
    "feature.SOLD2": "over the census's time budget (35 s a call without capture)",
    "feature.SOLD2_detector": "over the census's time budget (40 s a call without capture)",
}


def _skip(name: str, cls: type) -> bool:
    return "Base" in name or name in ("BaseModel", "BaseWarper")


def _classes() -> dict[str, type[nn.Module]]:
    return exported(PACKAGES, _skip)


def _build(key: str, cls: type[nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        if key in NOT_TARGETS:
            raise CannotBuildError(f"not a target: {NOT_TARGETS[key]}")
        given = GIVEN.get(key, GIVEN.get(cls.__name__, {}))
        sizes = {**SIZES, **CLASS_SIZES.get(key, {})}
        return construct(cls, TYPICAL, FACTORIES, given, sizes, "census/families/kornia.py TYPICAL")
    return build


def _candidates() -> list[Inputs]:
    def g() -> torch.Generator:
        return torch.Generator().manual_seed(5)

    def img(c: int = 3, side: int = H) -> Callable[[], torch.Tensor]:
        return lambda: torch.rand(B, c, side, side, generator=g())

    def tensors(*makers: Callable[[], torch.Tensor]) -> Inputs:
        return lambda: tuple(make() for make in makers)

    def ids(high: int, *shape: int) -> Callable[[], torch.Tensor]:
        return lambda: torch.randint(0, high, shape, generator=g())

    def lafs() -> torch.Tensor:  # three local affine frames per image, 4 px around the centre
        return torch.tensor([[4.0, 0.0, 16.0], [0.0, 4.0, 16.0]]).expand(B, 3, 2, 3).clone()

    labels = ids(3, B, H, H)
    binary = lambda: (torch.rand(B, 1, H, H, generator=g()) > 0.5).float()  # noqa: E731
    volume = lambda: torch.rand(B, 3, 4, H, H, generator=g())  # noqa: E731
    logits = lambda: torch.randn(B, 3, H, H, generator=g())  # noqa: E731
    return [tensors(img()), tensors(img(1)), tensors(img(4)), tensors(lambda: torch.rand(B, 3, 4, H, H, generator=g())),
            tensors(img(), img()), tensors(img(1), img(1)), tensors(lambda: torch.randn(B, 3, H, H, generator=g()), labels),
            tensors(lambda: torch.randn(B, 1, H, H, generator=g()), binary), tensors(img(1), img()),
            tensors(img(1, 32)), tensors(img(1, 41)), tensors(img(1, 64)), tensors(img(3, 64)),
            tensors(lambda: torch.rand(5, 8, generator=g()), lambda: torch.rand(6, 8, generator=g())),
            tensors(img(1), lambda: torch.rand(B, 2, H // 2, H // 2, generator=g())), lambda: (),
            tensors(lambda: torch.randn(B, 1, H, H, generator=g()), ids(2, B, H, H)),
            tensors(logits, ids(3, B, 1, H, H)), tensors(volume, volume), tensors(img(), lambda: torch.eye(3).expand(B, 3, 3)),
            tensors(lambda: torch.rand(1, 1, 32, 32, generator=g())),
            tensors(lafs, img(1, 32))]


def _job(model: nn.Module) -> Job:
    return first_accepted(model, _candidates())


def targets(sample: Sample) -> list[Target]:
    classes = _classes()
    keys = sample.pick(list(classes), str, quick_count=2)
    return [Target(key, _build(key, classes[key]), _job, submodules=lambda _m: {"model": ""}) for key in keys]
