"""Shrink a transformers config by rule: the default config's dict (what ``config.json`` holds),
its common size fields overridden, recursively in every sub-config, and rebuilt with
``config_class.from_dict`` (the way a saved config loads).

The rules, in order, per config dict (``shrink``):

1. **Sub-configs** (``text_config``, ``vision_config``, ``audio_config``, a backbone, ...: any
   dict with a ``model_type``, and lists of such dicts) are shrunk first, the same way. A
   ``timm_backbone`` sub-config becomes transformers' own ResNet backbone (timm needs torchvision
   in transformers, which cannot be installed next to the CPU torch here).
2. **Layers.** Every layer count (``LAYER_COUNTS``) is cut to a few layers *chosen so that every
   kind of layer the config describes survives*: the per-layer lists of the config (any list as
   long as the layer count: ``layer_types``, ``mlp_layer_types``, ``no_rope_layers``, ...), the
   per-layer overrides (``per_layer_config``) and the lists of layer indices (``moe_layers``,
   ``full_attn_idxs``, ...) give each layer a kind; the first layer of each kind is kept (at least
   ``LAYERS``, at most ``MAX_LAYERS``), and every per-layer list, override and index list is cut
   or renumbered to the kept layers. A hybrid model keeps an attention layer and a Mamba layer; a
   Gemma-style model keeps a sliding and a full attention layer.
3. **Sizes** (``SIZES``, by field name; ``LIST_SIZES`` element-wise for per-stage lists); any other
   width field whose value was one of the tree's hidden sizes becomes ``HIDDEN`` (so
   ``out_hidden_size``/``condition_dim``/``audio_hidden_size`` still match the sizes they must
   equal); rope sections (``mrope_section``) are rescaled to the new head size.
4. **Consistency:** key/value heads divide the heads, Mamba heads divide the expanded width,
   special token ids lie inside the shrunk vocabulary, backbone ``out_features`` fall back to the
   last stage.
"""

from __future__ import annotations

import copy
import re
from typing import Any

HIDDEN, HEADS_N, KV_HEADS, LAYERS, MAX_LAYERS, FFN, VOCAB, POSITIONS, IMAGE, PATCH = 32, 4, 2, 2, 6, 64, 99, 128, 32, 8
HEAD = HIDDEN // HEADS_N

SIZES: dict[str, int | float] = {
    # widths
    "hidden_size": HIDDEN, "d_model": HIDDEN, "n_embd": HIDDEN, "embed_dim": HIDDEN, "dim": HIDDEN, "emb_dim": HIDDEN,
    "embedding_size": HIDDEN, "word_embed_proj_dim": HIDDEN, "projection_dim": HIDDEN, "text_embed_dim": HIDDEN,
    "vision_embed_dim": HIDDEN, "d_embed": HIDDEN, "n_embed": HIDDEN, "model_dim": HIDDEN, "width": HIDDEN,
    "hidden_dim": HIDDEN, "embedding_dim": HIDDEN, "projection_hidden_size": HIDDEN, "proj_dim": HIDDEN,
    "out_hidden_size": HIDDEN, "vision_hidden_size": HIDDEN, "text_hidden_size": HIDDEN, "audio_hidden_size": HIDDEN,
    "encoder_hidden_size": HIDDEN, "decoder_hidden_size": HIDDEN, "d_inner": 2 * HIDDEN,
    # heads
    "num_attention_heads": HEADS_N, "n_head": HEADS_N, "n_heads": HEADS_N, "num_heads": HEADS_N,
    "encoder_attention_heads": HEADS_N, "decoder_attention_heads": HEADS_N, "num_key_value_heads": KV_HEADS,
    "num_kv_heads": KV_HEADS, "n_kv_heads": KV_HEADS, "multi_query_group_num": KV_HEADS, "head_dim": HEAD,
    "attention_head_dim": HEAD, "kv_channels": HEAD, "d_kv": HEAD, "attention_head_size": HEAD,
    "rotary_dim": HEAD, "rotary_emb_dim": HEAD,
    # MLPs and experts
    "intermediate_size": FFN, "ffn_dim": FFN, "encoder_ffn_dim": FFN, "decoder_ffn_dim": FFN, "n_inner": FFN,
    "d_ff": FFN, "ffn_hidden_size": FFN, "mlp_dim": FFN, "inner_dim": FFN, "moe_intermediate_size": FFN // 2,
    "shared_expert_intermediate_size": FFN // 2, "expert_intermediate_size": FFN // 2, "num_experts": 4,
    "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4, "num_experts_per_tok": 2,
    "n_shared_experts": 1, "num_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
    "moe_k": 2, "top_k": 2, "num_experts_per_token": 2, "moe_topk": 2,
    # DeepSeek-style latent attention
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": HEAD, "qk_nope_head_dim": HEAD, "v_head_dim": HEAD,
    "qk_head_dim": 2 * HEAD,
    # Mamba / state-space layers
    "mamba_n_heads": HEADS_N, "mamba_d_state": 16, "state_size": 16, "d_state": 16, "mamba_d_head": 2 * HEAD,
    "ssm_state_size": 16, "mamba_n_groups": 1,
    # vocabularies and positions
    "vocab_size": VOCAB, "vocab_size_per_layer_input": VOCAB, "entity_vocab_size": VOCAB, "input_vocab_size": VOCAB,
    "output_vocab_size": VOCAB, "encoder_hash_byte_group_vocab": VOCAB, "num_embeddings": 64,
    "hidden_size_per_layer_input": HEAD, "entity_emb_size": HIDDEN, "d_latents": HIDDEN, "num_latents": 8,
    "zero_expert_num": 2, "expert_ffn_hidden_size": FFN // 2,
    "max_position_embeddings": POSITIONS, "n_positions": POSITIONS, "n_ctx": POSITIONS,
    "max_seq_len": POSITIONS, "max_sequence_length": POSITIONS, "seq_length": POSITIONS, "max_length": POSITIONS,
    "max_source_positions": POSITIONS, "max_target_positions": POSITIONS, "num_buckets": 8,
    "src_vocab_size": VOCAB, "tgt_vocab_size": VOCAB, "text_vocab_size": VOCAB, "codebook_size": 64,
    # images
    "image_size": IMAGE, "patch_size": PATCH, "img_size": IMAGE, "window_size": 2, "num_windows": 4,
    # per-head sizes named otherwise; Mamba2 groups
    "d_head": HEAD, "n_groups": 1,
    # SpecAugment masks in train mode must fit the few frames of the census's audio
    "mask_time_length": 2, "mask_feature_length": 2,
}
LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers", "decoder_layers",
                "num_decoder_layers", "num_encoder_layers", "depth", "num_blocks", "n_blocks", "text_layers",
                "vision_layers", "num_hidden_layers_per_stage")
_STAGE = [16, 32, 64, 64, 64, 64, 64, 64]
# list-valued size fields, element-wise (CNN and hierarchical vision stages)
LIST_SIZES = {"depths": lambda i: 1, "hidden_sizes": lambda i: _STAGE[min(i, 7)], "embed_dims": lambda i: _STAGE[min(i, 7)],
              "dims": lambda i: _STAGE[min(i, 7)], "num_heads": lambda i: 2 ** min(i, 2), "layer_depths": lambda i: 1,
              "block_repeats": lambda i: 1, "num_layers": lambda i: 1, "stage_depths": lambda i: 1,
              "neck_hidden_sizes": lambda i: _STAGE[min(i, 7)], "encoder_hidden_sizes": lambda i: _STAGE[min(i, 7)],
              "hidden_dims": lambda i: _STAGE[min(i, 7)], "num_block_repeats": lambda i: 1,
              "num_attention_heads": lambda i: 2 ** min(i, 2), "num_hidden_layers": lambda i: 1,
              "stage_numb_of_layers": lambda i: 1}
# fields a default config leaves unset that the model needs: a time series' prediction length; a
# hybrid's attention layers (Bamba's default has none, and transformers' cached forward then fails)
# and a padding token (a sequence classifier finds the last token of each row of a batch by it)
WHEN_NONE: dict[str, Any] = {"prediction_length": 4, "attn_layer_indices": [1], "pad_token_id": 0}
COEFFICIENTS = {"width_coefficient": 0.25, "depth_coefficient": 0.5}  # EfficientNet-style scaling
# width-like names (rule 3) and names that are never widths even when their value matches one
_WIDTH = re.compile(r"hidden|_dim$|_dims?_|_size$|_sizes$|channels|width|embed|units|_dims$|features$")
_NOT_WIDTH = re.compile(r"vocab|position|length|window|image|patch|sample|rate|bucket|token|seq|chunk|kernel|stride|"
                        r"batch|frame|mel|bin|codebook_size|grid|label|pad|cache|num_|^n_|max|min|group|expert|block|"
                        r"lora|rank|stage|level|query|queries|feature_size|theta|scale|factor|ratio|eps|prob|dropout")
# what narrowing (``narrow=True``) leaves alone: counts, lengths and rates, not widths
_NOT_NARROW = re.compile(r"vocab|position|length|window|sample|rate|bucket|token|seq|chunk|kernel|stride|num_|^n_|"
                         r"max|min|eps|theta|scale|factor|ratio|prob|dropout|label|pad|image_size|patch|frame|bins")
_SKIP = {"id2label", "label2id", "transformers_version", "architectures", "model_type", "_name_or_path", "dtype"}


def _is_config(value: Any) -> bool:
    return isinstance(value, dict) and "model_type" in value


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def hidden_sizes(tree: dict[str, Any]) -> set[int]:
    """Every hidden size of a config tree (rule 3 makes fields equal to one of them ``HIDDEN``)."""
    found = {v for k in ("hidden_size", "d_model", "n_embd", "embed_dim", "dim") if _int(v := tree.get(k)) and v > 0}
    for value in tree.values():
        if _is_config(value):
            found |= hidden_sizes(value)
    return found


def shrink(tree: dict[str, Any], widths: set[int] | None = None, layers: bool = True,
           narrow: bool = False) -> dict[str, Any]:
    """The shrunk copy of a config dict (``config.to_dict()``). ``layers=False`` keeps every layer
    (for configs whose layer structure the rules cannot cut consistently); ``narrow=True`` also
    divides every other width-like field by ``NARROW`` (for models still over the parameter limit:
    necks, vocoders and codecs with widths of their own)."""
    widths = hidden_sizes(tree) if widths is None else widths
    out = copy.deepcopy(tree)
    for key, value in tree.items():
        if key.endswith("backbone_config") and _is_config(value) and value.get("model_type") == "timm_backbone":
            out[key] = _resnet_backbone(value)
        elif _is_config(value):
            out[key] = shrink(value, widths, layers, narrow)
        elif isinstance(value, list) and value and all(_is_config(v) for v in value):
            out[key] = [shrink(v, widths, layers, narrow) for v in value]
    if layers:
        _shrink_layers(out)
    for key, value in tree.items():
        if key in _SKIP or key not in out or _is_config(value):
            continue
        current = out[key]
        if key == "hidden_dim" and isinstance(tree.get("width_coefficient"), (int, float)) and _int(current):
            # EfficientNet: the head's width is the scaled 1280 channels, like every scaled stage
            out[key] = int(current / tree["width_coefficient"] * COEFFICIENTS["width_coefficient"])
        elif key in LIST_SIZES and isinstance(current, (list, tuple)) and current and all(_int(v) for v in current):
            out[key] = [LIST_SIZES[key](i) for i in range(len(current))]
        elif key in SIZES and _int(current) and current > 0:
            out[key] = SIZES[key] if key in ("image_size", "img_size") else min(current, SIZES[key])  # type: ignore[type-var]
        elif key in SIZES and isinstance(current, (list, tuple)) and len(current) == 2 and all(_int(v) for v in current):
            out[key] = [SIZES[key]] * 2  # image_size / patch_size as (height, width)
        elif key in COEFFICIENTS and isinstance(current, (int, float)):
            out[key] = COEFFICIENTS[key]

        elif _int(current) and current in widths and current > 64 and not _NOT_WIDTH.search(key):
            out[key] = HIDDEN  # equal to a hidden size by default: kept equal (out_hidden_size, condition_dim, ...)
        elif "groups" in key and _int(current) and current > 1:
            out[key] = HIDDEN if current in widths else min(current, 2)  # depthwise (= width) or a few groups
        elif _int_list(current) and any(v in widths and v > 64 for v in current) and _WIDTH.search(key):
            out[key] = [HIDDEN if v in widths else v for v in current]
        elif narrow and _WIDTH.search(key) and not _NOT_NARROW.search(key) and (_int(current) or _int_list(current)):
            out[key] = [_narrow(v) for v in current] if isinstance(current, list) else _narrow(current)
        elif current is None and key in WHEN_NONE:
            out[key] = WHEN_NONE[key]
    for key, value in out.items():  # after the sizes: the sections follow the new head size
        if isinstance(value, dict) and not _is_config(value) and key not in _SKIP:
            out[key] = _sections(value, out)
    _consistent(out, tree)
    return out


NARROW = 16


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_int(v) for v in value)


def _narrow(value: int) -> int:
    return max(8, value // NARROW) if value > 64 else value


def _resnet_backbone(timm: dict[str, Any]) -> dict[str, Any]:
    stages = len(timm.get("out_indices") or [4])
    return shrink({"model_type": "resnet", "embedding_size": 16, "hidden_sizes": [16, 32, 64, 64], "depths": [1] * 4,
                   "out_features": [f"stage{4 - stages + 1 + i}" for i in range(stages)]})


# -- rule 2: layers ---------------------------------------------------------------------------------

def _per_layer(tree: dict[str, Any], count: int) -> list[str]:
    return [k for k, v in tree.items() if k not in _SKIP and isinstance(v, (list, tuple)) and len(v) == count
            and not _is_config(v[0])]


def _index_lists(tree: dict[str, Any], count: int, per_layer: list[str]) -> list[str]:
    return [k for k, v in tree.items() if k not in per_layer and ("layer" in k or "idx" in k) and isinstance(v, (list, tuple))
            and v and all(_int(i) and 0 <= i < count for i in v)]


def _per_layer_overrides(tree: dict[str, Any], count: int) -> dict[int, Any]:
    overrides = tree.get("per_layer_config")
    if not isinstance(overrides, dict):
        return {}
    return {int(k): v for k, v in overrides.items() if str(k).isdigit() and int(k) < count}


def _patterns(tree: dict[str, Any], count: int) -> list[str]:
    """Repeating layer patterns shorter than the layer count (RecurrentGemma's ``block_types``)."""
    return [k for k, v in tree.items() if k.endswith("types") and isinstance(v, (list, tuple)) and 1 < len(v) < count
            and len(set(map(repr, v))) > 1]


def _kept_layers(tree: dict[str, Any], count: int) -> list[int]:
    """The first layer of each kind (per-layer lists with few distinct values, overrides, index lists);
    a config with a repeating pattern keeps its first full period (layer i is pattern[i % period])."""
    periods = [len(tree[k]) for k in _patterns(tree, count)]
    if periods:
        return list(range(min(count, max(LAYERS, *periods), MAX_LAYERS)))
    per_layer = _per_layer(tree, count)
    kinds = [k for k in per_layer if len({repr(v) for v in tree[k]}) <= 4 and k not in LIST_SIZES]
    indexed = _index_lists(tree, count, per_layer)
    overrides = _per_layer_overrides(tree, count)

    def kind(i: int) -> tuple[Any, ...]:
        return (tuple(repr(tree[k][i]) for k in kinds), tuple(i in tree[k] for k in indexed), repr(overrides.get(i)))

    kept: list[int] = []
    seen: set[tuple[Any, ...]] = set()
    for i in range(count):
        if kind(i) not in seen:
            seen.add(kind(i))
            kept.append(i)
    for i in range(count):  # at least LAYERS: the next layers in order
        if len(kept) >= min(LAYERS, count):
            break
        if i not in kept:
            kept.append(i)
    return sorted(kept)[:MAX_LAYERS]


def _shrink_layers(tree: dict[str, Any]) -> None:
    counts = sorted({v for k in LAYER_COUNTS if _int(v := tree.get(k)) and v > LAYERS})
    for count in counts:
        kept = _kept_layers(tree, count)
        renumber = {old: new for new, old in enumerate(kept)}
        per_layer = _per_layer(tree, count)
        indexed = _index_lists(tree, count, per_layer)
        for key in LAYER_COUNTS:
            if tree.get(key) == count:
                tree[key] = len(kept)
        for key in per_layer:
            values = [tree[key][i] for i in kept]
            if "layer" in key and all(_int(v) and 0 <= v < count for v in values):  # layer indices (kv_source_layers)
                values = [renumber.get(v, renumber[max(k for k in kept if k <= v)] if v >= kept[0] else 0) for v in values]
            tree[key] = type(tree[key])(values) if isinstance(tree[key], tuple) else values
        for key in indexed:
            tree[key] = [renumber[i] for i in tree[key] if i in renumber]
        overrides = _per_layer_overrides(tree, count)
        if overrides:
            tree["per_layer_config"] = {str(renumber[i]): _shrink_override(v) for i, v in overrides.items() if i in renumber}
        for key in ("out_features", "out_indices"):  # backbones: the last stage by default
            if isinstance(tree.get(key), list):
                tree[key] = None
        tree.pop("stage_names", None)  # derived from the stage count


def _shrink_override(override: Any) -> Any:
    if not isinstance(override, dict):
        return override
    return {k: (min(v, SIZES[k]) if k in SIZES and _int(v) else v) for k, v in override.items()}  # type: ignore[type-var]


# -- rule 3: rope sections, rule 4: consistency -------------------------------------------------------

def _sections(rope: dict[str, Any], tree: dict[str, Any]) -> dict[str, Any]:
    """``mrope_section`` and the like sum to half the rotary head size: rescale them to the new one."""
    out = dict(rope)
    for key, value in rope.items():
        if isinstance(value, dict):
            out[key] = _sections(value, tree)
        elif key == "partial_rotary_factor" and isinstance(value, float) and value * HEAD < 4:
            out[key] = 4 / HEAD  # at least two rotated pairs (M-RoPE rotates pairs on alternating axes)
        elif "section" in key and isinstance(value, list) and value and all(_int(v) and v > 0 for v in value):
            half = int(tree.get("qk_rope_head_dim") or tree.get("head_dim") or HEAD) // 2
            rotary = rope.get("partial_rotary_factor")
            half = max(len(value), int(half * rotary) if isinstance(rotary, float) else half)
            out[key] = _split(half, value)
    return out


def _uses_mrope(model_type: Any) -> bool:
    """Config classes that use multimodal rope sections declare them exempt from rope validation."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return False
    return "mrope_section" in (getattr(CONFIG_MAPPING[model_type], "ignore_keys_at_rope_validation", None) or ())


def _split(total: int, weights: list[int]) -> list[int]:
    parts = [max(1, total * w // sum(weights)) for w in weights]
    parts[0] += total - sum(parts)
    return parts


def _consistent(tree: dict[str, Any], default: dict[str, Any]) -> None:
    heads = tree.get("num_attention_heads")
    kv = tree.get("num_key_value_heads")
    if _int(heads) and _int(kv) and kv and (heads % kv or default.get("num_key_value_heads") == default.get(
            "num_attention_heads")):  # no grouped-query attention by default (MLA, ESMC): none after shrinking
        tree["num_key_value_heads"] = heads
    count = next((tree[k] for k in LAYER_COUNTS if _int(tree.get(k))), None)
    for key in [k for k in tree if k.endswith("_layer_period")]:  # Jamba: attention every `period` layers
        offset = key.replace("_period", "_offset")
        if _int(tree[key]) and _int(count) and tree[key] > count:
            tree[key] = count
            if _int(tree.get(offset)):
                tree[offset] = min(tree[offset], count - 1)
    rope = tree.get("rope_parameters")
    if isinstance(rope, dict) and _uses_mrope(tree.get("model_type")):
        # the modeling code's default sections ([16, 24, 24]) sum to half of a 128 head
        for entry in [rope, *(v for v in rope.values() if isinstance(v, dict))]:
            if "rope_type" in entry and "mrope_section" not in entry:
                entry["mrope_section"] = _split(int(tree.get("head_dim") or HEAD) // 2, [16, 24, 24])
    if _int(tree.get("mamba_expand")) and _int(tree.get("mamba_n_heads")) and _int(tree.get("hidden_size")):
        tree["mamba_d_head"] = tree["mamba_expand"] * tree["hidden_size"] // tree["mamba_n_heads"]
    expand = tree.get("expand")
    if _int(expand) and _int(tree.get("num_heads")) and "head_dim" in tree and _int(tree.get("hidden_size")):
        tree["head_dim"] = expand * tree["hidden_size"] // tree["num_heads"]  # Mamba2: heads x head_dim = expanded width
    special = [k for k in tree if k.endswith(("_token_id", "_token_index", "_token_ids"))]
    for index, key in enumerate(special):  # special tokens inside the shrunk vocabulary, above the ids the job uses
        value = tree[key]
        if _int(value) and value >= VOCAB:
            tree[key] = VOCAB - 1 - index % 8
        elif isinstance(value, list) and any(_int(v) and v >= VOCAB for v in value):
            tree[key] = [VOCAB - 1 - index % 8]
    for key in ("suppress_tokens", "begin_suppress_tokens"):  # Whisper: ids of the full vocabulary
        if isinstance(tree.get(key), list):
            tree[key] = []
