"""Codecs for ``transformers`` values, installed lazily by :mod:`modulelens.format.values`.

A configuration object (``PretrainedConfig`` / ``PreTrainedConfig`` and every subclass) is stored
as its ``to_dict()`` plus the runtime choices that ``to_dict`` leaves out but that decide numerics
(the attention and experts implementations), and rebuilt with ``cls.from_dict`` on its exact
recorded subclass. Nothing here runs unless ``transformers`` is already imported (encode) or a
capture names this codec (decode).
"""

from __future__ import annotations

from typing import Any

from modulelens.format.values import register_codec

CODEC_NAME = "transformers.PretrainedConfig"
_RUNTIME_ATTRIBUTES = ("attn_implementation", "experts_implementation")


def _config_base() -> type:
    import transformers

    base = getattr(transformers, "PreTrainedConfig", None) or transformers.PretrainedConfig
    return base


def encode_config(config: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"config": config.to_dict()}
    for name in _RUNTIME_ATTRIBUTES:
        value = getattr(config, f"_{name}", None)
        if value is not None:
            data[name] = value
    return data


def decode_config(cls: type, data: dict[str, Any]) -> Any:
    kwargs = {name: data[name] for name in _RUNTIME_ATTRIBUTES if data.get(name) is not None}
    return cls.from_dict(dict(data["config"]), **kwargs)


def install() -> None:
    register_codec(_config_base(), encode_config, decode_config, name=CODEC_NAME)
