"""sentence-transformers: embedding models run through ``encode`` and ``predict``, and every module
class of ``sentence_transformers.models``, from configs (no downloads).

A tiny BERT (width 16, one layer, a 20-word WordPiece vocabulary) is written once to a folder of
its own (``_model_dir``: under the system's temporary folder, as a user's local model folder;
replays read it from there too), with and without a one-label classification head.
``SentenceTransformer`` (Transformer, Pooling, Normalize, as ``sentence-transformers`` builds a
model from a plain transformer) is run the way users run it, ``model.encode(sentences)``;
``CrossEncoder`` through ``model.predict(pairs)``. Captured: the model and its modules by rule.
The classes of ``sentence_transformers.models`` are built from their signature by name
(``TYPICAL``, ``FACTORIES``: the vocabulary, a tokenizer) and called as a ``SentenceTransformer``
calls its modules: with the features dictionary (token embeddings and their mask, a sentence
embedding, every layer's embeddings, token ids).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from census.construct import construct, exported, first_accepted
from census.targets import CannotBuildError, Job, Sample, Target

WIDTH, LAYERS, TOKENS = 16, 1, 5
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the a cat dog sat on mat runs fast slow red blue is was".split()]
SENTENCES = ["the cat sat on the mat", "a dog runs fast", "the red mat is blue"]


def _model_dir(head: bool = False) -> str:
    """The tiny BERT's folder (made once; concurrent makers each write a folder and rename it into place)."""
    import transformers

    folder = Path(tempfile.gettempdir()) / "modulelens-census" / f"st-bert-{WIDTH}{'-head' if head else ''}"
    if (folder / "config.json").exists():
        return str(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=folder.parent))
    (scratch / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(scratch / "vocab.txt")).save_pretrained(scratch)
    config = transformers.BertConfig(vocab_size=len(WORDS), hidden_size=WIDTH, num_hidden_layers=LAYERS,
                                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=64,
                                     num_labels=1)
    torch.manual_seed(0)
    (transformers.BertForSequenceClassification if head else transformers.BertModel)(config).save_pretrained(scratch)
    try:
        os.rename(scratch, folder)
    except OSError:  # another process made it first
        shutil.rmtree(scratch, ignore_errors=True)
    return str(folder)


def _st():  # type: ignore[no-untyped-def]
    import sentence_transformers

    return sentence_transformers


def _sentence_transformer() -> nn.Module:
    models = _st().models
    transformer = models.Transformer(_model_dir())
    return _st().SentenceTransformer(modules=[transformer, models.Pooling(WIDTH), models.Normalize()], device="cpu")


def _cross_encoder() -> nn.Module:
    return _st().CrossEncoder(_model_dir(head=True), device="cpu")


def _tokenizer() -> Any:
    import transformers

    return transformers.BertTokenizerFast.from_pretrained(_model_dir())


TYPICAL: dict[str, Any] = {
    "word_embedding_dimension": WIDTH, "in_features": WIDTH, "out_features": 8, "dimension": WIDTH,
    "in_word_embedding_dimension": WIDTH, "hidden_dim": 8, "num_hidden_layers": LAYERS, "embedding_dim": WIDTH,
    "word_weights": {w: 1.0 for w in WORDS}, "vocab": WORDS, "embedding_dimension": WIDTH, "in_embedding_dimension": WIDTH,
}
SIZES: dict[str, Any] = {"embedding_dim": WIDTH}  # StaticEmbedding: a width where no weights are given
FACTORIES: dict[str, Callable[[], Any]] = {
    "model_name_or_path": _model_dir,
    "tokenizer": lambda: __import__("tokenizers").Tokenizer.from_file(str(Path(_model_dir()) / "tokenizer.json")),
    "embedding_weights": lambda: torch.randn(len(WORDS), WIDTH, generator=torch.Generator().manual_seed(18)),
}
CLASS_FACTORIES: dict[str, dict[str, Callable[[], Any]]] = {
    "WordEmbeddings": {"tokenizer": lambda: _st().models.tokenizer.WhitespaceTokenizer(WORDS)},
}
NOT_TARGETS = {
    "Asym": "routes inputs to other modules by key (a container; ``Router`` replaces it)",
    "Router": "routes inputs to other modules by task (a container)",
    "CLIPModel": "loads a CLIP checkpoint by name (a download)",
    "InputModule": "a base class", "Module": "a base class",
}


def _features() -> dict[str, Any]:
    """A features dictionary as ``SentenceTransformer`` passes from module to module."""
    g = torch.Generator().manual_seed(19)
    ids = torch.randint(5, len(WORDS), (2, TOKENS), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones(2, TOKENS, dtype=torch.long),
            "token_type_ids": torch.zeros(2, TOKENS, dtype=torch.long),
            "token_embeddings": torch.randn(2, TOKENS, WIDTH, generator=g),
            "sentence_embedding": torch.randn(2, WIDTH, generator=g),
            "all_layer_embeddings": [torch.randn(2, TOKENS, WIDTH, generator=g) for _ in range(LAYERS + 1)],
            "sentence_lengths": torch.tensor([TOKENS, TOKENS - 2])}


def _build_module(name: str, cls: type[nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        if name in NOT_TARGETS:
            raise CannotBuildError(f"not a target: {NOT_TARGETS[name]}")
        factories = {**FACTORIES, **CLASS_FACTORIES.get(name, {})}
        return construct(cls, TYPICAL, factories, {}, SIZES, "census/families/sentence_transformers.py TYPICAL")
    return build


def _module_job(model: nn.Module) -> Job:
    return first_accepted(model, [lambda: (_features(),)])


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], Job]]] = {
    "SentenceTransformer": (_sentence_transformer, lambda _m: lambda m: m.encode(SENTENCES, convert_to_tensor=True)),
    "CrossEncoder": (_cross_encoder, lambda _m: lambda m: m.predict([(SENTENCES[0], SENTENCES[1]),
                                                                      (SENTENCES[0], SENTENCES[2])])),
}


def targets(sample: Sample) -> list[Target]:
    classes = exported(["sentence_transformers.models"])
    names = sample.pick([*MODELS, *(f"models.{n}" for n in classes)], str, quick_count=2)
    found = []
    for name in names:
        if name in MODELS:
            found.append(Target(name, *MODELS[name]))
        else:
            key = name.removeprefix("models.")
            found.append(Target(name, _build_module(key, classes[key]), _module_job,
                                submodules=lambda _m: {"model": ""}))
    return found
