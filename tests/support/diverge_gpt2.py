"""GPT-2 (transformers, built from a small config at its default settings) and a rewrite of its
block with one wrong hyperparameter, for the first-divergence tests on a third-party model."""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2Model
from transformers.models.gpt2.modeling_gpt2 import GPT2Block

CONFIG = {"vocab_size": 128, "n_positions": 64, "n_embd": 64, "n_layer": 3, "n_head": 4}


def gpt2() -> GPT2Model:
    """A small GPT-2 at transformers' defaults (training mode, dropout on, its default attention)."""
    return GPT2Model(GPT2Config(**CONFIG))


def token_ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, CONFIG["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(seed))


class EpsilonBlock(GPT2Block):
    """``GPT2Block`` whose second layer norm uses another epsilon than the config's."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.ln_2.eps = 1e-2
