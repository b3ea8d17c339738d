"""Every ``transformers`` architecture that builds from a shrunk config.

Architectures are the model types of ``MODEL_MAPPING_NAMES`` (the base models). Per model type
one head is taken, the first of ``HEADS`` whose mapping has it (a causal LM where there is one,
else a seq2seq LM, a masked LM, ...; the base model when no head is listed). Its config is the
config class's default, shrunk by rule (``shrink.py``: sizes, layers chosen so every kind of layer
survives, sub-configs) and loaded with ``from_dict`` as a saved config would be; when that config
is rejected or does not construct, the same shrink keeping every layer is tried. A model still over
``MAX_PARAMETERS`` (counted on the meta device, before anything is allocated) is reported as not
built, with the fields that were left large.

Inputs (``inputs.py``) follow the ``forward`` signature and the config; the first candidate the
model accepts (without capture) is the job. A model that returns a cache is run as people run it,
caches on: a prefill and a decode step on the returned cache (both calls recorded).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.families.transformers.inputs import candidates
from census.families.transformers.shrink import shrink
from census.targets import CannotBuildError, CannotBuildInputsError, Job, Sample, Target

MAX_PARAMETERS = 4_000_000
# the head per model type: the first of these mappings that lists it (MODEL_MAPPING_NAMES last)
HEADS = ["CAUSAL_LM", "SEQ_TO_SEQ_CAUSAL_LM", "MASKED_LM", "SPEECH_SEQ_2_SEQ", "CTC", "IMAGE_CLASSIFICATION",
         "AUDIO_CLASSIFICATION", "SEQUENCE_CLASSIFICATION", "IMAGE_TEXT_TO_TEXT", "SEMANTIC_SEGMENTATION",
         "DEPTH_ESTIMATION", "TIME_SERIES_PREDICTION", ""]


def _mapping(head: str) -> dict[str, Any]:
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, f"MODEL_FOR_{head}_MAPPING_NAMES" if head else "MODEL_MAPPING_NAMES")


def _class_name(entry: Any) -> str:
    return entry[0] if isinstance(entry, (tuple, list)) else entry


def architectures() -> list[tuple[str, str]]:
    """(model type, model class name) per architecture, in model-type order."""
    found = []
    for model_type in sorted(_mapping("")):
        for head in HEADS:
            entry = _mapping(head).get(model_type)
            if entry:
                found.append((model_type, _class_name(entry)))
                break
    return found


def _error(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())[:500]


def _shrunk_config(model_type: str) -> list[tuple[str, Any]]:
    """(how, config) candidates: the shrunk default config, then the same keeping every layer."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    try:
        default = config_class().to_dict()
    except Exception as error:
        raise CannotBuildError(f"the default {config_class.__name__}() fails: {_error(error)}") from error
    found, errors = [], []
    for how, layers in (("shrunk", True), ("shrunk, every layer kept", False)):
        try:
            found.append((how, config_class.from_dict(shrink(default, layers=layers))))
        except Exception as error:
            errors.append(f"{how}: {_error(error)}")
    if not found:
        raise CannotBuildError(f"{config_class.__name__} rejects the shrunk config: " + " | ".join(errors))
    return found


def _default_constructs(model_type: str, model_class: type[nn.Module]) -> str:
    """Whether the unshrunk default config constructs the model (on the meta device): names the
    failures that are transformers' own defaults, not the shrinking."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        with torch.device("meta"):
            model_class(CONFIG_MAPPING[model_type]())
    except Exception as error:
        return f" (the default config does not construct the model either: {_error(error)[:200]})"
    return " (the default config constructs it)"


def _build(model_type: str, class_name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        model_class = getattr(transformers, class_name, None)
        if model_class is None:
            raise CannotBuildError(f"transformers has no {class_name}")
        errors = []
        for how, config in _shrunk_config(model_type):
            try:
                with torch.device("meta"):
                    meta = model_class(config)
            except Exception as error:
                errors.append(f"{how}: {_error(error)}")
                continue
            count = sum(p.numel() for p in meta.parameters())
            del meta
            if count > MAX_PARAMETERS:
                large = {k: v for k, v in config.to_dict().items() if isinstance(v, int) and not isinstance(v, bool)
                         and v > 256}
                errors.append(f"{how}: {count / 1e6:.1f}M parameters (over {MAX_PARAMETERS / 1e6:.0f}M); large fields "
                              f"left: {large}"[:400])
                continue
            return model_class(config)
        raise CannotBuildError(" | ".join(errors) + _default_constructs(model_type, model_class))
    return build


def _job(model: nn.Module) -> Job:
    errors = []
    for description, make in candidates(model):
        try:
            inputs = make()
            with torch.no_grad():
                out = model(**inputs)
        except CannotBuildInputsError as error:
            errors.append(f"{description}: {error}")
            continue
        except Exception as error:
            errors.append(f"{description}: {_error(error)[:300]}")
            continue
        return _with_decode_step(model, inputs, out)
    raise CannotBuildInputsError("no candidate input was accepted: " + " | ".join(errors[:3]))


def _cache_keyword(model: nn.Module) -> str:
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _with_decode_step(model: nn.Module, inputs: dict[str, Any], out: Any) -> Job:
    """A prefill and one decode step on the cache it returned (transformers' default use_cache=True),
    when the model returns a cache and accepts it back; else the one call."""
    cache = getattr(out, "past_key_values", None)
    logits = getattr(out, "logits", None)
    if cache is None or logits is None or "input_ids" not in inputs or logits.dim() != 3:
        return lambda m: m(**inputs)

    def step(m: nn.Module) -> None:
        first = m(**inputs)
        token = first.logits[:, -1:].argmax(-1)
        follow: dict[str, Any] = {_cache_keyword(m): first.past_key_values}
        if getattr(m.config, "is_encoder_decoder", False):
            follow.update(decoder_input_ids=token, encoder_outputs=(first.encoder_last_hidden_state,))
        else:
            follow["input_ids"] = token
            if "attention_mask" in inputs:
                follow["attention_mask"] = torch.ones(token.shape[0], inputs["input_ids"].shape[1] + 1, dtype=torch.long)
        m(**follow)

    try:
        with torch.no_grad():
            step(model)
    except Exception:  # the model returns a cache it cannot continue from this way: one call
        return lambda m: m(**inputs)
    return step


def targets(sample: Sample) -> list[Target]:
    chosen = sample.pick(architectures(), lambda a: a[0], quick_count=4)
    return [Target(model_type, _build(model_type, class_name), _job, calls=2, note=class_name)
            for model_type, class_name in chosen]
