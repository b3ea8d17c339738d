"""Plain objects libraries pass to their modules' constructors, stored as their class and attributes.

sentence-transformers' word tokenizers (``WhitespaceTokenizer``, ``PhraseTokenizer``: the
``tokenizer`` of ``models.WordEmbeddings``) and kornia's ``ColorMap`` (the ``colormap`` of
``color.ApplyColorMap``) hold only plain data: a vocabulary, its index and stop words; a colormap's
name and its color table. Each is stored as its attributes, each through the codecs, and rebuilt
without ``__init__`` (``cls.__new__`` and the attributes set back), so a module built with one can be
rebuilt from its recorded arguments. tensordict's ``TensorDict`` (what torchrl's multi-agent nets and
``EnsembleModule`` stack their parameters into) is stored as its tensors by key, batch size and device.
Installed lazily (``format/values.py``) once the job imports the library; decoding accepts only the
registered class (and a tokenizer's subclasses).
"""

from __future__ import annotations

from typing import Any

from modulelens.format.values import attributes_of, rebuilt_from_attributes, register_codec


def install_sentence_transformers() -> None:
    try:
        from sentence_transformers.sentence_transformer.modules.tokenizer.word import WordTokenizer
    except ImportError:  # a sentence-transformers before 5 keeps it elsewhere: its tokenizers stay without a codec
        return

    register_codec(WordTokenizer, attributes_of, rebuilt_from_attributes, name="sentence_transformers.WordTokenizer")


def install_kornia() -> None:
    from kornia.color.colormap import ColorMap

    register_codec(ColorMap, attributes_of, rebuilt_from_attributes, name="kornia.ColorMap")



def _tensordict_parts(td: Any) -> dict[str, object]:
    """A TensorDict's tensors by key, its batch size and device, and which of its tensors are
    parameters (torchrl's multi-agent nets and ``EnsembleModule`` stack their parameters into one and
    hand it to ``TensorDictParams``, which registers a parameter as a parameter and a tensor as a buffer)."""
    import torch

    parameters = [list(key) if isinstance(key, tuple) else [key]
                  for key, value in td.items(include_nested=True, leaves_only=True)
                  if isinstance(value, torch.nn.Parameter)]
    return {"data": td.to_dict(), "batch_size": list(td.batch_size),
            "device": None if td.device is None else str(td.device), "parameters": parameters}


def _tensordict(cls: type, parts: dict[str, Any]) -> object:
    import torch

    td = cls(parts["data"], batch_size=parts["batch_size"], device=parts["device"])
    for key in parts.get("parameters", []):
        td.set(tuple(key), torch.nn.Parameter(td.get(tuple(key))))
    return td


def install_tensordict() -> None:
    from tensordict import TensorDict

    register_codec(TensorDict, _tensordict_parts, _tensordict, name="tensordict.TensorDict", subclasses=False)
