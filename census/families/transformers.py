"""Every ``transformers`` architecture that builds from a shrunk config.

Architectures are the model types of ``MODEL_MAPPING_NAMES`` (the base models). Per model type
one head is taken, the first of ``HEADS`` whose mapping has it (a causal LM where there is one,
else a seq2seq LM, a masked LM, ...; the base model when no head is listed). Its config is the
config class's defaults with the common size fields overridden (``SIZES``; lists such as
``depths`` and ``hidden_sizes`` shrunk element-wise), recursively in sub-configs (``text_config``,
``vision_config``, ...). A model still over ``MAX_PARAMETERS`` (counted on the meta device, before
anything is allocated) is reported as not built, with the fields that were left large.

Inputs follow the model's ``main_input_name`` and ``forward`` signature: token ids (with an
attention mask, decoder ids for encoder-decoders), images of the config's size, audio samples or
features. A causal LM that returns a cache is run as people run it, caches on: a prefill and a
decode step on the returned cache (both calls recorded). Candidates are tried without capture; the
first the model accepts is the job.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.targets import CannotBuildError, CannotBuildInputsError, Job, Sample, Target

MAX_PARAMETERS = 4_000_000
HIDDEN, HEADS_N, KV_HEADS, LAYERS, FFN, VOCAB, POSITIONS, IMAGE, PATCH = 32, 4, 2, 2, 64, 99, 128, 32, 8

SIZES: dict[str, Any] = {
    # widths
    "hidden_size": HIDDEN, "d_model": HIDDEN, "n_embd": HIDDEN, "embed_dim": HIDDEN, "dim": HIDDEN, "emb_dim": HIDDEN,
    "embedding_size": HIDDEN, "word_embed_proj_dim": HIDDEN, "projection_dim": HIDDEN, "text_embed_dim": HIDDEN,
    "vision_embed_dim": HIDDEN, "d_embed": HIDDEN, "n_embed": HIDDEN, "model_dim": HIDDEN, "width": HIDDEN,
    "hidden_dim": HIDDEN, "embedding_dim": HIDDEN, "projection_hidden_size": HIDDEN, "proj_dim": HIDDEN,
    # depths
    "num_hidden_layers": LAYERS, "n_layer": LAYERS, "num_layers": LAYERS, "n_layers": LAYERS, "encoder_layers": LAYERS,
    "decoder_layers": LAYERS, "num_decoder_layers": LAYERS, "num_encoder_layers": LAYERS, "depth": LAYERS,
    "num_blocks": LAYERS, "n_blocks": LAYERS, "text_layers": LAYERS, "vision_layers": LAYERS,
    # heads
    "num_attention_heads": HEADS_N, "n_head": HEADS_N, "n_heads": HEADS_N, "num_heads": HEADS_N,
    "encoder_attention_heads": HEADS_N, "decoder_attention_heads": HEADS_N, "num_key_value_heads": KV_HEADS,
    "num_kv_heads": KV_HEADS, "n_kv_heads": KV_HEADS, "multi_query_group_num": KV_HEADS, "head_dim": HIDDEN // HEADS_N,
    "attention_head_dim": HIDDEN // HEADS_N, "kv_channels": HIDDEN // HEADS_N, "d_kv": HIDDEN // HEADS_N,
    # MLPs and experts
    "intermediate_size": FFN, "ffn_dim": FFN, "encoder_ffn_dim": FFN, "decoder_ffn_dim": FFN, "n_inner": FFN,
    "d_ff": FFN, "ffn_hidden_size": FFN, "mlp_dim": FFN, "inner_dim": FFN, "moe_intermediate_size": FFN // 2,
    "shared_expert_intermediate_size": FFN // 2, "expert_intermediate_size": FFN // 2, "num_experts": 4,
    "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4, "num_experts_per_tok": 2,
    "n_shared_experts": 1, "num_shared_experts": 1, "first_k_dense_replace": 1,
    # DeepSeek-style latent attention
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
    "qk_head_dim": 16,
    # vocabularies and positions
    "vocab_size": VOCAB, "max_position_embeddings": POSITIONS, "n_positions": POSITIONS, "n_ctx": POSITIONS,
    "max_seq_len": POSITIONS, "max_sequence_length": POSITIONS, "seq_length": POSITIONS, "max_length": POSITIONS,
    "max_source_positions": POSITIONS, "max_target_positions": POSITIONS, "num_buckets": 8,
    # images
    "image_size": IMAGE, "patch_size": PATCH, "img_size": IMAGE,
}
# list-valued size fields, shrunk element-wise (CNN and hierarchical vision stages)
LIST_SIZES: dict[str, Callable[[int, Any], Any]] = {
    "depths": lambda i, v: 1, "hidden_sizes": lambda i, v: 16 * 2 ** min(i, 2), "embed_dims": lambda i, v: 16 * 2 ** min(i, 2),
    "dims": lambda i, v: 16 * 2 ** min(i, 2), "num_heads": lambda i, v: 2 ** min(i, 2), "layer_depths": lambda i, v: 1,
    "block_repeats": lambda i, v: 1, "num_layers": lambda i, v: 1, "stage_depths": lambda i, v: 1,
    "neck_hidden_sizes": lambda i, v: 16 * 2 ** min(i, 2), "encoder_hidden_sizes": lambda i, v: 16 * 2 ** min(i, 2),
    "hidden_dims": lambda i, v: 16 * 2 ** min(i, 2),
}
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


def shrink(config: Any, depth: int = 0) -> dict[str, Any]:
    """Constructor overrides that make ``config`` (a default config) small."""
    from transformers import PretrainedConfig

    fields = config.to_dict() if depth == 0 else dict(vars(config))
    overrides: dict[str, Any] = {}
    for key, value in fields.items():
        if key.startswith("_"):
            continue
        current = getattr(config, key, value)
        if isinstance(current, PretrainedConfig) and depth < 3:
            overrides[key] = type(current)(**{**_plain(current), **shrink(current, depth + 1)})
        elif isinstance(current, dict) and "model_type" in current and depth < 3:
            overrides[key] = current  # left as given: built by the parent from the dict
        elif key in LIST_SIZES and isinstance(current, (list, tuple)) and current and all(isinstance(v, int) for v in current):
            overrides[key] = [LIST_SIZES[key](i, v) for i, v in enumerate(current)]
        elif key in SIZES and isinstance(current, int) and not isinstance(current, bool) and current > 0:
            overrides[key] = min(current, SIZES[key]) if key not in ("image_size", "img_size") else SIZES[key]
    special = [k for k in fields if k.endswith(("_token_id", "_token_index", "_token_ids"))]
    for index, key in enumerate(special):  # special tokens inside the shrunk vocabulary, above the ids the job uses
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= VOCAB:
            overrides[key] = VOCAB - 1 - index % 4
        elif isinstance(value, list) and any(isinstance(v, int) and v >= VOCAB for v in value):
            overrides[key] = [VOCAB - 1 - index % 4]
    for key in ("suppress_tokens", "begin_suppress_tokens"):  # Whisper: ids of the full vocabulary
        if isinstance(fields.get(key), list):
            overrides[key] = []
    if "num_key_value_heads" in overrides and overrides.get("num_attention_heads", HEADS_N) % overrides["num_key_value_heads"]:
        overrides["num_key_value_heads"] = overrides.get("num_attention_heads", HEADS_N)
    return overrides


def _plain(config: Any) -> dict[str, Any]:
    return {k: v for k, v in config.to_dict().items() if k not in ("transformers_version", "model_type", "architectures")}


def _build(model_type: str, class_name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        config_class = CONFIG_MAPPING[model_type]
        try:
            default = config_class()
        except Exception as error:
            raise CannotBuildError(f"the default {config_class.__name__}() fails: {type(error).__name__}: {error}"[:600]) from error
        overrides = shrink(default)
        try:
            config = config_class(**{**overrides})
        except Exception as error:
            raise CannotBuildError(f"{config_class.__name__} rejects the shrunk sizes {sorted(overrides)}: "
                               f"{type(error).__name__}: {error}"[:600]) from error
        model_class = getattr(transformers, class_name, None)
        if model_class is None:
            raise CannotBuildError(f"transformers has no {class_name}")
        with torch.device("meta"):
            meta = model_class(config)
        count = sum(p.numel() for p in meta.parameters())
        if count > MAX_PARAMETERS:
            large = {k: v for k, v in config.to_dict().items() if isinstance(v, int) and not isinstance(v, bool) and v > 256}
            raise CannotBuildError(f"{count / 1e6:.1f}M parameters after shrinking (over {MAX_PARAMETERS / 1e6:.0f}M); "
                               f"large fields left: {large}"[:600])
        del meta
        return model_class(config)
    return build


def _config_value(config: Any, *names: str, default: Any = None) -> Any:
    for holder in (config, *(getattr(config, s, None) for s in ("vision_config", "audio_config", "encoder_config",
                                                                  "text_config", "backbone_config"))):
        for name in names:
            value = getattr(holder, name, None) if holder is not None else None
            if value is not None:
                return value
    return default


def _first_int(value: Any) -> int:
    return int(value[0] if isinstance(value, (list, tuple)) else value)


def _inputs(model: nn.Module) -> list[dict[str, Any]]:
    """Candidate call inputs, most natural first."""
    config = model.config
    parameters = inspect.signature(model.forward).parameters
    main = getattr(model, "main_input_name", "input_ids")
    g = torch.Generator().manual_seed(3)
    vocab = int(_config_value(config, "vocab_size", default=VOCAB))
    ids = torch.randint(3, max(vocab - 5, 4), (2, 7), generator=g)  # below the special tokens
    candidates: list[dict[str, Any]] = []
    if main == "input_ids" or (main not in parameters and "input_ids" in parameters):
        base: dict[str, Any] = {"input_ids": ids}
        if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in parameters:
            base["decoder_input_ids"] = ids[:, :3]
        if "attention_mask" in parameters:
            candidates.append({**base, "attention_mask": torch.ones_like(ids)})
        candidates.append(base)
    elif main == "pixel_values":
        channels = int(_config_value(config, "num_channels", "in_channels", default=3))
        size = _first_int(_config_value(config, "image_size", "img_size", default=IMAGE))
        for side in dict.fromkeys([size, 32, 64, 224]):
            candidates.append({"pixel_values": torch.rand(2, channels, side, side, generator=g)})
    elif main == "input_values":
        for samples in (1600, 4000, 16000):
            candidates.append({"input_values": torch.randn(2, samples, generator=g)})
        candidates.append({"input_values": torch.randn(2, 1, 1600, generator=g)})
    elif main == "input_features":
        bins = int(_config_value(config, "num_mel_bins", "feature_size", "input_feat_per_channel", default=80))
        frames = 2 * int(_config_value(config, "max_source_positions", default=64))
        for length in dict.fromkeys([frames, 64, 100]):
            candidates.append({"input_features": torch.randn(2, bins, length, generator=g)})
            candidates.append({"input_features": torch.randn(2, length, bins, generator=g)})
    else:
        raise CannotBuildInputsError(f"main input {main!r} is none the census builds (input_ids, pixel_values, input_values, "
                            "input_features)")
    return candidates


def _cache_keyword(model: nn.Module) -> str:
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _job(model: nn.Module) -> Job:
    errors = []
    for inputs in _inputs(model):
        try:
            with torch.no_grad():
                out = model(**inputs)
        except Exception as error:
            errors.append(f"{sorted(inputs)}: {type(error).__name__}: {str(error)[:200]}")
            continue
        return _with_decode_step(model, inputs, out)
    raise CannotBuildInputsError("no candidate input was accepted: " + " | ".join(errors[-2:]))


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
