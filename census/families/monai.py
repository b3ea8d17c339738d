"""MONAI: every network class of ``monai.networks.nets`` (medical imaging, no torchvision).

Classes are what ``monai.networks.nets`` exports, each once (MONAI exports most under three
spellings: ``BasicUNet``, ``BasicUnet``, ``Basicunet``). Constructor arguments come from the
signature by name (``TYPICAL``: 2D, one input channel, two classes, 32 px), and the optional size
arguments a network takes are shrunk (``SIZES``: a few narrow feature levels, one block per
stage, small transformer widths), so that each stays a few hundred thousand parameters;
``pretrained`` stays off (no network). Inputs: the first of a 32 px and a 64 px image, a 16 px
volume, or token ids that the network accepts. Captured: the network and, by rule, its first
repeated block with that block's attention and MLP.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.construct import Inputs, construct, exported, first_accepted
from census.targets import CannotBuildError, Job, Sample, Target

B, S = 2, 32  # batch, image side

TYPICAL: dict[str, Any] = {
    "spatial_dims": 2, "in_channels": 1, "out_channels": 2, "channels": (4, 8, 16), "strides": (2, 2),
    "img_size": (S, S), "image_size": (S, S), "patch_size": (8, 8), "in_shape": (1, S, S), "classes": 2,
    "num_classes": 2, "out_shape": (2,), "latent_shape": (4,), "start_shape": (8, 8, 8), "kernel_size": (3, 3, 3),
    "upsample_kernel_size": (2, 2), "hidden_channels": (8, 8), "num_channel_initial": 4, "depth": 2,
    "extract_levels": (0, 1, 2), "num_tokens": 16, "max_seq_len": 8, "attn_layers_dim": 8, "attn_layers_depth": 1,
    "attn_layers_heads": 2, "hidden_size": 32, "mlp_dim": 64, "num_layers": 2, "num_heads": 2, "layers": (1, 1, 1, 1),
    "block_inplanes": (4, 8, 16, 32), "block": "basic", "groups": 1, "reduction": 4, "num_d": 2, "num_layers_d": 2,
    "dim": 8, "in_planes": 4, "planes": 4, "backbone": "efficientnet-b0", "model_name": "efficientnet-b0",
    "blocks_args_str": ["r1_k3_s11_e1_i4_o8_se0.25", "r1_k3_s22_e6_i8_o16_se0.25"], "hyena_stages": 1,
    "num_language_layers": 1, "num_vision_layers": 1, "num_mixed_layers": 1, "code_size": 4, "latent_size": 4,
    "input_image_size": (S, S), "label_nc": 2, "unet_out_channels": 4, "encode_channels": (8, 8),
    "decode_channels": (8, 8),
}
# optional arguments: small sizes in place of defaults made for real scans, no downloaded weights
SIZES: dict[str, Any] = {
    "pretrained": False, "spatial_dims": 2, "in_channels": 1, "n_input_channels": 1, "num_res_channels": (8, 16),
    "features": (4, 4, 8, 16, 32, 4), "init_filters": 8, "feature_size": 12, "init_features": 4,
    "growth_rate": 4, "block_config": (2, 2), "num_res_blocks": 1, "channels": (8, 16), "attention_levels": (False, True),
    "norm_num_groups": 4, "num_head_channels": 4, "latent_channels": 2, "filters": (4, 8, 16),
    "num_heads": 2, "hidden_size": 32, "mlp_dim": 64, "num_layers": 2, "decoder_hidden_size": 16, "decoder_mlp_dim": 32,
    "decoder_num_layers": 1, "decoder_num_heads": 2, "embed_dim": 16, "num_filters": 8, "num_channels": 1,
    "num_classes": 2, "layers": (1, 1, 1, 1), "inplanes": 8, "width_coefficient": 0.25, "depth_coefficient": 0.25,
    "decoder_channels": (16, 8, 8, 4, 4), "block_inplanes": (4, 8, 16, 32), "num_init_features": 8,
    "dim_head": 8, "out_classes": 2, "backbone_num_features": 16, "trans_blocks": 1,
}
GIVEN: dict[str, dict[str, Any]] = {
    "DynUNet": {"strides": (1, 2, 2)},  # a stride per kernel (level)
    "AutoEncoder": {"strides": (2, 2, 2)}, "VarAutoEncoder": {"strides": (2, 2, 2)},  # a stride per channel count
    "SwinUNETR": {"depths": (1, 1, 1, 1), "num_heads": (1, 1, 1, 1)},
    "ViTAutoEnc": {"patch_size": (4, 4)}, "NaViT": {"image_size": S, "patch_size": 8},
    "PatchDiscriminator": {"channels": 8}, "MultiScalePatchDiscriminator": {"channels": 8},
    "ResNetEncoder": {"model_name": "resnet10"}, "ResNetFeatures": {"model_name": "resnet10"},
    "SENet": {"block": "se_bottleneck"},
}
# passed to the classes that take only ``**kwargs`` (SENet154, SEResNet50, ...: SENet's arguments)
KWARGS: dict[str, Any] = {"spatial_dims": 2, "in_channels": 1, "num_classes": 2, "layers": (1, 1, 1, 1)}
NOT_TARGETS = {
    "BertPreTrainedModel": "a base class of MONAI's BERT parts (no forward of its own)",
    "NetAdapter": "wraps another network (its classes are targets of their own)",
}


def _classes() -> dict[str, type[nn.Module]]:
    return exported(["monai.networks.nets"])


def _build(name: str, cls: type[nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        if name in NOT_TARGETS:
            raise CannotBuildError(f"not a target: {NOT_TARGETS[name]}")
        given = dict(GIVEN.get(name, {}))
        parameters = inspect.signature(cls.__init__).parameters.values()
        if any(p.kind == p.VAR_KEYWORD for p in parameters) and not any(p.name == "spatial_dims" for p in parameters):
            given = {**KWARGS, **given}
        return construct(cls, TYPICAL, {}, given, SIZES, "census/families/monai.py TYPICAL")
    return build


def _candidates() -> list[Inputs]:
    def g() -> torch.Generator:
        return torch.Generator().manual_seed(7)

    return [lambda: (torch.rand(B, 1, S, S, generator=g()),), lambda: (torch.rand(B, 1, 64, 64, generator=g()),),
            lambda: (torch.rand(B, 1, 16, 16, 16, generator=g()),), lambda: (torch.rand(B, 1, S, S, S, generator=g()),),
            lambda: (torch.randint(0, 16, (B, 8), generator=g()),), lambda: (torch.rand(B, 4, generator=g()),),
            lambda: (torch.rand(B, 8, S, S, generator=g()),), lambda: (torch.rand(B, 4, S, S, generator=g()),),
            lambda: (torch.rand(B, 1, S, S, generator=g()), torch.tensor([10, 20])),
            lambda: (torch.rand(B, 1, S, S, generator=g()), torch.tensor([10, 20]), torch.rand(B, 1, S, S, generator=g())),
            lambda: (torch.rand(B, 1, S, S, generator=g()), torch.rand(B, 1, S, S, generator=g())),
            lambda: (torch.rand(B, 1, S, S, generator=g()), torch.rand(B, 2, S, S, generator=g())),
            lambda: (torch.rand(B, 1, generator=g()),), lambda: (torch.rand(B, S, S, 8, generator=g()),)]


def _job(model: nn.Module) -> Job:
    return first_accepted(model, _candidates())


def targets(sample: Sample) -> list[Target]:
    classes = _classes()
    names = sample.pick(list(classes), str, quick_count=2)
    return [Target(name, _build(name, classes[name]), _job) for name in names]
