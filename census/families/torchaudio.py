"""torchaudio: every model class (and generic model builder) of ``torchaudio.models`` and every
transform of ``torchaudio.transforms`` (speech recognition, separation, synthesis, features).

torchaudio 2.11.1, its last release, does not import with torch 2.13 (its native library is built
for 2.11); the processes of this family import it through ``census/shims/torchaudio``, which
loads torchaudio's own Python code without that library (see the shim's docstring). Models are
built small (``MODELS``: widths 16-32, one or two layers, 0.1 s of 16 kHz audio): every class, and
the generic builders (``wav2vec2_model``, ``wavlm_model``, ``emformer_rnnt_model``, ...) of the
classes that are built through one; the builders of full-size presets (``wav2vec2_base``,
``hubert_xlarge``, ``hdemucs_high``: 0.1-2B parameters each) are not targets, since each presets a
builder or class that is one. Transforms are built from their
signature by name (``TYPICAL``: 16 kHz, masks of 4 bins) and fed the first of ``_candidates`` they
accept (waveforms, power, complex and mel spectrograms, pairs). Captured: the model or transform
and, by rule, a model's first repeated block.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.construct import Inputs, construct, first_accepted
from census.targets import CannotBuildError, Job, Sample, Target

EXTRA_PATH = {"capture": ["census/shims", ".venv/census-site"], "replay": ["census/shims", ".venv/census-site"]}
RATE, SAMPLES, B = 16000, 1600, 2


def _models():  # type: ignore[no-untyped-def]
    try:
        import torchaudio.models
    except Exception as error:  # not installed (scripts/_setup_env.sh puts it in .venv/census-site)
        raise CannotBuildError(f"torchaudio does not import: {type(error).__name__}: {error}") from error
    return torchaudio.models


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(21)


def _wave(*shape: int) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: (torch.randn(*shape, generator=_gen()),)


EXTRACTOR = dict(extractor_mode="group_norm", extractor_conv_layer_config=[(16, 10, 5), (16, 3, 2)],
                 extractor_conv_bias=False, encoder_embed_dim=32, encoder_projection_dropout=0.1,
                 encoder_pos_conv_kernel=16, encoder_pos_conv_groups=4, encoder_num_layers=2, encoder_num_heads=2,
                 encoder_attention_dropout=0.1, encoder_ff_interm_features=64, encoder_ff_interm_dropout=0.0,
                 encoder_dropout=0.1, encoder_layer_norm_first=False, encoder_layer_drop=0.1)


def _tacotron_inputs() -> tuple[torch.Tensor, ...]:
    g = _gen()
    return (torch.randint(1, 20, (B, 6), generator=g), torch.tensor([6, 4]), torch.randn(B, 16, 10, generator=g),
            torch.tensor([10, 8]))


def _rnnt_inputs() -> tuple[torch.Tensor, ...]:
    g = _gen()
    return (torch.randn(B, 18, 16, generator=g), torch.tensor([18, 18]), torch.randint(0, 9, (B, 3), generator=g),
            torch.tensor([3, 2]))


def _wavernn_inputs() -> tuple[torch.Tensor, ...]:
    g = _gen()  # frames 10, kernel 5, hop 4: (10 - 5 + 1) * 4 samples
    return torch.rand(B, 1, 24, generator=g) * 2 - 1, torch.randn(B, 1, 8, 10, generator=g)


# builder in torchaudio.models -> (arguments, inputs)
MODELS: dict[str, tuple[Callable[[], dict[str, Any]], Callable[[], tuple[Any, ...]]]] = {
    "Wav2Letter": (lambda: dict(num_classes=10, input_type="waveform", num_features=1), _wave(B, 1, SAMPLES)),
    "WaveRNN": (lambda: dict(upsample_scales=[2, 2], n_classes=16, hop_length=4, n_res_block=1, n_rnn=16, n_fc=16,
                             kernel_size=5, n_freq=8, n_hidden=8, n_output=8), _wavernn_inputs),
    "ConvTasNet": (lambda: dict(num_sources=2, enc_kernel_size=16, enc_num_feats=32, msk_kernel_size=3,
                                msk_num_feats=16, msk_num_hidden_feats=32, msk_num_layers=2, msk_num_stacks=1),
                   _wave(B, 1, 800)),
    "DeepSpeech": (lambda: dict(n_feature=16, n_hidden=32, n_class=10), _wave(B, 1, 20, 16)),
    "wav2vec2_model": (lambda: dict(EXTRACTOR, aux_num_out=None), _wave(B, SAMPLES)),
    "wavlm_model": (lambda: dict(EXTRACTOR, encoder_num_buckets=16, encoder_max_distance=64, aux_num_out=None),
                    _wave(B, SAMPLES)),
    "Conformer": (lambda: dict(input_dim=16, num_heads=2, ffn_dim=32, num_layers=1, depthwise_conv_kernel_size=3),
                  lambda: (torch.randn(B, 10, 16, generator=_gen()), torch.tensor([10, 7]))),
    "Emformer": (lambda: dict(input_dim=16, num_heads=2, ffn_dim=32, num_layers=1, segment_length=4,
                              right_context_length=1), lambda: (torch.randn(B, 9, 16, generator=_gen()), torch.tensor([9, 9]))),
    "emformer_rnnt_model": (lambda: dict(
        input_dim=16, encoding_dim=16, num_symbols=10, segment_length=4, right_context_length=1,
        time_reduction_input_dim=16, time_reduction_stride=2, transformer_num_heads=2, transformer_ffn_dim=32,
        transformer_num_layers=1, transformer_dropout=0.1, transformer_activation="relu",
        transformer_left_context_length=4, transformer_max_memory_size=0,
        transformer_weight_init_scale_strategy="depthwise", transformer_tanh_on_mem=True, symbol_embedding_dim=16,
        num_lstm_layers=1, lstm_layer_norm=True, lstm_layer_norm_epsilon=1e-3, lstm_dropout=0.1), _rnnt_inputs),
    "HDemucs": (lambda: dict(sources=["drums", "bass"], channels=8, depth=2, nfft=512), _wave(1, 2, 2048)),
    "Tacotron2": (lambda: dict(n_mels=16, n_symbol=20, symbol_embedding_dim=16, encoder_embedding_dim=16,
                               encoder_n_convolution=1, decoder_rnn_dim=32, attention_rnn_dim=32, attention_hidden_dim=16,
                               attention_location_n_filter=4, attention_location_kernel_size=3, prenet_dim=16,
                               postnet_n_convolution=1, postnet_embedding_dim=16), _tacotron_inputs),
    "squim_objective_model": (lambda: dict(feat_dim=16, win_len=32, d_model=16, nhead=2, hidden_dim=16, num_blocks=1,
                                           rnn_type="LSTM", chunk_size=8), _wave(B, 800)),
}
# full-size presets (0.1-2B parameters) and what is not a model, with the reason listed
NOT_TARGETS = {
    "Wav2Vec2Model": "built by wav2vec2_model / wavlm_model (targets)",
    "HuBERTPretrainModel": "HuBERT's pretraining wrapper (its Wav2Vec2Model is built by wav2vec2_model, a target)",
    "RNNT": "built by emformer_rnnt_model (a target)", "SquimObjective": "built by squim_objective_model (a target)",
    "SquimSubjective": "squim_subjective_model builds a full-size wav2vec 2.0 inside (95M parameters)",
    "RNNTBeamSearch": "a beam-search decoder driving an RNNT (the RNNT is a target)",
    "Hypothesis": "a tuple type of the beam search", "squim_subjective_model": "builds a full-size wav2vec 2.0 (95M)",
    "hubert_pretrain_model": "HuBERT's pretraining wrapper, as HuBERTPretrainModel",
}


def _is_target(models: Any, name: str) -> bool:
    """A class, or a builder the census builds small (the other builders are full-size presets)."""
    return inspect.isclass(getattr(models, name)) or name in MODELS or name in NOT_TARGETS
TYPICAL: dict[str, Any] = {
    "freq_mask_param": 4, "time_mask_param": 4, "n_time_masks": 1, "n_freq_masks": 1, "n_stft": 201,
    "sample_rate": RATE, "orig_freq": RATE, "factor": 1.1, "factors": [0.9, 1.1], "gain": 0.5,
    "n_steps": 12,  # an octave: a 2:1 resampling (a semitone's 16:15 costs 90 s a call)
}


def _transforms() -> dict[str, type[nn.Module]]:
    import torchaudio.transforms

    return {f"transforms.{name}": getattr(torchaudio.transforms, name) for name in sorted(torchaudio.transforms.__all__)}


def _build_model(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        models = _models()
        if name in NOT_TARGETS:
            raise CannotBuildError(f"not a target: {NOT_TARGETS[name]}")
        return getattr(models, name)(**MODELS[name][0]())
    return build


def _build_transform(cls: type[nn.Module]) -> Callable[[], nn.Module]:
    return lambda: construct(cls, TYPICAL, {}, {}, {}, "census/families/torchaudio.py TYPICAL")


def _transform_candidates() -> list[Inputs]:
    def spec(*shape: int, complex_: bool = False) -> Callable[[], torch.Tensor]:
        def make() -> torch.Tensor:
            x = torch.rand(*shape, generator=_gen())
            return torch.complex(x, torch.rand(*shape, generator=_gen())) if complex_ else x
        return make

    wave = lambda: torch.randn(B, SAMPLES, generator=_gen())  # noqa: E731
    return [lambda: (wave(),), lambda: (spec(B, 201, 9)(),), lambda: (spec(B, 128, 9)(),),
            lambda: (spec(B, 201, 9, complex_=True)(),), lambda: (wave(), torch.randn(B, 100, generator=_gen())),
            lambda: (wave(), wave(), torch.tensor([10.0, 20.0])),
            lambda: (spec(B, 3, 201, 9, complex_=True)(), spec(B, 3, 201, 9, complex_=True)(), torch.zeros(B, dtype=torch.long)),
            lambda: (spec(B, 3, 201, 9, complex_=True)(), torch.rand(B, 201, 9, generator=_gen())),
            lambda: (spec(B, 3, 201, 9, complex_=True)(), torch.rand(B, 201, 9, generator=_gen()),
                     torch.rand(B, 201, 9, generator=_gen())),
            lambda: (torch.randint(0, 256, (B, SAMPLES), generator=_gen()),)]


def _model_job(name: str) -> Callable[[nn.Module], Job]:
    return lambda model: first_accepted(model, [MODELS[name][1]])  # only called for a model that built (in MODELS)


def _transform_job(model: nn.Module) -> Job:
    return first_accepted(model, _transform_candidates())


def targets(sample: Sample) -> list[Target]:
    try:
        models = _models()
        names = [n for n in models.__all__ if _is_target(models, n)]
        transforms = _transforms()
    except CannotBuildError:  # every target says why when it is built
        names, transforms = list(MODELS), {}
    chosen = sample.pick([*names, *transforms], str, quick_count=2)
    return [Target(name, _build_transform(transforms[name]), _transform_job, submodules=lambda _m: {"model": ""})
            if name in transforms else Target(name, _build_model(name), _model_job(name)) for name in chosen]
