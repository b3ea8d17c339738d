"""Codecs for ``transformers`` values, installed lazily by :mod:`modulelens.format.values`.

Caches (``DynamicCache``, ``EncoderDecoderCache``, ``StaticCache``, the linear-attention/Mamba
layers and every other subclass of the cache base classes) are state objects
(:func:`~modulelens.format.values.register_state_codec`): stored as their attributes -- the
tensors and the layout (layer classes, sliding windows, lengths, flags) -- and rebuilt without
running ``__init__``, so a decode step replays on exactly the cache it saw.

A ``BatchEncoding`` (what tokenizers return, and what sentence-transformers passes from module to
module) is a state object too: its items and its number of sequences.

A configuration object (``PretrainedConfig`` / ``PreTrainedConfig`` and every subclass) is stored
as its ``to_dict()`` plus the runtime choices that ``to_dict`` leaves out but that decide numerics
(the attention and experts implementations), and rebuilt with ``cls.from_dict`` on its exact
recorded subclass. Nothing here runs unless ``transformers`` is already imported (encode) or a
capture names this codec (decode).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, cast

from modulelens.format.values import register_codec, register_state_codec

CODEC_NAME = "transformers.PretrainedConfig"
CACHE_CODEC_NAME = "transformers.Cache"
BATCH_CODEC_NAME = "transformers.BatchEncoding"
# Base classes of transformers' caches across versions (absent ones are skipped): the cache, its
# per-layer objects, and the older stand-alone Mamba cache.
_CACHE_BASES = (
    ("transformers.cache_utils", "Cache"),
    ("transformers.cache_utils", "CacheLayerMixin"),
    ("transformers.cache_utils", "LinearAttentionCacheLayerMixin"),
    ("transformers.cache_utils", "DummyLayer"),
    ("transformers.cache_utils", "KVSharingDict"),
    ("transformers.cache_utils", "MambaCache"),
    ("transformers.models.mamba.modeling_mamba", "MambaCache"),
)
_RUNTIME_ATTRIBUTES = ("attn_implementation", "experts_implementation")


def _config_base() -> type:
    import transformers

    base = getattr(transformers, "PreTrainedConfig", None) or transformers.PretrainedConfig
    return base


def encode_config(config: Any) -> dict[str, object]:
    data: dict[str, Any] = {"config": config.to_dict()}
    for name in _RUNTIME_ATTRIBUTES:
        value = _runtime_value(config, name)
        if value is not None:
            data[name] = value
    return data


def _runtime_value(config: object, name: str) -> str | dict[str, Any] | None:
    """``config._<name>`` (e.g. ``"sdpa"``), or, where a sub-config resolved another one, the form
    transformers' setter takes per sub-config: ``{"": "sdpa", "backbone_config": "eager"}``
    (nested for deeper sub-configs). Setting the top value alone sets it on every sub-config:
    DETR's ResNet backbone, which resolved to eager in the job, was then asked for sdpa and refused
    to build (found by the census)."""
    own = getattr(config, f"_{name}", None)
    differing: dict[str, Any] = {}
    for key in getattr(config, "sub_configs", None) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, f"_{name}_internal"):
            value = _runtime_value(sub, name)
            if value != own:
                differing[key] = value
    return {"": own, **differing} if differing else own


class _ConfigClass(Protocol):
    """A ``PretrainedConfig`` subclass, as far as decoding uses it (the codec is registered for their base)."""

    def from_dict(self, config_dict: dict[str, Any], **kwargs: Any) -> Any: ...


def decode_config(cls: type, data: dict[str, Any]) -> object:
    kwargs = {name: data[name] for name in _RUNTIME_ATTRIBUTES if data.get(name) is not None}
    return cast(_ConfigClass, cls).from_dict(dict(data["config"]), **kwargs)


def _cache_bases() -> list[type]:
    import importlib

    found: list[type] = []
    for module_name, class_name in _CACHE_BASES:
        try:
            cls = getattr(importlib.import_module(module_name), class_name, None)
        except ImportError:
            continue
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return found


def _batch_parts(batch: Any) -> dict[str, object]:
    """A ``BatchEncoding``'s parts: its items (``input_ids``, ``attention_mask``... and whatever a
    module adds: sentence-transformers' modules write their outputs into the features they get) and
    its number of sequences. The fast tokenizer's ``encodings`` (Rust objects: character offsets,
    word ids) have no encoding; a rebuilt batch has none, so a module that asks for them
    (``batch.word_ids()``) fails loudly on replay instead of computing on something else."""
    return {"data": dict(batch.data), "n_sequences": getattr(batch, "_n_sequences", None)}


def _new_batch(cls: type, parts: Mapping[str, object]) -> object:
    return cls(parts["data"], n_sequences=parts["n_sequences"])


def install() -> None:
    register_codec(_config_base(), encode_config, decode_config, name=CODEC_NAME)
    from transformers.tokenization_utils_base import BatchEncoding

    # a mutable dict of tensors that modules update in place (sentence-transformers): a state object
    register_state_codec(BatchEncoding, name=BATCH_CODEC_NAME, attributes=_batch_parts, rebuild=_new_batch)
    for base in _cache_bases():
        # "transformers.Cache:<base>": the part before ":" is the name installed lazily on decode
        register_state_codec(base, name=f"{CACHE_CODEC_NAME}:{base.__qualname__}")
