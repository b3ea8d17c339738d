"""Models for the fidelity suite: torch.nn layers, small transformers models, recommendation modules.

Every *scenario* builds one small model, names the submodules to capture (a label -- the module
type -- and a target pattern each), and drives the real model: the capture records the inner
modules while the full model runs, the realistic path. Constructors must run under
``modulelens.track_init()``. Classes here must be importable as ``fidelity_models`` by the
replaying subprocess (the test puts this folder on its ``PYTHONPATH``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.utils._pytree as pytree
from torch import nn

# --------------------------------------------------------------------------------------------
# Recommendation-style modules with dict / jagged / dataclass / namedtuple inputs and outputs
# --------------------------------------------------------------------------------------------


class Jagged:
    """A minimal jagged batch (values + lengths per sample), registered with torch's pytree the
    way torchrec registers ``KeyedJaggedTensor``: capture and replay go through pytree only."""

    def __init__(self, values: torch.Tensor, lengths: torch.Tensor) -> None:
        self.values = values
        self.lengths = lengths

    def offsets(self) -> torch.Tensor:
        return torch.cat([self.lengths.new_zeros(1), self.lengths.cumsum(0)])


pytree.register_pytree_node(
    Jagged,
    lambda j: ([j.values, j.lengths], None),
    lambda children, _context: Jagged(*children),
    flatten_with_keys_fn=lambda j: ([(pytree.GetAttrKey("values"), j.values),
                                     (pytree.GetAttrKey("lengths"), j.lengths)], None),
    serialized_type_name="fidelity_models.Jagged",
)


@dataclass
class Batch:
    """A dataclass call input (not registered with pytree: stored field by field)."""

    dense: torch.Tensor
    ids: torch.Tensor
    weight: float = 1.0


@dataclass
class TowerOut:
    user: torch.Tensor
    item: torch.Tensor
    score: torch.Tensor


class Scores(NamedTuple):
    logits: torch.Tensor
    probs: torch.Tensor


class DictFeatureEmbedding(nn.Module):
    """Sparse features as a dict of id tensors -> a dict of pooled embeddings."""

    def __init__(self, features: dict[str, int], dim: int) -> None:
        super().__init__()
        self.tables = nn.ModuleDict({name: nn.EmbeddingBag(rows, dim, mode="sum") for name, rows in features.items()})

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: self.tables[name](ids) for name, ids in features.items()}


class JaggedSumPooling(nn.Module):
    """A jagged input (variable ids per sample) -> one pooled embedding per sample."""

    def __init__(self, rows: int, dim: int) -> None:
        super().__init__()
        self.table = nn.EmbeddingBag(rows, dim, mode="mean")

    def forward(self, jagged: Jagged) -> torch.Tensor:
        return self.table(jagged.values, jagged.offsets()[:-1])


class DotInteraction(nn.Module):
    """DLRM-style pairwise dot products between a dense vector and a list of sparse vectors."""

    def forward(self, dense: torch.Tensor, sparse: list[torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack([dense, *sparse], dim=1)
        dots = stacked @ stacked.transpose(1, 2)
        rows, cols = torch.triu_indices(stacked.shape[1], stacked.shape[1], offset=1)
        return torch.cat([dense, dots[:, rows, cols]], dim=1)


class CrossNet(nn.Module):
    """DCN cross layers: x_{l+1} = x0 * (W x_l + b) + x_l."""

    def __init__(self, dim: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for layer in self.layers:
            x = x0 * layer(x) + x
        return x


class TwoTower(nn.Module):
    """Dataclass in, dataclass out."""

    def __init__(self, dense: int, rows: int, dim: int) -> None:
        super().__init__()
        self.user = nn.Sequential(nn.Linear(dense, dim), nn.ReLU(), nn.Linear(dim, dim))
        self.item = nn.Embedding(rows, dim)

    def forward(self, batch: Batch) -> TowerOut:
        user = self.user(batch.dense)
        item = self.item(batch.ids)
        return TowerOut(user=user, item=item, score=(user * item).sum(-1) * batch.weight)


class ScoreHead(nn.Module):
    """NamedTuple out, keyword-only options in."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, *, temperature: float = 1.0) -> Scores:
        logits = self.proj(x).squeeze(-1) / temperature
        return Scores(logits=logits, probs=torch.sigmoid(logits))


class Ranker(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sparse = DictFeatureEmbedding({"user": 50, "item": 80}, 8)
        self.history = JaggedSumPooling(80, 8)
        self.bottom = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.interaction = DotInteraction()
        self.cross = CrossNet(14, 2)
        self.tower = TwoTower(4, 80, 8)
        self.head = ScoreHead(14)

    def forward(self, dense: torch.Tensor, features: dict[str, torch.Tensor], history: Jagged) -> Scores:
        pooled = self.sparse(features)
        hist = self.history(history)
        x = self.interaction(self.bottom(dense), [pooled["user"], pooled["item"], hist])
        towers = self.tower(Batch(dense=dense, ids=features["item"][:, 0], weight=0.5))
        x = self.cross(x) + towers.score.unsqueeze(-1)
        return self.head(x, temperature=2.0)


def drive_ranker(model: nn.Module) -> None:
    gen = torch.Generator().manual_seed(1)
    dense = torch.randn(4, 4, generator=gen)
    features = {"user": torch.randint(0, 50, (4, 2), generator=gen), "item": torch.randint(0, 80, (4, 3), generator=gen)}
    lengths = torch.tensor([2, 0, 3, 1])
    history = Jagged(torch.randint(0, 80, (int(lengths.sum()),), generator=gen), lengths)
    model(dense, features, history)


# --------------------------------------------------------------------------------------------
# torch.nn layers, driven through one model
# --------------------------------------------------------------------------------------------


class TorchZoo(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(12, 16)
        self.conv1d = nn.Conv1d(3, 4, kernel_size=3, padding=1)
        self.conv2d = nn.Conv2d(3, 4, kernel_size=3, stride=2, padding=1)
        self.deconv = nn.ConvTranspose2d(4, 2, kernel_size=2, stride=2)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2)
        self.groupnorm = nn.GroupNorm(2, 2)
        self.layernorm = nn.LayerNorm(16)
        self.rmsnorm = nn.RMSNorm(16, eps=1e-6)
        self.embedding = nn.Embedding(30, 16, padding_idx=0)
        self.bag = nn.EmbeddingBag(30, 16, mode="max")
        self.lstm = nn.LSTM(16, 8, num_layers=2, batch_first=True)
        self.gru = nn.GRU(16, 8, batch_first=True, bidirectional=True)
        self.mha = nn.MultiheadAttention(16, 4, batch_first=True)
        self.encoder_layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.2, batch_first=True)
        self.dropout = nn.Dropout(0.5)
        self.prelu = nn.PReLU(16)
        self.bilinear = nn.Bilinear(16, 16, 4)

    def forward(self, x: torch.Tensor, image: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        h = self.layernorm(self.linear(x))
        e = self.embedding(ids) + self.bag(ids).unsqueeze(1)
        seq = self.rmsnorm(e + h.unsqueeze(1))
        out, (hn, cn) = self.lstm(seq)
        g, _ = self.gru(seq)
        attn, _ = self.mha(seq, seq, seq, need_weights=False)
        enc = self.encoder_layer(self.dropout(attn), src_key_padding_mask=ids == 0)
        img = self.pool(self.bn(self.conv2d(image)))
        img = self.groupnorm(self.deconv(img))
        sig = self.conv1d(image.mean(-1))
        mixed = self.bilinear(self.prelu(enc.mean(1)), g.mean(1))
        return mixed.sum() + out.mean() + img.mean() + sig.mean() + hn.sum() + cn.sum()


def drive_zoo(model: nn.Module) -> None:
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 30, (2, 5), generator=gen)
    ids[1, -2:] = 0
    model(torch.randn(2, 12, generator=gen), torch.randn(2, 3, 8, 8, generator=gen), ids)


# --------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    build: Callable[[], nn.Module]
    drive: Callable[[nn.Module], None]
    targets: dict[str, str]  # label (the module type) -> target pattern (qualified name)
    train: bool = False
    max_calls: int = 1  # calls recorded per target (2 for prefill + one cached decode step)


def _hf_ids(vocab: int, batch: int = 2, seq: int = 7, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _hf(config_name: str, model_name: str, **config: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        cfg = getattr(transformers, config_name)(**config)
        return getattr(transformers, model_name)(cfg)
    return build


def _drive_ids(vocab: int, **kwargs: Any) -> Callable[[nn.Module], None]:
    def drive(model: nn.Module) -> None:
        ids = _hf_ids(vocab)
        mask = torch.ones_like(ids)
        mask[1, :2] = 0  # left padding: a real attention mask
        model(input_ids=ids, attention_mask=mask, **kwargs)
    return drive


def _cache_keyword(model: nn.Module) -> str:
    """transformers 5 renamed ``past_key_values`` to ``cache`` (the old name still works, with a warning)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def drive_prefill_decode(model: nn.Module) -> None:
    """A causal LM as people run it, caches on: prefill a left-padded batch, then one decode step
    on the cache the prefill returned (the cache is mutated in place by every layer)."""
    ids = _hf_ids(64)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    out = model(input_ids=ids, attention_mask=mask)
    step = out.logits[:, -1:].argmax(-1)
    model(input_ids=step, attention_mask=torch.cat([mask, torch.ones_like(step)], 1),
          **{_cache_keyword(model): out.past_key_values})


def drive_speech_decode(model: nn.Module) -> None:
    """Whisper: encode + decode a prompt (self- and cross-attention caches), then one cached step."""
    features = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(3))
    out = model(input_features=features, decoder_input_ids=torch.tensor([[1, 5, 6]]))
    model(encoder_outputs=(out.encoder_last_hidden_state,), decoder_input_ids=out.logits[:, -1:].argmax(-1),
          **{_cache_keyword(model): out.past_key_values})


def drive_generate(model: nn.Module) -> None:
    ids = _hf_ids(64, seq=5)
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)


# Small configurations with transformers' defaults otherwise (use_cache=True included).
_DEFAULT_LM = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
               "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_WHISPER = {"vocab_size": 64, "d_model": 32, "encoder_layers": 1, "decoder_layers": 2, "encoder_attention_heads": 4,
            "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "num_mel_bins": 8,
            "max_source_positions": 16, "max_target_positions": 32, "decoder_start_token_id": 1, **_TOKENS}

# Caches on (transformers' default): a prefill and a cached decode step recorded per target, the
# cache recorded on entry and after the call (docs/fidelity.md).
CACHE_SCENARIOS: list[Scenario] = [
    Scenario("cache-llama", _hf("LlamaConfig", "LlamaForCausalLM", **_DEFAULT_LM), drive_prefill_decode, max_calls=2,
             targets={"cache.LlamaForCausalLM": "LlamaForCausalLM", "cache.LlamaDecoderLayer": "model.layers.1",
                      "cache.LlamaAttention": "model.layers.0.self_attn"}),
    Scenario("cache-llama-train", _hf("LlamaConfig", "LlamaForCausalLM", **_DEFAULT_LM), drive_prefill_decode,
             max_calls=2, train=True, targets={"cache-train.LlamaDecoderLayer": "model.layers.0"}),
    Scenario("cache-gemma2", _hf("Gemma2Config", "Gemma2ForCausalLM", **_DEFAULT_LM, head_dim=8, sliding_window=4),
             drive_prefill_decode, max_calls=2,
             targets={"cache.Gemma2ForCausalLM": "Gemma2ForCausalLM", "cache.Gemma2DecoderLayer": "model.layers.0",
                      "cache.Gemma2Attention": "model.layers.1.self_attn"}),
    Scenario("cache-phi3", _hf("Phi3Config", "Phi3ForCausalLM", **_DEFAULT_LM), drive_prefill_decode, max_calls=2,
             targets={"cache.Phi3DecoderLayer": "model.layers.0", "cache.Phi3Attention": "model.layers.1.self_attn"}),
    Scenario("cache-falcon", _hf("FalconConfig", "FalconForCausalLM", vocab_size=64, hidden_size=32,
                                 num_hidden_layers=2, num_attention_heads=4, **_TOKENS),
             drive_prefill_decode, max_calls=2, targets={"cache.FalconDecoderLayer": "transformer.h.0"}),
    Scenario("cache-mamba", _hf("MambaConfig", "MambaForCausalLM", vocab_size=64, hidden_size=32, state_size=4,
                                num_hidden_layers=2, **_TOKENS),
             drive_prefill_decode, max_calls=2,
             targets={"cache.MambaForCausalLM": "MambaForCausalLM", "cache.MambaBlock": "backbone.layers.0",
                      "cache.MambaMixer": "backbone.layers.1.mixer"}),
    Scenario("cache-whisper", _hf("WhisperConfig", "WhisperForConditionalGeneration", **_WHISPER),
             drive_speech_decode, max_calls=2,
             targets={"cache.WhisperForConditionalGeneration": "WhisperForConditionalGeneration",
                      "cache.WhisperDecoderLayer": "model.decoder.layers.0",
                      "cache.WhisperAttention": "model.decoder.layers.1.encoder_attn"}),
    Scenario("generate-llama", _hf("LlamaConfig", "LlamaForCausalLM", **_DEFAULT_LM), drive_generate, max_calls=3,
             targets={"generate.LlamaForCausalLM": "LlamaForCausalLM", "generate.LlamaDecoderLayer": "model.layers.0"}),
]

_LM = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "use_cache": False,
       "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}

SCENARIOS: list[Scenario] = [
    Scenario("torch", TorchZoo, drive_zoo, train=True, targets={
        "nn.Linear": "linear", "nn.Conv1d": "conv1d", "nn.Conv2d": "conv2d", "nn.ConvTranspose2d": "deconv",
        "nn.BatchNorm2d": "bn", "nn.MaxPool2d": "pool", "nn.GroupNorm": "groupnorm", "nn.LayerNorm": "layernorm",
        "nn.RMSNorm": "rmsnorm", "nn.Embedding": "embedding", "nn.EmbeddingBag": "bag", "nn.LSTM": "lstm",
        "nn.GRU": "gru", "nn.MultiheadAttention": "mha", "nn.TransformerEncoderLayer": "encoder_layer",
        "nn.Dropout": "dropout", "nn.PReLU": "prelu", "nn.Bilinear": "bilinear",
    }),
    Scenario("ranker", Ranker, drive_ranker, train=True, targets={
        "DictFeatureEmbedding": "sparse", "JaggedSumPooling": "history", "DotInteraction": "interaction",
        "CrossNet": "cross", "TwoTower": "tower", "ScoreHead": "head",
    }),
    Scenario("llama", _hf("LlamaConfig", "LlamaModel", **_LM), _drive_ids(64), targets={
        "LlamaDecoderLayer": "layers.1", "LlamaAttention": "layers.0.self_attn", "LlamaMLP": "layers.0.mlp",
        "LlamaRMSNorm": "norm", "LlamaRotaryEmbedding": "rotary_emb",
    }),
    Scenario("mistral", _hf("MistralConfig", "MistralModel", **_LM, sliding_window=4), _drive_ids(64), targets={
        "MistralDecoderLayer": "layers.0",
    }),
    Scenario("qwen2", _hf("Qwen2Config", "Qwen2Model", **_LM), _drive_ids(64), targets={
        "Qwen2DecoderLayer": "layers.0", "Qwen2Attention": "layers.1.self_attn",
    }),
    Scenario("gemma", _hf("GemmaConfig", "GemmaModel", **_LM, head_dim=8), _drive_ids(64), targets={
        "GemmaDecoderLayer": "layers.0", "GemmaRMSNorm": "norm",
    }),
    Scenario("mixtral", _hf("MixtralConfig", "MixtralModel", **_LM, num_local_experts=4, num_experts_per_tok=2),
             _drive_ids(64), targets={"MixtralSparseMoeBlock": "layers.0.mlp"}),
    Scenario("gpt2", _hf("GPT2Config", "GPT2Model", vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                         use_cache=False, bos_token_id=1, eos_token_id=2, attn_pdrop=0.1, resid_pdrop=0.1),
             _drive_ids(64), train=True, targets={
                 "GPT2Block": "h.0", "GPT2Attention": "h.1.attn", "GPT2MLP": "h.1.mlp", "Conv1D": "h.0.mlp.c_fc",
             }),
    Scenario("bert", _hf("BertConfig", "BertModel", vocab_size=64, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=64, max_position_embeddings=64),
             _drive_ids(64), targets={"BertLayer": "encoder.layer.0", "BertEmbeddings": "embeddings",
                                      "BertPooler": "pooler"}),
    Scenario("t5", _hf("T5Config", "T5EncoderModel", vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                       num_heads=4, use_cache=False),
             _drive_ids(64), targets={"T5Block": "encoder.block.0", "T5LayerNorm": "encoder.final_layer_norm",
                                      "T5LayerFF": "encoder.block.1.layer.1"}),
    Scenario("opt", _hf("OPTConfig", "OPTModel", vocab_size=64, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32, use_cache=False,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2),
             _drive_ids(64), targets={"OPTDecoderLayer": "decoder.layers.0",
                                      "OPTLearnedPositionalEmbedding": "decoder.embed_positions"}),
    Scenario("gpt_neox", _hf("GPTNeoXConfig", "GPTNeoXModel", vocab_size=64, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64, use_cache=False),
             _drive_ids(64), targets={"GPTNeoXLayer": "layers.0"}),
]


SCENARIOS += CACHE_SCENARIOS


def labels() -> list[str]:
    return [label for scenario in SCENARIOS for label in scenario.targets]


def cache_labels() -> list[str]:
    return [label for scenario in CACHE_SCENARIOS for label in scenario.targets]
