"""What people say about a version after it was saved: its description and its tags.

A version's ``capture.json`` never changes (it is signed, and its payloads are named by it), but a
reviewer's words about it do: "the golden run before the refactor", a ``reviewed`` tag. They are
kept per name in ``names/<name>/notes.json`` (docs/repo-layout.md, "Notes")::

    {"notes": 1, "versions": {"3": {"description": "golden run before the refactor",
                                    "tags": ["demo", "reviewed"], "updated": "2026-12-06T06:02:16Z",
                                    "by": "alice@host"}}}

One file per name, not one per version, so a listing reads one more small file per name (not per
version) to show edited tags; it is changed with compare-and-swap (:meth:`Store.swap
<modulelens.repo.store.Store.swap>`), like an alias, so two editors never lose each other's words.
``tags``, once a version's tags are edited, is the whole list (a tag given at capture can be taken
off); a version never edited shows the tags it was captured with. The file may come from anyone (a
pulled repo), so it is checked like any stored metadata: an object of the shape above, bounded in
size, descriptions and tags plain text (a tag added after capture of :func:`validate_tag`'s
form); anything else is a
:class:`~modulelens.errors.CorruptCaptureError` naming the file.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from modulelens.errors import CorruptCaptureError, InvalidNameError, UsageError
from modulelens.repo.layout import NOTES_BYTES

FORMAT = 1
MAX_DESCRIPTION = 10_000  # characters of one description
MAX_TAGS = 64  # tags of one version
MAX_TAG_TEXT = 300  # characters of a stored tag (one given at capture may be any string)
_TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+=/@-]{0,63}")
# Control characters other than tab and newline: a description is shown on terminals and pages.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def validate_tag(tag: str) -> str:
    """A tag given after capture: a letter or digit, then up to 63 of letters, digits and ``._:+=/@-``.

    Raises:
        InvalidNameError: any other string.

    Example::

        validate_tag("reviewed"), validate_tag("run:2026-12")   # both fine
    """
    if not isinstance(tag, str) or not _TAG_RE.fullmatch(tag):
        raise InvalidNameError(f"invalid tag {str(tag)[:80]!r}: start with a letter or a digit, then up to 63 "
                               "letters, digits or ._:+=/@-")
    return tag


def same_description(given: str, stored: str) -> bool:
    """Whether ``given`` (a description as a form or a caller sent it back) is ``stored``: line
    endings and surrounding blank space aside (a browser sends a form's newlines as CRLF)."""
    return given.replace("\r\n", "\n").replace("\r", "\n").strip() == stored


def clean_description(text: str) -> str:
    """A description as stored: line endings made ``\\n``, surrounding blank space removed.

    Raises:
        UsageError: longer than :data:`MAX_DESCRIPTION` characters, or holding control characters.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    if len(text) > MAX_DESCRIPTION:
        raise UsageError(f"a description is at most {MAX_DESCRIPTION:,} characters, not {len(text):,}")
    if _CONTROL_RE.search(text):
        raise UsageError("a description is plain text: no control characters")
    return text


@dataclass(frozen=True)
class VersionNotes:
    """A version's description and edited tags.

    Attributes:
        description: what people wrote about it (``""``: nothing yet).
        tags: its tags as edited, or ``None`` when they were never edited (it has the tags it was
            captured with).
        updated: when they were last changed (UTC, ISO 8601; ``""``: never).
        by: who changed them last (``user@host``).
    """

    description: str = ""
    tags: tuple[str, ...] | None = None
    updated: str = ""
    by: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"description": self.description, "tags": None if self.tags is None else list(self.tags),
                "updated": self.updated, "by": self.by}

    @property
    def empty(self) -> bool:
        return not self.description and self.tags is None


def parse_notes(raw: bytes | None, where: str) -> dict[int, VersionNotes]:
    """A name's notes file, checked: version number -> its notes (``{}`` for no file).

    Raises:
        CorruptCaptureError: too big, not JSON, or not of the documented shape (the field is named).
    """
    if not raw:
        return {}
    if len(raw) > NOTES_BYTES:  # (a store refuses a larger file before reading it: read_limit)
        raise CorruptCaptureError(f"{where}: {len(raw):,} bytes, more than the {NOTES_BYTES:,} a notes file may hold")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise CorruptCaptureError(f"{where}: not JSON ({type(error).__name__})") from None
    if not isinstance(data, dict) or data.get("notes") != FORMAT or not isinstance(data.get("versions"), dict):
        raise CorruptCaptureError(f"{where}: not a notes file (expected {{\"notes\": {FORMAT}, \"versions\": {{...}}}})")
    found: dict[int, VersionNotes] = {}
    for key, entry in data["versions"].items():
        if not (isinstance(key, str) and key.isdigit() and len(key) < 19 and isinstance(entry, dict)):
            raise CorruptCaptureError(f"{where}: versions[{str(key)[:40]!r}]: expected a version number and an object")
        found[int(key)] = _entry(entry, f"{where}: versions[{key}]")
    return found


def checked_notes(notes: VersionNotes, where: str) -> VersionNotes:
    """``notes``, once each field has the form a notes file holds (notes copied in from elsewhere).

    Raises:
        CorruptCaptureError: a field that does not (named).
    """
    return _entry(notes.to_dict(), where)


def _entry(entry: Mapping[str, Any], where: str) -> VersionNotes:
    description, tags = entry.get("description", ""), entry.get("tags")
    updated, by = entry.get("updated", ""), entry.get("by", "")
    for label, value, limit in (("description", description, MAX_DESCRIPTION), ("updated", updated, 40),
                                ("by", by, 300)):
        if not isinstance(value, str) or len(value) > limit or _CONTROL_RE.search(value):
            raise CorruptCaptureError(f"{where}.{label}: expected plain text of at most {limit:,} characters")
    if tags is not None:
        if not isinstance(tags, list) or len(tags) > MAX_TAGS:
            raise CorruptCaptureError(f"{where}.tags: expected a list of at most {MAX_TAGS} tags")
        # (plain text, not validate_tag's form: a tag given at capture may be any string, and an
        # edit keeps the ones it does not take off)
        for i, tag in enumerate(tags):
            if not isinstance(tag, str) or not tag or len(tag) > MAX_TAG_TEXT or _CONTROL_RE.search(tag):
                raise CorruptCaptureError(f"{where}.tags[{i}]: expected plain text of 1 to {MAX_TAG_TEXT} characters")
        tags = tuple(tags)
    return VersionNotes(description, tags, updated, by)


def notes_json(notes: Mapping[int, VersionNotes]) -> bytes:
    """The bytes of a name's notes file (versions with nothing to say left out)."""
    versions = {str(number): {k: v for k, v in entry.to_dict().items() if v is not None}
                for number, entry in sorted(notes.items()) if not entry.empty}
    return json.dumps({"notes": FORMAT, "versions": versions}, indent=1, ensure_ascii=False).encode("utf-8")


def edited(current: VersionNotes, captured_tags: Iterable[str], *, description: str | None = None,
           add: Iterable[str] = (), remove: Iterable[str] = ()) -> VersionNotes:
    """``current`` with a new description and tags added or taken off (``captured_tags``: the tags
    the version was captured with, the starting list of its first edit), stamped now.

    Raises:
        InvalidNameError: a tag to add that is not of :func:`validate_tag`'s form.
        UsageError: a bad description, a tag to take off that it does not have, or more than
            :data:`MAX_TAGS` tags.
    """
    added = [validate_tag(tag) for tag in add]
    removed = set(remove)
    tags = current.tags
    if added or removed:
        base = list(current.tags if current.tags is not None else captured_tags)
        missing = sorted(removed - set(base))
        if missing:
            raise UsageError(f"no tag {missing[0]!r} to take off (its tags: {', '.join(base) or 'none'})")
        tags = tuple(dict.fromkeys(t for t in [*base, *added] if t not in removed))
        if len(tags) > MAX_TAGS:
            raise UsageError(f"a version has at most {MAX_TAGS} tags")
    text = current.description if description is None else clean_description(description)
    return replace(current, description=text, tags=tags, updated=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   by=_who())


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name in this environment (a container without /etc/passwd entry)
        user = "?"
    return f"{user}@{os.uname().nodename}"[:300]
