"""diffusers values that are not modules or tensors: attention processors and latent distributions.

Installed lazily (``format/values.py``) once the job imports ``diffusers``.

* **Attention processors** (``JointAttnProcessor2_0``, ``AttnProcessor2_0``...) are plain objects
  passed to ``Attention(processor=...)`` (SD3's transformer blocks do; found by the census: the
  attention's construction was not recorded). They share no base class, so one codec serves every
  class of a ``diffusers`` module whose name says it is a processor and that is not an
  ``nn.Module`` (those are modules, recorded by their own construction). A processor is stored as
  its attributes and rebuilt without ``__init__`` (which only checks that torch has the kernels it
  calls).
* **``DiagonalGaussianDistribution``**, what ``AutoencoderKL.encode`` returns inside its
  ``AutoencoderKLOutput`` (``latent_dist``): a module that returns or takes it has it stored as a
  state object (docs/codecs.md), its tensors (``parameters``, ``mean``, ``logvar``, ``std``,
  ``var``) and ``deterministic`` flag copied, compared and rebuilt attribute by attribute. Sampling
  from it takes a ``torch.Generator``, stored by its own built-in codec.
"""

from __future__ import annotations

from collections.abc import Mapping

from modulelens.format.values import register_family_codec, register_state_codec


def _is_processor(cls: type) -> bool:
    import torch

    return (isinstance(cls, type) and cls.__module__.startswith("diffusers.") and "Processor" in cls.__name__
            and not issubclass(cls, torch.nn.Module))


def _processor_attributes(processor: object) -> dict[str, object]:
    return dict(vars(processor))


def _new_processor(cls: type, attributes: Mapping[str, object]) -> object:
    processor = cls.__new__(cls)  # type: ignore[call-overload]  # mypy takes a class's __new__ for type.__new__
    processor.__dict__.update(attributes)
    return processor


def install() -> None:
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

    register_family_codec("diffusers.AttentionProcessor", _is_processor, _processor_attributes, _new_processor)
    register_state_codec(DiagonalGaussianDistribution, name="diffusers.DiagonalGaussianDistribution")
