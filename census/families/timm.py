"""timm: every model module's smallest variant, plus a seeded sample of the other models.

``timm.list_modules()`` names the model families (98 in timm 1.0.31). Per module the smallest
variant is taken (a shortlist by size words in the name, ``SIZE_WORDS``, then the fewest
parameters counted on the meta device); then a seeded sample of the remaining models brings the
total to ``TOTAL``. Models over ``MAX_PARAMETERS`` are not drawn (the sample draws another).
``pretrained=False``; models that take ``img_size`` are built for 64 px, and the input is the
first of 64, 96, 128 px and the model's own default size that the model accepts.

timm imports torchvision names that cannot be installed next to the CPU torch here; both the
capturing and the replaying process use ``tests/support/timm_support.py`` / ``shims``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import torch
from torch import nn

from census.targets import CannotBuildError, CannotBuildInputsError, Job, Sample, Target

SHIMS = "tests/support/shims"
EXTRA_PATH = {"capture": [], "replay": [SHIMS]}  # replayed captures import timm, which needs the shim
TOTAL = 160
MAX_PARAMETERS = 30_000_000
SIZE_WORDS = ["atto", "femto", "pico", "nano", "xxxs", "xxs", "zepto", "xxtiny", "tiny", "xs", "mini", "micro",
              "small", "s", "b0", "lite0", "050", "075", "100", "18", "base"]


def _timm():  # type: ignore[no-untyped-def]
    from timm_support import import_timm

    return import_timm()


def _size_rank(name: str) -> tuple[int, int]:
    words = re.split(r"[_.-]", name)
    ranks = [SIZE_WORDS.index(w) for w in words if w in SIZE_WORDS]
    return (min(ranks) if ranks else len(SIZE_WORDS), len(name))


def _parameters(name: str) -> int:
    timm = _timm()
    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False)
    except Exception:
        return 1 << 62
    return sum(p.numel() for p in model.parameters())


def choose(sample: Sample) -> list[str]:
    timm = _timm()
    if sample.only:
        return [name for name in timm.list_models() if name in sample.only]
    modules = timm.list_modules()
    if sample.quick:
        modules = sample.pick(modules, str, quick_count=3)
    smallest = []
    for module in modules:
        names = sorted(timm.list_models(module=module), key=_size_rank)[:3]
        if names:
            smallest.append(min(names, key=_parameters))
    if sample.quick:
        return smallest
    rest = [m for m in timm.list_models() if m not in set(smallest)]
    random.Random(sample.seed).shuffle(rest)
    chosen = list(smallest)
    for name in rest:
        if len(chosen) >= max(TOTAL, sample.limit or 0):
            break
        if _parameters(name) <= MAX_PARAMETERS:
            chosen.append(name)
    return chosen


def _build(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        timm = _timm()
        count = _parameters(name)
        if count > MAX_PARAMETERS:
            raise CannotBuildError(f"{count / 1e6:.0f}M parameters (over the census's {MAX_PARAMETERS / 1e6:.0f}M)")
        try:
            return timm.create_model(name, pretrained=False, img_size=64)
        except TypeError:  # the model takes no img_size
            return timm.create_model(name, pretrained=False)
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
