"""What a census family yields: targets to build, run and capture."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from torch import nn

Job = Callable[[nn.Module], None]
T = TypeVar("T")


@dataclass
class Target:
    """One architecture / class of a family.

    ``build`` makes the module (run under ``modulelens.track_init()``); ``job(model)`` returns the
    function that runs it the way its users do (it may probe the model, without capture, to pick
    inputs that it accepts). ``calls`` is how many calls of each captured module are recorded
    (2 for a prefill and a cached decode step). ``submodules(model)`` names what is captured
    besides the root (label -> qualified name; default: ``census.rules.by_rule``).
    """

    name: str
    build: Callable[[], nn.Module]
    job: Callable[[nn.Module], Job]
    calls: int = 1
    submodules: Callable[[nn.Module], dict[str, str]] | None = None
    note: str = ""


class CannotBuildError(Exception):
    """A target the family could not make: raised from ``build`` with the reason."""


class CannotBuildInputsError(Exception):
    """A target whose inputs the family could not make: raised from ``job`` with the reason."""


@dataclass(frozen=True)
class Sample:
    """How much of a family to run: ``quick`` (a few seeded targets), a ``limit`` (a seeded sample
    of at most that many), or everything."""

    quick: bool = False
    seed: int = 0
    limit: int | None = None
    only: frozenset[str] = field(default_factory=frozenset)

    def pick(self, items: Sequence[T], key: Callable[[T], str], quick_count: int) -> list[T]:
        """The items this sample runs, in their original order (a seeded choice, stable per seed)."""
        if self.only:
            return [item for item in items if key(item) in self.only]
        count = quick_count if self.quick else self.limit
        if count is None or count >= len(items):
            return list(items)
        chosen = set(random.Random(self.seed).sample(range(len(items)), count))
        return [item for index, item in enumerate(items) if index in chosen]
