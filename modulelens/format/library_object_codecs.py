"""Plain objects libraries pass to their modules' constructors, stored as their class and attributes.

sentence-transformers' word tokenizers (``WhitespaceTokenizer``, ``PhraseTokenizer``: the
``tokenizer`` of ``models.WordEmbeddings``) and kornia's ``ColorMap`` (the ``colormap`` of
``color.ApplyColorMap``) hold only plain data: a vocabulary, its index and stop words; a colormap's
name and its color table. Each is stored as its attributes, each through the codecs, and rebuilt
without ``__init__`` (``cls.__new__`` and the attributes set back), so a module built with one can be
rebuilt from its recorded arguments. Installed lazily (``format/values.py``) once the job imports the
library; decoding accepts only the registered class and its subclasses.
"""

from __future__ import annotations

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
