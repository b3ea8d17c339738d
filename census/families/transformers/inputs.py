"""Call inputs for a transformers model, by its ``forward`` signature and its config.

Candidates are tried in order (census/families/transformers/__init__.py keeps the first the model
accepts): the fullest first, so a model that can take an image and text gets both.

* **Multimodal with image tokens** (a config with ``image_token_id``/``image_token_index`` and a
  forward taking ``pixel_values`` and ``input_ids``): the number of image tokens is what the model's
  own ``get_image_features`` returns for the image, and the token ids hold that many image tokens.
* **Dual encoders** (CLIP-like): ``input_ids`` and ``pixel_values`` side by side.
* **One modality**, by ``main_input_name``: token ids (with an attention mask; decoder ids for an
  encoder-decoder), images at the config's image size (patchified with a ``grid_thw`` for
  Qwen-style vision towers), raw audio (``input_values``) or features (``input_features``), time
  series (``past_values`` and their time features).

Every other *required* argument of ``forward`` is filled by name (``MAKERS``: bounding boxes,
Q-Former ids, masks, visual features, ...); a required argument without a maker makes the
candidate fail with its name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from census.targets import CannotBuildInputsError

BATCH, TOKENS, DECODER_TOKENS = 2, 7, 3


@dataclass
class Context:
    """What the makers need: the config tree, read with fallbacks to the sub-configs."""

    model: nn.Module
    config: Any
    generator: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(3))

    def value(self, *names: str, default: Any = None) -> Any:
        for holder in self.holders():
            for name in names:
                value = getattr(holder, name, None)
                if value is not None and not isinstance(value, bool):
                    return value
        return default

    def holders(self) -> Iterator[Any]:
        yield self.config
        for name in ("text_config", "vision_config", "audio_config", "encoder_config", "decoder_config",
                     "backbone_config", "qformer_config", "encoder", "decoder"):
            sub = getattr(self.config, name, None)
            if sub is not None and not isinstance(sub, (dict, str)):
                yield sub

    def vision(self, *names: str, default: Any = None) -> Any:
        return self._first(("vision_config", "backbone_config"), names, default)

    def audio(self, *names: str, default: Any = None) -> Any:
        return self._first(("audio_config", "encoder_config", "encoder"), names, default)

    def _first(self, subs: tuple[str, ...], names: tuple[str, ...], default: Any) -> Any:
        """The first of ``names`` set in the named sub-configs, else anywhere in the tree."""
        for holder in (*(getattr(self.config, s, None) for s in subs), self.config):
            for name in names:
                value = getattr(holder, name, None) if holder is not None else None
                if value is not None and not isinstance(value, bool):
                    return value
        return self.value(*names, default=default)

    def special_ids(self) -> set[int]:
        found: set[int] = set()
        for holder in self.holders():
            for key, value in vars(holder).items():
                if key.endswith(("_token_id", "_token_index", "_token_ids", "_token")):
                    values = value if isinstance(value, (list, tuple)) else [value]
                    found |= {v for v in values if isinstance(v, int) and not isinstance(v, bool)}
        return found

    def ids(self, *shape: int) -> torch.Tensor:
        """Token ids below the special tokens the census moved to the top of the vocabulary, and not
        equal to any special token the config names."""
        vocab = int(self.value("vocab_size", default=99))
        allowed = torch.tensor([i for i in range(3, max(vocab - 9, 4)) if i not in self.special_ids()] or [3])
        return allowed[torch.randint(0, len(allowed), shape, generator=self.generator)]

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator)


def _first_int(value: Any) -> int:
    return int(value[0] if isinstance(value, (list, tuple)) else value)


def _image(ctx: Context) -> torch.Tensor:
    channels = int(ctx.vision("num_channels", "in_channels", "in_chans", default=3))
    side = _first_int(ctx.vision("image_size", "img_size", default=32))
    return ctx.randn(BATCH, channels, side, side).clamp(-1, 1)


def _grid(ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen-style vision input: flattened patches and their (t, h, w) grid, one 4x4-patch image each."""
    channels = int(ctx.vision("in_channels", "num_channels", "in_chans", default=3))
    patch = int(ctx.vision("patch_size", default=8))
    temporal = int(ctx.vision("temporal_patch_size", default=1))
    merge = int(ctx.vision("spatial_merge_size", "merge_size", default=2))
    side = 2 * merge
    grid = torch.tensor([[1, side, side]] * BATCH)
    return ctx.randn(BATCH * side * side, channels * temporal * patch * patch), grid


def _patches(ctx: Context, parameters: dict[str, inspect.Parameter]) -> dict[str, Any]:
    """Vision towers fed patch sequences: Qwen-style flattened patches with a (t, h, w) grid, or
    (batch, patches, values) with a mask and the (h, w) shape (SigLIP2) or per-patch positions."""
    if "grid_thw" in parameters:
        return _vision(ctx, parameters)
    channels = int(ctx.vision("num_channels", "in_channels", default=3))
    patch = int(ctx.vision("patch_size", default=8))
    side = 4
    inputs: dict[str, Any] = {"pixel_values": ctx.randn(BATCH, side * side, channels * patch * patch)}
    if "pixel_attention_mask" in parameters:
        inputs["pixel_attention_mask"] = torch.ones(BATCH, side * side, dtype=torch.long)
    if "spatial_shapes" in parameters:
        inputs["spatial_shapes"] = torch.tensor([[side, side]] * BATCH)
    if "pixel_position_ids" in parameters:
        grid = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij"), -1).reshape(-1, 2)
        inputs["pixel_position_ids"] = grid.expand(BATCH, -1, -1).contiguous()
    return inputs


def _audio_features(ctx: Context, frames: int = 64) -> torch.Tensor:
    bins = int(ctx.audio("num_mel_bins", "feature_size", "input_feat_per_channel", "n_mels", default=80))
    return ctx.randn(BATCH, bins, frames)


def _frame_counts(ctx: Context) -> list[int]:
    """Feature lengths to try: a short clip, what Whisper-style encoders require (twice their
    source positions) and multiples of a windowed encoder's window."""
    counts = [64, 2 * int(ctx.audio("max_source_positions", default=32))]
    window = ctx.audio("n_window")
    if isinstance(window, int) and window > 0:
        counts.append(2 * window)
    return list(dict.fromkeys(counts))


def _spectrogram(ctx: Context) -> torch.Tensor:
    """Audio Spectrogram Transformer: ``input_values`` are (batch, frames, mel bins)."""
    return ctx.randn(BATCH, int(ctx.audio("max_length", default=128)), int(ctx.audio("num_mel_bins", default=16)))


def _video(ctx: Context, frames: int | None = None) -> torch.Tensor:
    """Video models and per-sample image stacks: (batch, frames, channels, height, width)."""
    frames = frames or int(ctx.vision("num_frames", default=2))
    return _image(ctx).unsqueeze(1).expand(-1, frames, -1, -1, -1).contiguous()


def _time_series(ctx: Context, future: bool, channels_last: bool = False) -> torch.Tensor:
    length = int(ctx.value("context_length", default=16)) + max(ctx.value("lags_sequence", default=[0]) or [0])
    if future:
        length = int(ctx.value("prediction_length", default=4))
    channels = int(ctx.value("num_input_channels", "input_size", default=1))
    return ctx.randn(BATCH, length, channels) if channels > 1 or channels_last else ctx.randn(BATCH, length)


def _time_features(ctx: Context, future: bool) -> torch.Tensor:
    length = (int(ctx.value("prediction_length", default=4)) if future else
              int(ctx.value("context_length", default=16)) + max(ctx.value("lags_sequence", default=[0]) or [0]))
    return ctx.randn(BATCH, length, int(ctx.value("num_time_features", default=1)))


# required arguments by name
MAKERS: dict[str, Callable[[Context], Any]] = {
    "input_ids": lambda c: c.ids(BATCH, TOKENS),
    "attention_mask": lambda c: torch.ones(BATCH, TOKENS, dtype=torch.long),
    "token_type_ids": lambda c: torch.zeros(BATCH, TOKENS, dtype=torch.long),
    "decoder_input_ids": lambda c: c.ids(BATCH, DECODER_TOKENS),
    "qformer_input_ids": lambda c: c.ids(BATCH, TOKENS),
    "qformer_attention_mask": lambda c: torch.ones(BATCH, TOKENS, dtype=torch.long),
    "bbox": lambda c: torch.sort(torch.randint(0, 1000, (BATCH, TOKENS, 4), generator=c.generator), -1).values[..., [0, 1, 2, 3]],
    "pixel_values": _image,
    "input_values": lambda c: c.randn(BATCH, 1600),
    "input_features": _audio_features,
    "input_features_mask": lambda c: torch.ones(BATCH, 64, dtype=torch.long),
    "visual_feats": lambda c: c.randn(BATCH, 4, int(c.value("visual_feat_dim", default=32))),
    "visual_pos": lambda c: torch.rand(BATCH, 4, int(c.value("visual_pos_dim", default=4)), generator=c.generator),
    "query_embeds": lambda c: c.randn(BATCH, 4, int(c.value("hidden_size", default=32))),
    "past_values": lambda c: _time_series(c, future=False),
    "past_time_features": lambda c: _time_features(c, future=False),
    "past_observed_mask": lambda c: torch.ones_like(_time_series(c, future=False)),
    "future_values": lambda c: _time_series(c, future=True),
    "future_time_features": lambda c: _time_features(c, future=True),
    "encoder_hidden_states": lambda c: c.randn(BATCH, 4, int(c.value("encoder_hidden_size", "hidden_size", default=32))),
    "pixel_values_videos": _video,
    "prompt_pixel_values": _image,
    "prompt_masks": _image,
}


def _parameters(model: nn.Module) -> dict[str, inspect.Parameter]:
    return {name: p for name, p in inspect.signature(model.forward).parameters.items()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _required(parameters: dict[str, inspect.Parameter]) -> list[str]:
    return [name for name, p in parameters.items() if p.default is inspect.Parameter.empty]


def _fill(ctx: Context, base: dict[str, Any], parameters: dict[str, inspect.Parameter]) -> dict[str, Any]:
    inputs = dict(base)
    for name in _required(parameters):
        if name not in inputs:
            if name not in MAKERS:
                raise CannotBuildInputsError(f"forward requires {name!r}, which the census does not make "
                                             "(census/families/transformers/inputs.py MAKERS)")
            inputs[name] = MAKERS[name](ctx)
    return inputs


def _text(ctx: Context, parameters: dict[str, inspect.Parameter]) -> dict[str, Any]:
    inputs: dict[str, Any] = {"input_ids": MAKERS["input_ids"](ctx)}
    if "attention_mask" in parameters:
        inputs["attention_mask"] = MAKERS["attention_mask"](ctx)
    if "bbox" in parameters:  # layout models: a box per token
        inputs["bbox"] = MAKERS["bbox"](ctx)
    if "decoder_input_ids" in parameters and (getattr(ctx.config, "is_encoder_decoder", False)
                                              or "decoder_input_ids" in _required(parameters)):
        inputs["decoder_input_ids"] = MAKERS["decoder_input_ids"](ctx)
    return inputs


def _vision(ctx: Context, parameters: dict[str, inspect.Parameter]) -> dict[str, Any]:
    grid_name = next((n for n in ("image_grid_thw", "grid_thw") if n in parameters), None)
    if grid_name is not None:
        patches, grid = _grid(ctx)
        return {("hidden_states" if "hidden_states" in parameters and "pixel_values" not in parameters
                 else "pixel_values"): patches, grid_name: grid}
    return {"pixel_values": _image(ctx)}


def image_token_count(model: nn.Module, images: dict[str, Any]) -> int | None:
    """Image tokens per image, from the model's own ``get_image_features`` (None: no such method)."""
    for owner in (model, getattr(model, "model", None)):
        method = getattr(owner, "get_image_features", None)
        if method is None:
            continue
        accepted = inspect.signature(method).parameters
        with torch.no_grad():
            features = method(**{k: v for k, v in images.items() if k in accepted})
        features = getattr(features, "pooler_output", None) if hasattr(features, "pooler_output") else features
        if isinstance(features, torch.Tensor):
            return features.reshape(-1, features.shape[-1]).shape[0] // BATCH
        if isinstance(features, (list, tuple)) and features and isinstance(features[0], torch.Tensor):
            return sum(f.reshape(-1, f.shape[-1]).shape[0] for f in features) // BATCH
    return None


def _with_image_tokens(ctx: Context, parameters: dict[str, inspect.Parameter]) -> dict[str, Any]:
    token = ctx.value("image_token_id", "image_token_index")
    if not isinstance(token, int):
        raise CannotBuildInputsError("no image token id in the config")
    images = _vision(ctx, parameters)
    count = image_token_count(ctx.model, images)
    if count is None:
        raise CannotBuildInputsError("the model has no get_image_features to count image tokens")
    text = ctx.ids(BATCH, 3)
    ids = torch.cat([text[:, :1], torch.full((BATCH, count), token), text[:, 1:]], dim=1)
    inputs = {"input_ids": ids, **images}
    if "attention_mask" in parameters:
        inputs["attention_mask"] = torch.ones_like(ids)
    if "mm_token_type_ids" in parameters:  # Qwen-VL's multimodal rope: 1 at image tokens (what its processor returns)
        inputs["mm_token_type_ids"] = (ids == token).long()
    return inputs


def _decoder(ctx: Context, parameters: dict[str, inspect.Parameter]) -> dict[str, Any]:
    """Decoder ids for a model that generates text from another modality (speech, vision seq2seq)."""
    return {"decoder_input_ids": MAKERS["decoder_input_ids"](ctx)} if "decoder_input_ids" in parameters else {}


def candidates(model: nn.Module) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    """(description, inputs maker) pairs, fullest first."""
    ctx = Context(model, model.config)
    parameters = _parameters(model)
    main = getattr(model, "main_input_name", "input_ids")
    takes_text, takes_images = "input_ids" in parameters, "pixel_values" in parameters
    if takes_text and "input_features" in parameters and main != "input_features":  # CLAP-like text and audio
        yield "text and audio", lambda: _fill(ctx, {**_text(ctx, parameters), "input_features": _audio_features(
            ctx).unsqueeze(1)}, parameters)
    if takes_text and takes_images and ctx.value("image_token_id", "image_token_index") is not None:
        yield "text with image tokens and images", lambda: _fill(ctx, _with_image_tokens(ctx, parameters), parameters)
    if takes_text and takes_images:
        yield "text and images", lambda: _fill(ctx, {**_text(ctx, parameters), **_vision(ctx, parameters)}, parameters)
    if "grid_thw" in parameters or "spatial_shapes" in parameters or "pixel_position_ids" in parameters:
        yield "image patches", lambda: _fill(ctx, _patches(ctx, parameters), parameters)
    if takes_images and ctx.vision("num_frames") is not None:
        yield "video", lambda: _fill(ctx, {**(_text(ctx, parameters) if takes_text else {}), "pixel_values": _video(ctx),
                                           **_decoder(ctx, parameters)}, parameters)
    if main in ("pixel_values", "hidden_states") or (main not in parameters and takes_images):
        yield "images", lambda: _fill(ctx, {**_vision(ctx, parameters), **_decoder(ctx, parameters)}, parameters)
        if takes_text:
            yield "images (a stack per sample) and text", lambda: _fill(
                ctx, {**_text(ctx, parameters), "pixel_values": _video(ctx)}, parameters)
        side = _first_int(ctx.vision("image_size", "img_size", default=32))
        for other in (64, 224):
            if other != side:
                yield f"images of {other} px", lambda other=other: _fill(
                    ctx, {"pixel_values": torch.nn.functional.interpolate(_image(ctx), size=(other, other))}, parameters)
    if main == "input_values":
        yield "raw audio", lambda: _fill(ctx, {"input_values": MAKERS["input_values"](ctx), **_decoder(ctx, parameters)},
                                         parameters)
        yield "spectrogram", lambda: _fill(ctx, {"input_values": _spectrogram(ctx)}, parameters)
        yield "raw audio (batch, 1, samples)", lambda: _fill(ctx, {"input_values": ctx.randn(BATCH, 1, 1600)}, parameters)
        yield "raw audio, 16000 samples", lambda: _fill(ctx, {"input_values": ctx.randn(BATCH, 16000)}, parameters)
    if main == "input_features":
        for frames in _frame_counts(ctx):
            features = _audio_features(ctx, frames)
            yield f"audio features of {frames} frames", lambda features=features: _fill(
                ctx, {"input_features": features, **_decoder(ctx, parameters)}, parameters)
            yield f"audio features of {frames} frames (batch, frames, bins)", lambda features=features: _fill(
                ctx, {"input_features": features.transpose(1, 2).contiguous(), **_decoder(ctx, parameters)}, parameters)
    if main == "pixel_values":  # image pairs (LightGlue, EfficientLoFTR: batch, 2, channels, height, width)
        yield "images (a stack per sample)", lambda: _fill(ctx, {"pixel_values": _video(ctx, 2)}, parameters)
    if takes_text and main not in ("pixel_values", "input_values", "input_features"):
        yield "text", lambda: _fill(ctx, _text(ctx, parameters), parameters)
    if main == "past_values":
        yield "time series", lambda: _fill(ctx, {"past_values": MAKERS["past_values"](ctx)}, parameters)
        yield "time series (batch, length, channels)", lambda: _fill(
            ctx, {"past_values": _time_series(ctx, future=False, channels_last=True)}, parameters)
    yield "the required arguments", lambda: _fill(ctx, {}, parameters)
    if "encoder_hidden_states" in parameters:  # a cross-attending module alone (Q-Former)
        yield "the required arguments and encoder states", lambda: _fill(
            ctx, {"encoder_hidden_states": MAKERS["encoder_hidden_states"](ctx)}, parameters)
