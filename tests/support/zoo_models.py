"""The external zoo: third-party modules run the way their users run them (issue 11).

Groups of :class:`fidelity_models.Scenario`: timm architectures (``pretrained=False``, tiny
inputs), transformers architectures beyond the fidelity suite's with their DEFAULT settings
(caches on) in eval, train and CPU bf16 autocast, and odd modules (in-place ops, a buffer
reassigned in forward, PackedSequence, ``autograd.grad`` inside forward, complex tensors). Each
group is captured in one worker process (tests/support/zoo_capture.py) and replayed in another
(tests/support/fidelity_replay.py). ``FAST`` names the labels every test run covers; the full zoo
is a slow test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from fidelity_models import Scenario, _cache_keyword, _hf, _hf_ids
from torch import nn

# --------------------------------------------------------------------------------------------
# timm (pretrained=False; torchvision comes from tests/support/shims)
# --------------------------------------------------------------------------------------------


def _timm(name: str, **kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, **kwargs)
    return build


def _drive_image(size: int) -> Callable[[nn.Module], None]:
    def drive(model: nn.Module) -> None:
        model(torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(4)))
    return drive


# (architecture, constructor kwargs, image size, a submodule target besides the whole model)
_TIMM: list[tuple[str, dict[str, Any], int, str | None]] = [
    ("resnet10t", {}, 64, "layer1"),
    ("efficientnet_b0", {}, 64, "blocks.1"),
    ("mobilenetv3_small_050", {}, 64, "blocks.2"),
    ("convnext_atto", {}, 64, "stages.0"),
    ("vit_tiny_patch16_224", {"img_size": 64}, 64, "blocks.0"),
    ("deit_tiny_distilled_patch16_224", {"img_size": 64}, 64, "blocks.1.attn"),
    ("regnetx_002", {}, 64, "s1"),
    ("fastvit_t8", {}, 64, "stages.0"),
    ("ghostnet_050", {}, 64, "blocks.1"),
    ("mobilevit_xxs", {}, 64, "stages.3"),
    ("edgenext_xx_small", {}, 64, "stages.1"),
    ("tinynet_e", {}, 64, "blocks.2"),
    ("lcnet_050", {}, 64, "blocks.1"),
    ("rexnet_100", {}, 64, "features.3"),
    ("xcit_nano_12_p16_224", {"img_size": 64}, 64, "blocks.0"),
    ("levit_128s", {"img_size": 64}, 64, "stages.0"),
    ("swin_tiny_patch4_window7_224", {"img_size": 56, "window_size": 7}, 56, "layers.0"),
    ("coat_lite_tiny", {"img_size": 64}, 64, "serial_blocks1.0"),
]


def _timm_scenarios() -> list[Scenario]:
    scenarios = []
    for name, kwargs, size, block in _TIMM:
        targets = {f"timm.{name}": "*root*"}
        if block:
            targets[f"timm.{name}:{block}"] = block
        scenarios.append(Scenario(f"timm-{name}", _timm(name, **kwargs), _drive_image(size), targets))
    return scenarios


# --------------------------------------------------------------------------------------------
# transformers, default settings: caches on; eval, train and CPU bf16 autocast
# --------------------------------------------------------------------------------------------

_TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_SMALL = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "max_position_embeddings": 64, **_TOKENS}


def _decode(model: nn.Module) -> None:
    """Prefill, then one decode step on the returned cache (transformers' default use_cache=True)."""
    ids = _hf_ids(64)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    past = getattr(out, "past_key_values", None)
    if past is not None:
        step = out.logits[:, -1:].argmax(-1)
        model(input_ids=step, attention_mask=torch.ones(ids.shape[0], ids.shape[1] + 1, dtype=torch.long),
              **{_cache_keyword(model): past})


def _encode(model: nn.Module) -> None:
    ids = _hf_ids(64)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    model(input_ids=ids, attention_mask=mask)


def _seq2seq(model: nn.Module) -> None:
    ids = _hf_ids(64)
    out = model(input_ids=ids, decoder_input_ids=ids[:, :3])
    model(encoder_outputs=(out.encoder_last_hidden_state,), decoder_input_ids=out.logits[:, -1:].argmax(-1),
          **{_cache_keyword(model): out.past_key_values})


# (label, config class, model class, config kwargs, driver, layer target)
_TRANSFORMERS: list[tuple[str, str, str, dict[str, Any], Callable[[nn.Module], None], str]] = [
    ("Qwen3", "Qwen3Config", "Qwen3ForCausalLM", {**_SMALL, "num_key_value_heads": 2, "head_dim": 8}, _decode,
     "model.layers.1"),
    ("Olmo2", "Olmo2Config", "Olmo2ForCausalLM", {**_SMALL, "num_key_value_heads": 2}, _decode, "model.layers.0"),
    ("StableLm", "StableLmConfig", "StableLmForCausalLM", {**_SMALL, "num_key_value_heads": 2}, _decode,
     "model.layers.0"),
    ("Starcoder2", "Starcoder2Config", "Starcoder2ForCausalLM", {**_SMALL, "num_key_value_heads": 2}, _decode,
     "model.layers.0"),
    ("Bloom", "BloomConfig", "BloomForCausalLM", {"vocab_size": 64, "hidden_size": 32, "n_layer": 2, "n_head": 4,
                                                  **_TOKENS}, _decode, "transformer.h.0"),
    ("GPTJ", "GPTJConfig", "GPTJForCausalLM", {"vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 4,
                                               "rotary_dim": 4, "n_positions": 64, **_TOKENS}, _decode,
     "transformer.h.0"),
    ("CodeGen", "CodeGenConfig", "CodeGenForCausalLM", {"vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 4,
                                                        "rotary_dim": 4, "n_positions": 64, "n_ctx": 64,
                                                        **_TOKENS}, _decode, "transformer.h.0"),
    ("GPTBigCode", "GPTBigCodeConfig", "GPTBigCodeForCausalLM", {"vocab_size": 64, "n_embd": 32, "n_layer": 2,
                                                                 "n_head": 4, "n_positions": 64, **_TOKENS},
     _decode, "transformer.h.0"),
    ("DistilBert", "DistilBertConfig", "DistilBertModel", {"vocab_size": 64, "dim": 32, "n_layers": 2, "n_heads": 4,
                                                           "hidden_dim": 64, "max_position_embeddings": 64,
                                                           "pad_token_id": 0}, _encode, "transformer.layer.0"),
    ("Roberta", "RobertaConfig", "RobertaModel", {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
                                                  "num_attention_heads": 4, "intermediate_size": 64,
                                                  "max_position_embeddings": 72, **_TOKENS}, _encode,
     "encoder.layer.0"),
    ("DebertaV2", "DebertaV2Config", "DebertaV2Model", {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
                                                        "num_attention_heads": 4, "intermediate_size": 64,
                                                        "max_position_embeddings": 64, "pad_token_id": 0},
     _encode, "encoder.layer.1"),
    ("Pegasus", "PegasusConfig", "PegasusForConditionalGeneration",
     {"vocab_size": 64, "d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 4,
      "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_position_embeddings": 64,
      "decoder_start_token_id": 0, **_TOKENS}, _seq2seq, "model.decoder.layers.0"),
]

_MODES: dict[str, tuple[bool, bool]] = {"eval": (False, False), "train": (True, False), "bf16": (False, True)}


def _in_mode(drive: Callable[[nn.Module], None], autocast: bool) -> Callable[[nn.Module], None]:
    def run(model: nn.Module) -> None:
        context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with context:
            drive(model)
    return run


def _transformers_scenarios() -> list[Scenario]:
    scenarios = []
    for label, config, model, kwargs, drive, layer in _TRANSFORMERS:
        for mode, (train, autocast) in _MODES.items():
            targets = {f"hf-{mode}.{label}": "*root*", f"hf-{mode}.{label}:{layer}": layer}
            scenarios.append(Scenario(f"hf-{mode}-{label}", _hf(config, model, **kwargs), _in_mode(drive, autocast),
                                      targets, train=train, max_calls=2))
    return scenarios


# --------------------------------------------------------------------------------------------
# Odd modules
# --------------------------------------------------------------------------------------------


class InPlace(nn.Module):
    """In-place activations and an in-place update of its own input."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 8), nn.Hardtanh(inplace=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(0.5)
        return self.body(x).add_(1.0)


class StepCounter(nn.Module):
    """Reassigns a buffer in forward (a new tensor, not an in-place update)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("ema", torch.zeros(8))
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps = self.steps + 1
        self.ema = 0.9 * self.ema + 0.1 * x.detach().mean(0)
        return self.lin(x - self.ema) * self.steps


class PackedLSTM(nn.Module):
    """An LSTM fed a PackedSequence (variable-length batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 5, batch_first=True)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        return padded


class Forces(nn.Module):
    """An energy model that returns forces: ``autograd.grad`` inside forward."""

    def __init__(self) -> None:
        super().__init__()
        self.energy = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.enable_grad():
            pos = positions if positions.requires_grad else positions.detach().requires_grad_(True)
            energy = self.energy(pos).sum()
            (grad,) = torch.autograd.grad(energy, pos, create_graph=self.training)
        return energy, -grad


class SpectralMix(nn.Module):
    """Complex tensors: an FFT, a complex weight, and a complex output."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(5, dtype=torch.complex64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.rfft(x, dim=-1) * self.weight


class Odd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inplace = InPlace()
        self.counter = StepCounter()
        self.packed = PackedLSTM()
        self.forces = Forces()
        self.spectral = SpectralMix()
        self.packed_inner = self.packed.lstm  # the LSTM itself receives a PackedSequence

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gen = torch.Generator().manual_seed(6)
        h = self.counter(self.inplace(x.clone()))
        seq = self.packed(torch.randn(3, 4, 6, generator=gen), torch.tensor([4, 2, 3]))
        energy, forces = self.forces(torch.randn(5, 3, generator=gen))
        spectrum = self.spectral(torch.randn(2, 8, generator=gen))
        return h.sum() + seq.sum() + energy + forces.sum() + spectrum.abs().sum()


def _drive_odd(model: nn.Module) -> None:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(5))
    model(x)
    model(x)  # the second call sees the reassigned buffers


_ODD_TARGETS = {"odd.InPlace": "inplace", "odd.StepCounter": "counter", "odd.PackedLSTM": "packed",
                "odd.LSTM(PackedSequence)": "packed.lstm", "odd.Forces": "forces", "odd.SpectralMix": "spectral"}


def _odd_scenarios() -> list[Scenario]:
    return [Scenario(f"odd-{mode}", Odd, _drive_odd, {f"{label}[{mode}]": t for label, t in _ODD_TARGETS.items()},
                     train=mode == "train", max_calls=2) for mode in ("eval", "train")]


GROUPS: dict[str, Callable[[], list[Scenario]]] = {
    "timm": _timm_scenarios,
    "transformers": _transformers_scenarios,
    "odd": _odd_scenarios,
}

# Covered by every test run (the rest is the slow full zoo).
FAST: dict[str, list[str]] = {
    "timm": ["timm.resnet10t", "timm.vit_tiny_patch16_224:blocks.0"],
    "transformers": ["hf-eval.Qwen3:model.layers.1", "hf-train.Qwen3", "hf-bf16.Qwen3"],
    "odd": [f"{label}[eval]" for label in _ODD_TARGETS],
}


def scenarios(group: str, only: set[str] | None = None) -> list[Scenario]:
    """The group's scenarios, each cut down to the labels in ``only`` (when given)."""
    result = []
    for scenario in GROUPS[group]():
        if only is not None:
            scenario.targets = {k: v for k, v in scenario.targets.items() if k in only}
        if scenario.targets:
            result.append(scenario)
    return result


def labels(group: str, only: set[str] | None = None) -> list[str]:
    return [label for scenario in scenarios(group, only) for label in scenario.targets]
