"""timm: every model family's smallest variant.

A family is the models of one timm module (``timm.list_modules()``) that share a name stem (the
name's first word without its digits, ``_stem``): ``resnet`` and ``seresnext`` in
``timm.models.resnet``, ``vit`` in ``vision_transformer``. That makes about 200 families of the
1,371 models of timm 1.0.31. Per family the variant taken is the smallest **by its name**
(``_size_rank``: size words such as atto/nano/tiny/small before base/large, then the smaller
numbers, then the shorter name), so listing costs no model construction; its parameters are
counted on the meta device when it is built. A smallest variant still over ``MAX_PARAMETERS`` is
built with its common size arguments overridden (``SHRINK``: fewer, narrower blocks), as the
transformers family shrinks configs; one that takes none of them is reported as not built, with
its count. The whole census can add a seeded
sample of other small-named models (``--limit`` over the family count).

``pretrained=False``; models that take ``img_size`` are built for 64 px, and the input is the first
of 64, 96, 128 px and the model's own default size that the model accepts.

timm imports torchvision names that cannot be installed next to the CPU torch here; both the
capturing and the replaying process use ``tests/support/timm_support.py`` / ``shims``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.targets import CannotBuildError, CannotBuildInputsError, Job, Sample, Target

SHIMS = "tests/support/shims"
EXTRA_PATH = {"capture": [], "replay": [SHIMS]}  # replayed captures import timm, which needs the shim
MAX_PARAMETERS = 30_000_000
# a family whose smallest variant is over MAX_PARAMETERS: its common size arguments overridden
# (ViT-likes: depth, width and heads; ResNet-likes: one block per stage), the first that fits
SHRINK: list[dict[str, Any]] = [{"depth": 2, "embed_dim": 64, "num_heads": 2}, {"layers": [1, 1, 1, 1]},
                                {"depths": [1, 1, 1, 1]}]
# smallest first; a name without one ranks as "base"
SIZE_WORDS = ["atto", "zepto", "femto", "pico", "nano", "wee", "pwee", "xxxs", "xxs", "xxtiny", "xtiny", "tiny", "ti",
              "xs", "xsmall", "mini", "micro", "little", "lite", "t0", "s0", "a0", "b0", "m0", "mci0", "t1", "s1",
              "small", "s", "t", "medium", "m", "base", "b", "l", "large", "xl", "huge", "h", "giant", "g", "gigantic",
              "enormous"]
# the first word of these names is a prefix, not the family (tf_efficientnet, legacy_seresnet, ...)
PREFIXES = {"tf", "legacy", "test", "gc", "ese", "eca", "dm"}


def _timm():  # type: ignore[no-untyped-def]
    from timm_support import import_timm

    return import_timm()


def _stem(name: str) -> str:
    words = name.split("_")
    first = words[0] if words[0] not in PREFIXES or len(words) == 1 else f"{words[0]}_{words[1]}"
    return re.sub(r"\d.*", "", first) or first


def _size_rank(name: str) -> tuple[int, list[int], int, str]:
    base = SIZE_WORDS.index("base")
    ranks = [SIZE_WORDS.index(w) for w in map(_size_word, re.split(r"[_.-]", name)) if w in SIZE_WORDS]
    numbers = [int(n) for n in re.findall(r"\d+", name)]
    return (min(ranks) if ranks else base, numbers, len(name), name)


def _size_word(word: str) -> str:
    """The size word in a name part: "t0" and "tiny" as they are, "ti16"/"s24" -> "ti"/"s", "128s" -> "s"."""
    if word in SIZE_WORDS:
        return word
    match = re.fullmatch(r"([a-z]+)\d+|\d+([a-z]+)", word)
    return next((g for g in match.groups() if g), word) if match else word


def families() -> dict[tuple[str, str], list[str]]:
    """(timm module, name stem) -> its model names, smallest by name first."""
    timm = _timm()
    found: dict[tuple[str, str], list[str]] = {}
    for module in timm.list_modules():
        for name in timm.list_models(module=module):
            found.setdefault((module, _stem(name)), []).append(name)
    return {key: sorted(names, key=_size_rank) for key, names in sorted(found.items())}


def choose(sample: Sample) -> list[str]:
    timm = _timm()
    if sample.only:
        return [name for name in timm.list_models() if name in sample.only]
    groups = families()
    smallest = [names[0] for names in groups.values()]
    if sample.quick:
        return sample.pick(smallest, str, quick_count=3)
    extra = (sample.limit or 0) - len(smallest)
    if extra <= 0:
        return smallest
    # a seeded sample of the other variants whose names rank below "base" (small by name)
    others = [n for names in groups.values() for n in names[1:] if _size_rank(n)[0] < SIZE_WORDS.index("base")]
    random.Random(sample.seed).shuffle(others)
    return smallest + sorted(others[:extra])


def _parameters(timm, name: str, overrides: dict[str, Any]) -> int:  # type: ignore[no-untyped-def]
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, **overrides)
    return sum(p.numel() for p in model.parameters())


def _build(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        timm = _timm()
        sizes = []
        for overrides in ({}, *SHRINK):
            try:
                count = _parameters(timm, name, overrides)
            except Exception:  # the model takes no such argument
                continue
            sizes.append(f"{count / 1e6:.0f}M{' with ' + str(overrides) if overrides else ''}")
            if count <= MAX_PARAMETERS:
                break
        else:
            raise CannotBuildError(f"over the census's {MAX_PARAMETERS / 1e6:.0f}M parameters: {'; '.join(sizes)}")
        try:
            return timm.create_model(name, pretrained=False, img_size=64, **overrides)
        except Exception:  # the model takes no img_size, or not 64 px (window sizes): its default size
            return timm.create_model(name, pretrained=False, **overrides)
    return build


def _job(model: nn.Module) -> Job:
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    channels, *default = cfg.get("input_size", (3, 224, 224))
    errors = []
    for side in dict.fromkeys([64, 96, 128, *default[:1]]):
        x = torch.randn(2, channels, side, side, generator=torch.Generator().manual_seed(4))
        try:
            with torch.no_grad():
                model(x)
        except Exception as error:
            errors.append(f"{side} px: {type(error).__name__}: {str(error)[:200]}")
            continue
        return lambda m, x=x: m(x)
    raise CannotBuildInputsError("no input size was accepted: " + " | ".join(errors[-2:]))


def targets(sample: Sample) -> list[Target]:
    return [Target(name, _build(name), _job) for name in choose(sample)]
