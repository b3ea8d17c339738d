"""x-transformers (and einops' layers): every module class ``x_transformers`` exports, and
``einops.layers.torch``'s ``Rearrange``, ``Reduce`` and ``EinMix`` (lucidrains-style building blocks).

Constructor arguments come from the signature by name (``TYPICAL``: width 16, 2 heads, one layer,
a vocabulary of 20 tokens, sequences of 8); the attention stacks (``Decoder``, ``Encoder``,
``CrossAttender``, ``PrefixDecoder``) take their sizes as keyword arguments (``LAYERS``), and the
wrappers take a ``TransformerWrapper`` over a one-layer ``Decoder`` (``FACTORIES``). Inputs: the
first of ``_candidates`` a module accepts (token ids, features of width 16, with a context for
cross-attention, images for the ViT wrapper); the autoregressive wrappers return their training
loss, as users call them. Captured: the module and, by rule, its first repeated block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.construct import Inputs, construct, exported, first_accepted
from census.targets import CannotBuildError, Job, Sample, Target

DIM, TOKENS, SEQ = 16, 20, 8
LAYERS: dict[str, Any] = {"dim": DIM, "depth": 1, "heads": 2}


def _x():  # type: ignore[no-untyped-def]
    import x_transformers

    return x_transformers


def _wrapper() -> nn.Module:
    return _x().TransformerWrapper(num_tokens=TOKENS, max_seq_len=SEQ, attn_layers=_x().Decoder(**LAYERS))


TYPICAL: dict[str, Any] = {
    "dim": DIM, "num_tokens": TOKENS, "max_seq_len": SEQ, "image_size": 16, "patch_size": 4, "mask_id": TOKENS - 1,
    "dim_in": 4, "dim_hidden": 8, "dim_out": 4, "dim_model": DIM, "depth": 1, "numerical_token_id": TOKENS - 2,
    "entropy_threshold": 1.0, "pattern": "b c h w -> b (c h w)", "weight_shape": "d_in d_out", "reduction": "mean",
}
FACTORIES: dict[str, Callable[[], Any]] = {
    "attn_layers": lambda: _x().Decoder(**LAYERS), "net": _wrapper, "model": _wrapper, "decoder": _wrapper,
    "forward_decoder": _wrapper,
}
GIVEN: dict[str, dict[str, Any]] = {
    "x_transformers.ViTransformerWrapper": {"attn_layers": lambda: _x().Encoder(**LAYERS)},
    "x_transformers.ContinuousTransformerWrapper": {"dim_in": 4, "dim_out": 4},
    "x_transformers.ContinuousAutoregressiveWrapper": {
        "net": lambda: _x().ContinuousTransformerWrapper(dim_in=4, dim_out=4, max_seq_len=SEQ,
                                                         attn_layers=_x().Decoder(**LAYERS))},
    "x_transformers.XValAutoregressiveWrapper": {
        "net": lambda: _x().XValTransformerWrapper(num_tokens=TOKENS, max_seq_len=SEQ, numerical_token_id=TOKENS - 2,
                                                   attn_layers=_x().Decoder(**LAYERS))},
    "x_transformers.XTransformer": {"enc_num_tokens": TOKENS, "enc_depth": 1, "enc_heads": 2, "enc_max_seq_len": SEQ,
                                    "dec_num_tokens": TOKENS, "dec_depth": 1, "dec_heads": 2, "dec_max_seq_len": SEQ},
    "x_transformers.TransformerBlock": {"depth": 1},
    "einops.EinMix": {"pattern": "b t d_in -> b t d_out", "weight_shape": "d_in d_out", "d_in": DIM, "d_out": 8},
    "einops.Reduce": {"pattern": "b c (h h2) (w w2) -> b c h w", "reduction": "max", "h2": 2, "w2": 2},
}
STACKS = ("Decoder", "Encoder", "CrossAttender", "PrefixDecoder")
NOT_TARGETS = {
    "x_transformers.DPO": "a training objective over a policy and a reference model, called with preference pairs",
    "x_transformers.BeliefStateWrapper": "a training objective over a forward and a backward decoder",
    "x_transformers.EntropyBasedTokenizer": "a tokenizer that segments sequences through a decoder's entropy (no "
                                            "tensor output of its own)",
}


def _classes() -> dict[str, type[nn.Module]]:
    return exported(["x_transformers", "einops.layers.torch"], labels={"einops.layers.torch": "einops"})


def _build(key: str, cls: type[nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        if key in NOT_TARGETS:
            raise CannotBuildError(f"not a target: {NOT_TARGETS[key]}")
        if cls.__name__ in STACKS:
            return cls(**LAYERS)
        given = {name: value() if callable(value) and not isinstance(value, type) else value
                 for name, value in GIVEN.get(key, {}).items()}
        return construct(cls, TYPICAL, FACTORIES, given, {}, "census/families/x_transformers.py TYPICAL")
    return build


def _candidates() -> list[Inputs]:
    def g() -> torch.Generator:
        return torch.Generator().manual_seed(17)

    tokens = lambda: torch.randint(0, TOKENS - 2, (2, SEQ), generator=g())  # noqa: E731
    features = lambda: torch.randn(2, SEQ, DIM, generator=g())  # noqa: E731
    return [lambda: (tokens(),), lambda: (features(),), lambda: (torch.randn(2, 3, 16, 16, generator=g()),),
            lambda: (torch.randn(2, SEQ, 4, generator=g()),), lambda: (tokens(), tokens()),
            lambda: (features(), features()), lambda: {"x": features(), "context": features()},
            lambda: (tokens(), torch.randn(2, SEQ, generator=g())),
            lambda: (features(), torch.randn(2, DIM, generator=g()))]


def _job(model: nn.Module) -> Job:
    return first_accepted(model, _candidates())


def targets(sample: Sample) -> list[Target]:
    classes = _classes()
    keys = sample.pick(list(classes), str, quick_count=2)
    return [Target(key, _build(key, classes[key]), _job) for key in keys]
