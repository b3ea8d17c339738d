"""Plain objects libraries pass to their modules' constructors, stored as their class and attributes.

sentence-transformers' word tokenizers (``WhitespaceTokenizer``, ``PhraseTokenizer``: the
``tokenizer`` of ``models.WordEmbeddings``) and kornia's ``ColorMap`` (the ``colormap`` of
``color.ApplyColorMap``) hold only plain data: a vocabulary, its index and stop words; a colormap's
name and its color table. Each is stored as its attributes, each through the codecs, and rebuilt
without ``__init__`` (``cls.__new__`` and the attributes set back), so a module built with one can be
rebuilt from its recorded arguments. tensordict's ``TensorDict`` (what torchrl's multi-agent nets and
``EnsembleModule`` stack their parameters into) is stored as its tensors by key, batch size and device.
gymnasium's spaces (a stable-baselines3 policy's observation and action spaces) are stored as their
constructor arguments and rebuilt by calling that space's class; stable-baselines3's learning-rate
schedules (a policy's ``lr_schedule``) as their attributes. Installed lazily (``format/values.py``)
once the job imports the library; decoding accepts only the registered class (and a tokenizer's
subclasses).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from modulelens.errors import UnsupportedValueError
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


# ---------------------------------------------------------------------------------------------- RL

def _numeric_dtype(name: object) -> object:
    """A numpy dtype from its recorded name, only a numeric one (what a space's bounds hold)."""
    import numpy as np

    dtype = np.dtype(str(name))
    if dtype.kind not in "biuf":
        raise UnsupportedValueError(f"a gymnasium space of dtype {dtype} (only bool, integer and float spaces are stored)")
    return dtype


def _space_parts(space: Any) -> dict[str, object]:
    """A space's constructor arguments (its bounds are numpy arrays: the numpy codec stores them)."""
    from gymnasium import spaces

    kind = type(space)
    if kind is spaces.Box:
        return {"low": space.low, "high": space.high, "dtype": space.dtype.str}
    if kind is spaces.Discrete:
        return {"n": int(space.n), "start": int(space.start)}
    if kind is spaces.MultiDiscrete:
        return {"nvec": space.nvec, "start": space.start, "dtype": space.dtype.str}
    if kind is spaces.MultiBinary:
        return {"n": space.n if isinstance(space.n, int) else list(space.n)}
    if kind is spaces.Dict:
        return {"spaces": dict(space.spaces)}
    return {"spaces": list(space.spaces)}  # spaces.Tuple


def _space(cls: type, parts: dict[str, Any]) -> object:
    from gymnasium import spaces

    build: Callable[..., object] = cls  # (one of the registered space classes: the codec accepts no other)
    if cls is spaces.Box:
        return build(low=parts["low"], high=parts["high"], dtype=_numeric_dtype(parts["dtype"]))
    if cls is spaces.Discrete:
        return build(int(parts["n"]), start=int(parts["start"]))
    if cls is spaces.MultiDiscrete:
        return build(parts["nvec"], dtype=_numeric_dtype(parts["dtype"]), start=parts["start"])
    if cls is spaces.MultiBinary:
        return build(parts["n"])
    return build(parts["spaces"])  # Dict (a dict of spaces), Tuple (a list of them)


#: the spaces a policy's constructor takes (observation and action spaces), each by exact class
GYMNASIUM_SPACES = ("Box", "Discrete", "MultiDiscrete", "MultiBinary", "Dict", "Tuple")


def install_gymnasium() -> None:
    from gymnasium import spaces

    for name in GYMNASIUM_SPACES:
        register_codec(getattr(spaces, name), _space_parts, _space, name=f"gymnasium.{name}", subclasses=False)


#: stable-baselines3's learning-rate schedules (a policy's ``lr_schedule``): plain objects of numbers
SB3_SCHEDULES = ("ConstantSchedule", "FloatSchedule", "LinearSchedule")


def install_stable_baselines3() -> None:
    from stable_baselines3.common import utils

    for name in SB3_SCHEDULES:
        schedule = getattr(utils, name, None)
        if isinstance(schedule, type):  # (before 2.4 the schedules were closures: those stay without a codec)
            register_codec(schedule, attributes_of, rebuilt_from_attributes, name=f"stable_baselines3.{name}",
                           subclasses=False)
