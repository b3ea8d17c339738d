"""Capture names, versions and aliases: parsing and validation (no path can escape the repo)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from modulelens.errors import InvalidNameError

# A name is one or more "/"-separated segments; each starts with a letter, a digit or "_", so "."
# and ".." can never appear as a segment and nothing can traverse out of the repo. "_" because a
# submodule's capture is named by its module path, and attributes such as EfficientNet's
# ``_blocks`` start with one (a name is stored as one quoted folder, so no segment is a path).
_SEGMENT = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}"
_NAME_RE = re.compile(rf"{_SEGMENT}(/{_SEGMENT})*")
_ALIAS_RE = re.compile(r"[A-Za-z][A-Za-z0-9._-]{0,63}")
_VERSION_RE = re.compile(r"v([1-9][0-9]*)")
LATEST = "latest"


def validate_name(name: str) -> str:
    if not isinstance(name, str) or len(name) > 512 or not _NAME_RE.fullmatch(name):
        raise InvalidNameError(
            f"invalid capture name {name!r}: use letters, digits, '.', '_', '-' in '/'-separated "
            "segments that start with a letter, a digit or '_'"
        )
    return name


def validate_alias(alias: str) -> str:
    if not _ALIAS_RE.fullmatch(alias or "") or re.fullmatch(r"v[0-9]+", alias):
        raise InvalidNameError(
            f"invalid alias {alias!r}: start with a letter, then letters, digits, '.', '_', '-' "
            "(and not of the form vN)"
        )
    return alias


_REPORT_FILE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.json")


def validate_report_file(filename: str) -> str:
    """A report's file name (copied between repos, so it must not name a path)."""
    if not _REPORT_FILE_RE.fullmatch(filename or ""):
        raise InvalidNameError(f"invalid report file name {filename!r}")
    return filename


@dataclass(frozen=True)
class Ref:
    """A parsed ``name[:vN|:alias]``; ``selector`` is ``None`` (latest), ``"v3"`` or an alias."""

    name: str
    selector: str | None = None

    @property
    def version(self) -> int | None:
        match = _VERSION_RE.fullmatch(self.selector or "")
        return int(match.group(1)) if match else None

    def __str__(self) -> str:
        return self.name if self.selector is None else f"{self.name}:{self.selector}"


def parse_ref(text: str) -> Ref:
    name, sep, selector = text.partition(":")
    validate_name(name)
    if not sep:
        return Ref(name)
    if _VERSION_RE.fullmatch(selector) or selector == LATEST:
        return Ref(name, selector)
    return Ref(name, validate_alias(selector))
