"""Finding captures in a listing: filters by class, tag and age, and sort orders (``modulelens ls``).

Everything here works on :class:`~modulelens.repo.VersionInfo`, which a listing builds from
the per-name summaries: filtering and sorting read no capture file, so ``ls --class X`` on a repo
of thousands of versions costs what ``ls`` costs.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from modulelens.errors import UsageError

if TYPE_CHECKING:
    from modulelens.repo import VersionInfo

__all__ = ["SORT_KEYS", "VersionFilter", "parse_duration", "parse_since", "sort_versions"]

SORT_KEYS = ("name", "created", "size", "calls")


def parse_duration(text: str, option: str) -> float:
    """Seconds in ``"0"``, ``"90"``, ``"90s"``, ``"10m"``, ``"1h"``, ``"2d"``.

    Raises:
        UsageError: ``text`` is not such a duration (names ``option``).
    """
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise UsageError(f"{option}: {text!r} is not a duration (e.g. 0, 90s, 10m, 1h, 2d)") from None
    if not value >= 0:
        raise UsageError(f"{option}: {text!r} must not be negative")
    return value


def _timestamp(text: str) -> float | None:
    """POSIX seconds of an ISO 8601 time (``2026-11-30``, ``2026-11-30T10:02:54Z``); naive times are UTC."""
    try:
        parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def parse_since(text: str, *, now: float | None = None) -> float:
    """POSIX seconds of ``--since``: a duration back from ``now`` (``2d``) or an ISO date or time.

    Raises:
        UsageError: neither.
    """
    stamp = _timestamp(text)
    if stamp is not None:
        return stamp
    try:
        return (time.time() if now is None else now) - parse_duration(text, "--since")
    except UsageError:
        raise UsageError(f"--since: {text!r} is neither a duration (90m, 12h, 2d) nor a date "
                         "(2026-11-30, 2026-11-30T10:00)") from None


@dataclass(frozen=True)
class VersionFilter:
    """Which versions a listing keeps: all of the given conditions hold.

    Args:
        module_class: the module class, by name (``LlamaMLP``), glob (``Llama*``) or full path
            (``pkg.module:Class``; a glob too).
        tags: tags the version must all carry.
        since: POSIX seconds; only versions created at or after it.
    """

    module_class: str | None = None
    tags: tuple[str, ...] = ()
    since: float | None = None
    since_text: str | None = None

    @classmethod
    def from_options(cls, *, module_class: str | None, tags: Sequence[str], since: str | None) -> VersionFilter:
        """From ``ls``'s ``--class``, ``--tag`` and ``--since`` (raises :class:`UsageError` on a bad ``--since``)."""
        return cls(module_class=module_class or None, tags=tuple(tags),
                   since=None if since is None else parse_since(since), since_text=since)

    @property
    def active(self) -> bool:
        return self.module_class is not None or bool(self.tags) or self.since is not None

    def describe(self) -> str:
        """``--class LlamaMLP --tag nightly``, as the options were given."""
        parts = [f"--class {self.module_class}"] if self.module_class else []
        parts += [f"--tag {t}" for t in self.tags]
        parts += [f"--since {self.since_text}"] if self.since_text else []
        return " ".join(parts)

    def keeps(self, info: VersionInfo) -> bool:
        if self.module_class is not None and not _class_matches(self.module_class, info.module_class):
            return False
        if self.tags and not set(self.tags) <= set(info.tags):
            return False
        if self.since is not None:
            created = _timestamp(info.created) if info.created else None
            if created is None or created < self.since:
                return False
        return True


def _class_matches(wanted: str, module_class: str) -> bool:
    """``LlamaMLP``, ``Llama*`` match the class name; ``pkg.module:Class`` (or a glob of it) the whole path."""
    if not module_class:
        return False
    target = module_class if ":" in wanted else module_class.rpartition(":")[2]
    return fnmatch.fnmatchcase(target, wanted)


def sort_versions(versions: Sequence[VersionInfo], key: str) -> list[VersionInfo]:
    """``versions`` by ``name`` (then version), ``created`` (newest first), ``size`` or ``calls``
    (largest first; ties by name and version).

    Raises:
        UsageError: an unknown key.
    """
    if key not in SORT_KEYS:
        raise UsageError(f"--sort: {key!r} is not one of {', '.join(SORT_KEYS)}")
    by_name = sorted(versions, key=lambda v: (v.name, v.version))
    if key == "name":
        return by_name
    if key == "created":
        return sorted(by_name, key=lambda v: _timestamp(v.created) or 0.0, reverse=True)
    if key == "size":
        return sorted(by_name, key=lambda v: v.nbytes, reverse=True)
    return sorted(by_name, key=lambda v: v.calls, reverse=True)
