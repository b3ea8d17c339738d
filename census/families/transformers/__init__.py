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
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.families.transformers.inputs import candidates
from census.families.transformers.shrink import shrink
from census.targets import CannotBuildError, CannotBuildInputsError, Job, Sample, Target

MAX_PARAMETERS = 10_000_000
# the head per model type: the first of these mappings that lists it (MODEL_MAPPING_NAMES last)
HEADS = ["CAUSAL_LM", "IMAGE_TEXT_TO_TEXT", "SEQ_TO_SEQ_CAUSAL_LM", "MASKED_LM", "SPEECH_SEQ_2_SEQ", "CTC",
         "IMAGE_CLASSIFICATION", "AUDIO_CLASSIFICATION", "SEQUENCE_CLASSIFICATION", "SEMANTIC_SEGMENTATION",
         "DEPTH_ESTIMATION", "TIME_SERIES_PREDICTION", ""]


def _mapping(head: str) -> dict[str, Any]:
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, f"MODEL_FOR_{head}_MAPPING_NAMES" if head else "MODEL_MAPPING_NAMES")


def _class_name(entry: Any) -> str:
    return entry[0] if isinstance(entry, (tuple, list)) else entry


def architectures() -> list[tuple[str, list[str]]]:
    """(model type, its model class names: the heads in ``HEADS`` order, the base model last) per
    architecture, in model-type order. The first class that builds is the target's."""
    found = []
    for model_type in sorted(_mapping("")):
        classes = [_class_name(entry) for head in HEADS if (entry := _mapping(head).get(model_type))]
        found.append((model_type, list(dict.fromkeys(classes))))
    return found


def _error(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())[:500]


# how a config is shrunk, in order: the next is tried when a config is rejected, does not construct
# or is over MAX_PARAMETERS (shrink.py: layers kept per kind or all; every other width narrowed)
STRATEGIES = [("shrunk", {"layers": True}), ("shrunk, every layer kept", {"layers": False}),
              ("shrunk and narrowed", {"layers": True, "narrow": True}),
              ("shrunk and narrowed, every layer kept", {"layers": False, "narrow": True})]


def _shrunk_config(model_type: str) -> list[tuple[str, Any]]:
    """(how, config) candidates, one per strategy whose config the config class accepts."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    try:
        default = config_class().to_dict()
    except Exception as error:
        raise CannotBuildError(f"the default {config_class.__name__}() fails: {_error(error)}") from error
    found, errors = [], []
    for how, options in STRATEGIES:
        try:
            found.append((how, config_class.from_dict(shrink(default, **options))))
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


def _build(model_type: str, class_names: list[str]) -> Callable[[], nn.Module]:
    """The first of the type's classes (heads first) that constructs from the first strategy's
    config that fits, on the meta device first (nothing allocated for a model over the limit)."""
    def build() -> nn.Module:
        import transformers

        errors: list[str] = []
        configs = _shrunk_config(model_type)
        for class_name in class_names:
            model_class = getattr(transformers, class_name, None)
            if model_class is None:
                errors.append(f"transformers has no {class_name}")
                continue
            for how, config in configs:
                try:
                    with torch.device("meta"):
                        meta = model_class(config)
                except Exception as error:
                    errors.append(f"{class_name}, {how}: {_error(error)}")
                    continue
                count = sum(p.numel() for p in meta.parameters())
                del meta
                if count > MAX_PARAMETERS:
                    errors.append(f"{class_name}, {how}: {count / 1e6:.1f}M parameters (over "
                                  f"{MAX_PARAMETERS / 1e6:.0f}M): {_largest(config)}")
                    continue
                return model_class(config)
        first = getattr(transformers, class_names[0], None)
        reason = _default_constructs(model_type, first) if first is not None else ""
        raise CannotBuildError(" | ".join(dict.fromkeys(errors))[:1200] + reason)
    return build


def _largest(config: Any) -> str:
    """The largest integer fields of a config tree, the likely reason it is still big."""
    fields: list[tuple[int, str]] = []

    def walk(tree: dict[str, Any], prefix: str) -> None:
        for key, value in tree.items():
            if isinstance(value, dict) and "model_type" in value:
                walk(value, f"{prefix}{key}.")
            elif isinstance(value, int) and not isinstance(value, bool) and value > 64 and not re.search(
                    r"token|rate|temperature|theta|period|base", key):
                fields.append((value, f"{prefix}{key}"))
    walk(config.to_dict(), "")
    return "largest fields " + ", ".join(f"{name}={value}" for value, name in sorted(fields, reverse=True)[:4])


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
    return [Target(model_type, _build(model_type, class_names), _job, calls=2, note=", ".join(class_names))
            for model_type, class_names in chosen]
