"""What every page shows the same way: the limits that keep a page bounded, the paging of long
lists, and stored values made into text and numbers.

Every page is bounded whatever the capture holds (docs/ui.md, "Limits"): long lists are shown a
page at a time (versions, calls, a call's leaves, parameters, reports) with a pager, and what is
cut is counted on the page ("20 of 50,000 calls"), never dropped silently. Fields a capture or a
received report may hold in any type are turned into text here (:func:`as_text`), so an odd value
shows as what it is instead of failing the page; numbers go through the one formatter,
:func:`modulelens.format.human.human_number` (``speedup 0.69x``, never ``0.6895053317060889``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from modulelens.errors import UsageError
from modulelens.format.human import human_bytes, human_number
from modulelens.format.reports import is_number
from modulelens.interfaces.value_text import python_like

# The limits that keep every page under a few MiB and a second or two whatever a capture holds
# (benchmarks/bench_ui.py: a 50,000-call capture once rendered 80 MiB of HTML in 74 s, a
# million-leaf call 117 MiB, 3,000 reports took 61 s).
PER_PAGE = 500  # versions on a repo page
MAX_PER_PAGE = 2_000  # the most a repo page shows (per_page=all)
CALLS_PER_PAGE = 20  # calls on a capture page
LEAVES_PREVIEW = 16  # leaves of each of a call's trees on the capture page (the call's own page has them all)
LEAVES_PER_PAGE = 500  # leaves of one tree on a call's page
PARAMETERS_PER_PAGE = 500  # parameters and buffers on a capture page
# Values a capture page samples for the statistics and histograms of its parameters, shared among
# them: each reads at most tensor_info.SAMPLE_ELEMENTS, fewer when the page shows more than 32
# tensors (what a 1 GiB capture of 16 Linear(4096, 4096) shows). Summarising a sample costs ~5 ms
# per 262,144 values here, so a 4 GiB capture's 128 tensors took 0.8 s cold at the full sample each
# against issue 37's 300 ms (benchmarks/bench_ui.py --gib 4); its page costs what the 1 GiB one does.
PAGE_SAMPLE_ELEMENTS = 1 << 23
REPORTS_PER_PAGE = 20  # reports on a reports page (and in the saved file)
REPORTS_LISTED = 10  # newest reports named on the capture page
PLOTTED_PROFILES = 50  # newest profile reports in the history figure
SWEEP_PLOTS = 3  # profile reports on a page whose sweep is drawn (matplotlib: ~0.3 s each)
REPORT_ROWS = 200  # rows of each table of a report (a verify report of 50,000 calls)
REPORT_JSON = 20_000  # characters of a report's stored JSON shown
LISTED = 50  # warnings, shape-only tensors, tags, arguments, notes... named in a list
TEXT_LIMIT = 2_000  # characters of one shown value (environment, metadata, constructor, a call's value)
SOURCE_LIMIT = 256 * 1024  # characters of one stored source file
SOURCES_SHOWN = 20  # stored source files shown
DIFF_CALLS = 64  # calls of each version pooled into a diff's input/output statistics
DIFF_LEAVES = 256  # leaves of each of those calls
DIFF_ROWS = 500  # rows of each diff table
STANDALONE_HISTOGRAMS = 200  # call tensors whose histogram is drawn into a saved file
DIFF_OVERLAYS = 12  # rows of each diff table whose overlaid histograms are drawn in (the others on a click)
PICKER_OPTIONS = 2_000  # versions offered by the diff picker (a typed ref reaches the others)
VERSIONS_PER_PAGE = 20  # versions on a name's page (and in its timeline)
TIMELINE_REPORTS = 5  # reports of each of those versions in the timeline (the reports page has them all)



# ------------------------------------------------------------------------------------------ paging


@dataclass(frozen=True)
class Window:
    """Page ``page`` (from 1) of ``total`` items, ``per_page`` at a time: items ``[start, stop)``."""

    total: int
    page: int
    per_page: int

    @classmethod
    def of(cls, total: int, page: int, per_page: int) -> Window:
        """The window of ``page``, clamped to the pages there are (page 9 of 3 is page 3)."""
        pages = max(1, math.ceil(total / per_page))
        return cls(total, min(max(page, 1), pages), per_page)

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.per_page))

    @property
    def start(self) -> int:
        return (self.page - 1) * self.per_page

    @property
    def stop(self) -> int:
        return min(self.start + self.per_page, self.total)

    def links(self, href: Callable[[int], str]) -> list[tuple[str, str | None]]:
        """The pager: ``(label, href)`` for first, previous, nearby, next and last pages (``None``:
        the current page); empty when everything fits on one page. At most a dozen links, however
        many pages there are."""
        if self.pages == 1:
            return []
        near = range(max(1, self.page - 3), min(self.pages, self.page + 3) + 1)
        shown = sorted({1, *near, self.pages})
        links: list[tuple[str, str | None]] = []
        if self.page > 1:
            links.append(("‹ previous", href(self.page - 1)))
        last = 0
        for p in shown:
            if p > last + 1:
                links.append(("…", None))
            links.append((str(p), None if p == self.page else href(p)))
            last = p
        if self.page < self.pages:
            links.append(("next ›", href(self.page + 1)))
        return links

    def counted(self, noun: str) -> str:
        """``"20 of 50,000 calls (21-40)"``, or ``"3 calls"`` when they all fit."""
        if self.pages == 1:
            return f"{self.total:,} {noun}"
        return f"{self.stop - self.start:,} of {self.total:,} {noun} ({self.start + 1:,}-{self.stop:,})"


def page_param(params: Mapping[str, str], key: str) -> int:
    """A page number from a URL's query (``1`` when absent).

    Raises:
        UsageError: not a positive number.
    """
    text = params.get(key) or ""
    if not text:
        return 1
    if not text.isdigit() or not 0 < int(text) < 10**9:
        raise UsageError(f"{key} must be a page number (1, 2, ...), not {text[:40]!r}")
    return int(text)


def href_with(path: str, params: Mapping[str, object], **changes: object) -> str:
    """``path`` with ``params`` updated by ``changes``; ``None`` values (defaults) left out."""
    merged = {k: v for k, v in {**params, **changes}.items() if v is not None}
    return path + ("?" + urlencode(merged) if merged else "")


def page_in_link(number: int) -> int | None:
    """A page number for a link: ``None`` (left out) for the first page."""
    return number if number > 1 else None


def as_text(value: object, limit: int = TEXT_LIMIT) -> str:
    """Any stored value as one line of text, at most ``limit`` characters (and says so when cut)."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = python_like(value)
        except RecursionError:  # a value nested too deep for the renderer: name it
            text = f"<a {type(value).__name__} nested too deeply to show>"
    if len(text) > limit:
        return text[:limit] + f"… ({len(text) - limit:,} more characters not shown)"
    return text


def listed(items: Sequence[object], limit: int = LISTED) -> list[str]:
    """The first ``limit`` items as text, and a line counting the rest."""
    shown = [as_text(item, 300) for item in items[:limit]]
    if len(items) > limit:
        shown.append(f"… and {len(items) - limit:,} more")
    return shown


def real_number(value: object) -> float | int | None:
    """A real number from stored data, else ``None`` (a string, a list, a bool are not drawn as numbers)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def mapping_or_empty(value: object) -> dict[str, Any]:
    """A stored object, or ``{}`` when the value is of another type."""
    return value if isinstance(value, dict) else {}


def objects_in(value: object) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def shown_pairs(value: object) -> list[tuple[str, str]]:
    """A stored mapping (environment, settings, user metadata) as sorted ``(key, text)`` rows, bounded."""
    if not isinstance(value, Mapping):
        return [("(value)", as_text(value))] if value else []
    items = sorted(value.items(), key=lambda kv: str(kv[0]))
    rows = [(as_text(k, 200), as_text(v)) for k, v in items[:LISTED * 4]]
    if len(items) > LISTED * 4:
        rows.append(("…", f"{len(items) - LISTED * 4:,} more entries not shown"))
    return rows


def shown_number(value: object, unit: str = "") -> str:
    """A report's number as text: a real number formatted, ``nan``/``inf`` as they are, anything else ``-``."""
    number = real_number(value)
    if number is not None:
        return human_number(number, unit)
    return str(value) if is_number(value) else "-"  # nan, inf as they are


def shown_ms(value: object) -> str:
    """A duration stored in milliseconds, with its unit (``1.23 ms``; ``2.5 s`` from a second on)."""
    number = real_number(value)
    if number is None:
        return shown_number(value)
    return human_number(number / 1000, "s") if abs(number) >= 1000 else human_number(number, "ms")


def shown_ratio(value: object) -> str:
    """A ratio as ``0.69x`` (the one formatter's three significant digits)."""
    number = real_number(value)
    return f"{human_number(number)}x" if number is not None else shown_number(value)


def shown_percent(value: object) -> str:
    number = real_number(value)
    return f"{human_number(number)}%" if number is not None else shown_number(value)


def shown_bytes(value: object) -> str:
    number = real_number(value)
    return human_bytes(number) if number is not None else shown_number(value)


_STAMP = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z")  # a report's "created" (tools' stamp)


def when(stamp: object) -> str:
    """A stored time as ``2026-12-06 06:02:16Z`` (versions write ISO 8601, reports a compact stamp),
    so the timeline sorts and reads one way; anything else as bounded text."""
    text = as_text(stamp, 40) if stamp is not None else ""
    found = _STAMP.fullmatch(text)
    if found:
        year, month, day, hour, minute, second = found.groups()
        return f"{year}-{month}-{day} {hour}:{minute}:{second}Z"
    return text.replace("T", " ", 1) if re.fullmatch(r"\d{4}-\d{2}-\d{2}T[\d:.]+Z?", text) else text
