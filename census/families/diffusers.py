"""diffusers: the UNets, the VAE and two diffusion transformers, from small configs.

Built from their classes with small sizes (``MODELS``: block widths 8-16, one layer per block,
groups of 4, 8 px latents), called as a pipeline calls them (noisy latents, a timestep, text
states where the model is conditioned). Captured: the model and, by rule, its first repeated
block with that block's attention and MLP.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.targets import Job, Sample, Target


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(11)


def _unet_condition() -> tuple[dict[str, Any], Callable[[], dict[str, Any]]]:
    config = dict(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16),
                  down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                  up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
                  attention_head_dim=2, norm_num_groups=4)
    return config, lambda: {"sample": torch.randn(2, 4, 8, 8, generator=_gen()), "timestep": torch.tensor([10, 20]),
                            "encoder_hidden_states": torch.randn(2, 3, 16, generator=_gen())}


def _unet() -> tuple[dict[str, Any], Callable[[], dict[str, Any]]]:
    config = dict(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
                  down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                  norm_num_groups=4, attention_head_dim=4)
    return config, lambda: {"sample": torch.randn(2, 3, 8, 8, generator=_gen()), "timestep": torch.tensor([10, 20])}


def _vae() -> tuple[dict[str, Any], Callable[[], dict[str, Any]]]:
    config = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                  up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), latent_channels=4,
                  norm_num_groups=4, sample_size=16)
    return config, lambda: {"sample": torch.randn(2, 3, 16, 16, generator=_gen())}


def _dit() -> tuple[dict[str, Any], Callable[[], dict[str, Any]]]:
    config = dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, num_layers=2,
                  sample_size=8, patch_size=2, num_embeds_ada_norm=10)
    return config, lambda: {"hidden_states": torch.randn(2, 4, 8, 8, generator=_gen()),
                            "timestep": torch.tensor([1, 2]), "class_labels": torch.tensor([0, 1])}


def _sd3() -> tuple[dict[str, Any], Callable[[], dict[str, Any]]]:
    config = dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
                  joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=8, out_channels=4,
                  pos_embed_max_size=16)
    return config, lambda: {"hidden_states": torch.randn(2, 4, 8, 8, generator=_gen()),
                            "encoder_hidden_states": torch.randn(2, 3, 16, generator=_gen()),
                            "pooled_projections": torch.randn(2, 8, generator=_gen()), "timestep": torch.tensor([1, 2])}


MODELS: dict[str, Callable[[], tuple[dict[str, Any], Callable[[], dict[str, Any]]]]] = {
    "UNet2DConditionModel": _unet_condition, "UNet2DModel": _unet, "AutoencoderKL": _vae,
    "DiTTransformer2DModel": _dit, "SD3Transformer2DModel": _sd3,
}


def _build(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import diffusers

        config, _ = MODELS[name]()
        return getattr(diffusers, name)(**config)
    return build


def _job(name: str) -> Callable[[nn.Module], Job]:
    def job(model: nn.Module) -> Job:
        _, inputs = MODELS[name]()
        return lambda m: m(**inputs())
    return job


def targets(sample: Sample) -> list[Target]:
    names = sample.pick(list(MODELS), str, quick_count=2)
    return [Target(name, _build(name), _job(name)) for name in names]
