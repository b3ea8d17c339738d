"""What each page shows, as plain data for its template: the repo listing, a capture, one of its
calls, its reports, a diff of two versions. The server's routes and ``modulelens report`` (the
self-contained file) build the same contexts, so the saved file is the page.

Every page is bounded whatever the capture holds (docs/ui.md, "Limits"): long lists are shown a
page at a time (versions, calls, a call's leaves, parameters, reports) with a pager, and what is
cut is counted on the page ("20 of 50,000 calls"), never dropped silently. Values from a capture
stay data here (strings, numbers); the templates escape every one of them (Jinja2 autoescape), and
nothing here builds HTML. Fields a capture or a received report may hold in any type are turned
into text here (:func:`_text`), so an odd value shows as what it is instead of failing the page.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote, urlencode

from modulelens.errors import UsageError
from modulelens.format.human import human_bytes, human_number
from modulelens.format.reports import is_number
from modulelens.interfaces.tensor_info import state_rows, tree_rows
from modulelens.interfaces.ui import charts
from modulelens.interfaces.ui.repo_view import RepoView, StoredCapture
from modulelens.interfaces.value_text import argument_texts, construction_text, python_like, short_class, spec_leaf_window

SORTS = ("created", "name", "class", "size", "calls")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")

# The limits that keep every page under a few MiB and a second or two whatever a capture holds
# (benchmarks/bench_ui.py: a 50,000-call capture once rendered 80 MiB of HTML in 74 s, a
# million-leaf call 117 MiB, 3,000 reports took 61 s).
PER_PAGE = 500  # versions on a repo page
MAX_PER_PAGE = 2_000  # the most a repo page shows (per_page=all)
CALLS_PER_PAGE = 20  # calls on a capture page
LEAVES_PREVIEW = 16  # leaves of each of a call's trees on the capture page (the call's own page has them all)
LEAVES_PER_PAGE = 500  # leaves of one tree on a call's page
PARAMETERS_PER_PAGE = 500  # parameters and buffers on a capture page
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


Reports = tuple[list[dict[str, Any]], list[str]]  # a version's reports and the files that are not reports

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


def _href(path: str, params: Mapping[str, Any], **changes: Any) -> str:
    """``path`` with ``params`` updated by ``changes``; ``None`` values (defaults) left out."""
    merged = {k: v for k, v in {**params, **changes}.items() if v is not None}
    return path + ("?" + urlencode(merged) if merged else "")


def _page(number: int) -> int | None:
    """A page number for a link: ``None`` (left out) for the first page."""
    return number if number > 1 else None


def _text(value: Any, limit: int = TEXT_LIMIT) -> str:
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


def _listed(items: Sequence[Any], limit: int = LISTED) -> list[str]:
    """The first ``limit`` items as text, and a line counting the rest."""
    shown = [_text(item, 300) for item in items[:limit]]
    if len(items) > limit:
        shown.append(f"… and {len(items) - limit:,} more")
    return shown


def _number(value: Any) -> float | int | None:
    """A real number from stored data, else ``None`` (a string, a list, a bool are not drawn as numbers)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _mapping(value: Any) -> dict[str, Any]:
    """A stored object, or ``{}`` when the value is of another type."""
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


# ------------------------------------------------------------------------------------------ repo


@dataclass(frozen=True)
class RepoQuery:
    """The repo page's search, filters, order and page (its URL's query string)."""

    text: str = ""  # in the name, class, tags or aliases (case-insensitive)
    module_class: str = ""  # this class name exactly (short name)
    tag: str = ""  # this tag exactly
    since: str = ""  # created on or after this date (YYYY-MM-DD)
    until: str = ""  # created on or before this date
    sort: str = "created"
    descending: bool = True
    page: int = 1
    per_page: int = PER_PAGE

    def __post_init__(self) -> None:
        if self.sort not in SORTS:
            raise UsageError(f"sort must be one of {', '.join(SORTS)}, not {self.sort!r}")
        for label, value in (("since", self.since), ("until", self.until)):
            if value and not _DATE.fullmatch(value):
                raise UsageError(f"{label} must be a date such as 2026-12-01, not {value!r}")
        if self.page < 1 or self.per_page < 1:
            raise UsageError("page and per_page must be positive")

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> RepoQuery:
        """From a URL's query parameters (``q``, ``class``, ``tag``, ``since``, ``until``, ``sort``,
        ``order``, ``page``, ``per_page``; ``per_page=all`` for the most a page shows, :data:`MAX_PER_PAGE`).

        Raises:
            UsageError: a value that is not one of those accepted.
        """
        def number(key: str, default: int) -> int:
            text = params.get(key) or ""
            if text == "all" and key == "per_page":
                return MAX_PER_PAGE
            try:
                return int(text) if text else default
            except ValueError:
                raise UsageError(f"{key} must be a number, not {text[:40]!r}") from None

        return cls(text=params.get("q", "").strip(), module_class=params.get("class", ""), tag=params.get("tag", ""),
                   since=params.get("since", ""), until=params.get("until", ""), sort=params.get("sort") or "created",
                   descending=params.get("order", "desc") != "asc", page=number("page", 1),
                   per_page=min(number("per_page", PER_PAGE), MAX_PER_PAGE))

    def params(self, **changes: Any) -> dict[str, str]:
        """This query (with ``changes``) as URL parameters, defaults left out (for links)."""
        query = replace(self, **changes)
        pairs = {"q": query.text, "class": query.module_class, "tag": query.tag, "since": query.since,
                 "until": query.until, "sort": "" if query.sort == "created" else query.sort,
                 "order": "" if query.descending else "asc", "page": "" if query.page == 1 else str(query.page),
                 "per_page": "" if query.per_page == PER_PAGE else str(query.per_page)}
        return {k: v for k, v in pairs.items() if v}


@dataclass(slots=True)
class RepoRow:
    """One version on the repo page. Attributes, not a dict: a template reads ``row.ref`` by
    ``getattr`` first, and a dict made it raise and catch an AttributeError for every cell of 2,000 rows."""

    ref: str
    href: str
    aliases: tuple[str, ...]
    tags: list[tuple[str, str]]
    cls: str
    class_path: str
    size: str
    created: str
    calls: int
    problem: str | None
    job: tuple[str, str, str] | None  # host, command, git commit (None until read)


def _job_line(job: dict[str, Any] | None) -> tuple[str, str, str] | None:
    if job is None:
        return None
    return (_text(job.get("host") or "-", 100), _text(job.get("command") or "-", 60), _text(job.get("git_commit") or "-", 10))


def repo_page(view: RepoView, query: RepoQuery) -> dict[str, Any]:
    """The repo page: every version matching ``query``, from the listing summaries alone."""
    infos = view.versions()
    classes = sorted({short_class(i.module_class) for i in infos if i.module_class})
    tags = sorted({t for i in infos for t in i.tags})
    needle = query.text.lower()
    chosen = []
    for info in infos:
        cls = short_class(info.module_class)
        if needle and not (needle in info.name.lower() or needle in info.module_class.lower()
                           or any(needle in t.lower() for t in info.tags) or any(needle in a.lower() for a in info.aliases)):
            continue
        if (query.module_class and cls != query.module_class) or (query.tag and query.tag not in info.tags):
            continue
        day = info.created[:10]
        if (query.since and day < query.since) or (query.until and day > query.until):
            continue
        chosen.append(info)
    key = {"created": lambda i: (i.created, i.name, i.version), "name": lambda i: (i.name, i.version),
           "class": lambda i: (short_class(i.module_class), i.name, i.version),
           "size": lambda i: (i.nbytes, i.name, i.version), "calls": lambda i: (i.calls, i.name, i.version)}[query.sort]
    chosen.sort(key=key, reverse=query.descending)
    window = Window.of(len(chosen), query.page, query.per_page)
    shown = chosen[window.start:window.stop]
    tag_links: dict[str, str] = {}  # one link per tag, not one per row (2,000 rows: a third of the page's time)
    for tag in {t for i in shown for t in i.tags}:
        tag_links[tag] = "/?" + urlencode(query.params(tag=tag, page=1))
    rows = [RepoRow(i.ref, "/capture/" + quote(i.ref, safe="/:"), i.aliases, [(t, tag_links[t]) for t in i.tags],
                    short_class(i.module_class), i.module_class, human_bytes(i.nbytes), i.created, i.calls, i.problem,
                    _job_line(view.job(i.ref))) for i in shown]
    pager = window.links(lambda p: "/?" + urlencode(query.params(page=p)))
    return {"title": "captures", "repo": view.location, "rows": rows, "total": len(infos), "matched": len(chosen),
            "page": window.page, "pages": window.pages, "pager": pager, "classes": classes[:MAX_PER_PAGE],
            "tags": tags[:MAX_PER_PAGE], "query": query, "sorts": SORTS, "names": len({i.name for i in infos}),
            "max_per_page": MAX_PER_PAGE}


# --------------------------------------------------------------------------------------- capture


@dataclass(frozen=True)
class CaptureQuery:
    """What a capture page shows of long lists: the recorded state, and the page of calls and of
    parameters (its URL's ``state``, ``calls``, ``parameters``)."""

    state: int = 0
    calls_page: int = 1
    parameters_page: int = 1

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> CaptureQuery:
        """Raises: UsageError: a value that is not a number."""
        text = params.get("state") or "0"
        if not text.isdigit() or len(text) > 9:
            raise UsageError(f"state must be a number, not {text[:40]!r}")
        return cls(int(text), page_param(params, "calls"), page_param(params, "parameters"))

    def params(self, **changes: Any) -> dict[str, Any]:
        query = replace(self, **changes)
        return {"state": query.state or None, "calls": _page(query.calls_page), "parameters": _page(query.parameters_page)}


def capture_page(view: RepoView, capture: StoredCapture, query: CaptureQuery | None = None, *,
                 histograms: bool = False, reports: Reports | None = None) -> dict[str, Any]:
    """The capture page of one version.

    Args:
        view: the repo's view (caches of tensor summaries).
        capture: the stored version.
        query: which recorded state's parameters, and which page of calls and of parameters.
        histograms: include the histogram of the call tensors shown (the self-contained file,
            which has no server to ask when one is clicked; at most :data:`STANDALONE_HISTOGRAMS`).
        reports: the version's reports, when the caller has read them (:meth:`RepoView.reports`).

    Raises:
        UsageError: ``state`` is not a recorded state.
    """
    query = query or CaptureQuery()
    meta = capture.metadata
    module = meta.get("module", {})
    states = meta.get("states") or []
    if states and not 0 <= query.state < len(states):
        raise UsageError(f"{capture.ref} has states 0-{len(states) - 1}, not {query.state}")
    construction = (meta.get("constructions") or {}).get(module.get("construction") or "")
    info = capture.info
    base = "/capture/" + quote(capture.ref, safe="/:")
    here = query.params()
    parameters, parameter_window, parameter_count = _parameters(view, capture, query) if states else ([], None, 0)
    calls = meta.get("calls", [])
    call_window = Window.of(len(calls), query.calls_page, CALLS_PER_PAGE)
    budget = [STANDALONE_HISTOGRAMS] if histograms else None
    shown_calls = [_call(view, capture, position, calls[position], LEAVES_PREVIEW, {}, budget)
                   for position in range(call_window.start, call_window.stop)]
    versions = view.version_numbers(capture.name)
    earlier = [v for v in versions if v < capture.version]
    found, report_problems = reports or view.reports(capture.ref)
    arguments = list(argument_texts(construction, meta).items()) if construction else []
    return {
        "title": capture.ref, "ref": capture.ref, "name": capture.name, "version": capture.version,
        "aliases": info.aliases, "tags": _listed(meta.get("tags") or []), "created": info.created,
        "size": human_bytes(info.nbytes),
        "module_class": _text(module.get("class", ""), 500), "cls": short_class(module.get("class", "")),
        "qualified_name": _text(module.get("qualified_name") or "<root>", 500),
        "constructor": _text(construction_text(construction, meta), 4 * TEXT_LIMIT) if construction else None,
        "arguments": [(_text(k, 200), _text(v)) for k, v in arguments[:LISTED]],
        "arguments_more": max(len(arguments) - LISTED, 0),
        "construction_missing": _text(module.get("construction_missing")) if module.get("construction_missing") else None,
        "state": query.state, "states": len(states), "state_links": [(str(s), _href(base, here, state=s or None))
                                                                     for s in range(min(len(states), LISTED))],
        "parameters": parameters, "parameter_count": parameter_count,
        "parameters_counted": parameter_window.counted("parameters and buffers") if parameter_window else "",
        "parameters_pager": parameter_window.links(lambda p: _href(base, here, parameters=_page(p))) if parameter_window else [],
        "calls": shown_calls, "call_count": len(calls), "calls_counted": call_window.counted("recorded calls"),
        "calls_pager": call_window.links(lambda p: _href(base, here, calls=_page(p))),
        "environment": _environment(meta.get("environment") or {}),
        "distributed": _pairs(meta.get("distributed")),
        "capture_settings": _pairs(meta.get("capture")),
        "user_metadata": _pairs(meta.get("metadata")),
        "shape_only": _listed(meta.get("shape_only") or []), "warnings": _warnings(meta),
        "sources": _sources(capture), "versions": versions[-LISTED:], "versions_more": max(len(versions) - LISTED, 0),
        "previous": f"{capture.name}:v{earlier[-1]}" if earlier else None,
        "reports": [_report_line(r) for r in found[:REPORTS_LISTED]], "report_count": len(found),
        "report_problems": _listed(report_problems, 10),
    }


def _pairs(value: Any) -> list[tuple[str, str]]:
    """A stored mapping (environment, settings, user metadata) as sorted ``(key, text)`` rows, bounded."""
    if not isinstance(value, Mapping):
        return [("(value)", _text(value))] if value else []
    items = sorted(value.items(), key=lambda kv: str(kv[0]))
    rows = [(_text(k, 200), _text(v)) for k, v in items[:LISTED * 4]]
    if len(items) > LISTED * 4:
        rows.append(("…", f"{len(items) - LISTED * 4:,} more entries not shown"))
    return rows


def _parameters(view: RepoView, capture: StoredCapture,
                query: CaptureQuery) -> tuple[list[dict[str, Any]], Window, int]:
    state = capture.metadata["states"][query.state]
    tensors = capture.metadata["tensors"]
    count = sum(_numel(tensors[e["tensor"]]["shape"]) for e in state["parameters"].values())
    window = Window.of(len(state["parameters"]) + len(state["buffers"]), query.parameters_page, PARAMETERS_PER_PAGE)
    rows = state_rows(capture, query.state, stats=False, limit=window.stop)[window.start:]
    return [_with_summary(view, capture, row) for row in rows], window, count


def _numel(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


def _with_summary(view: RepoView, capture: StoredCapture, row: dict[str, Any], histogram: bool = True) -> dict[str, Any]:
    if row["kind"] != "tensor":
        return row
    summary = view.summary(capture, row["id"])
    stats = summary["stats"] if isinstance(summary["stats"], dict) else None
    row.update(stats=stats, sampled=summary["sampled"], stats_error=summary["error"],
               histogram=charts.histogram_bars(summary["histogram"]) if histogram else None,
               size=human_bytes(row["nbytes"]), numbers=_stat_numbers(stats))
    return row


def _stat_numbers(stats: dict[str, Any] | None) -> dict[str, str]:
    """The statistics a table shows, each a real number or ``-`` (a recorded value of another type,
    from a damaged or hostile capture, shows as missing instead of failing the page)."""
    if not stats:
        return {}
    numbers = {k: human_number(_number(stats.get(k))) for k in ("min", "max", "mean", "std")}
    if _number(stats.get("fraction_true")) is not None:
        numbers["mean"] = f"{stats['fraction_true']:.3g} true"
    zeros = _number(stats.get("zero_fraction"))
    numbers["zeros"] = f"{100 * zeros:.1f}%" if zeros is not None else "-"
    nonfinite = stats.get("nonfinite", 0)
    numbers["nonfinite"] = str(nonfinite) if isinstance(nonfinite, int) else "-"
    return numbers


@dataclass
class _Part:
    """One tree of a call (inputs, output, inputs after the call, a gradient tree), a window of its leaves."""

    key: str
    title: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0
    counted: str = ""
    pager: list[tuple[str, str | None]] = field(default_factory=list)
    more: str | None = None  # the call page's link, when the capture page shows a preview


_PARTS = (("inputs", "inputs", "inputs"), ("output", "output", "output"),
          ("after", "inputs after the call (changed in place)", "after"),
          ("output_grads", "gradients of the output", "output_grads"),
          ("input_grads", "gradients of the inputs", "input_grads"),
          ("param_grads", "gradients of the parameters", "param_grads"))


def _trees(call: Mapping[str, Any]) -> dict[str, Any]:
    backward = _mapping(call.get("backward"))
    return {"inputs": call.get("inputs"), "output": call.get("output"), "after": call.get("mutated_inputs"),
            "output_grads": backward.get("output_grads"), "input_grads": backward.get("input_grads"),
            "param_grads": backward.get("param_grads")}


def _call(view: RepoView, capture: StoredCapture, position: int, call: Mapping[str, Any], per_page: int,
          pages: Mapping[str, int], histograms: list[int] | None, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One call: its facts, and each of its trees a window of ``per_page`` leaves (page ``pages[key]``).

    On the capture page (``per_page`` = :data:`LEAVES_PREVIEW`) a longer tree links to the call's own
    page. ``histograms`` is the self-contained file's budget of histograms to draw (one item, spent
    as tensors are drawn); ``None`` on the server, which draws one when it is clicked."""
    mode = ("train" if call.get("training") else "eval") + ("" if call.get("grad_enabled", True) else ", no_grad")
    call_href = f"/capture/{quote(capture.ref, safe='/:')}/call/{position}"
    parts = []
    for key, title, prefix in _PARTS:
        tree = _trees(call)[key]
        if not isinstance(tree, dict) or not isinstance(tree.get("leaves"), list):
            continue
        total = len(tree["leaves"])
        window = Window.of(total, pages.get(key, 1), per_page)
        part = _Part(key, title, _tree(view, capture, tree, prefix, window, histograms), total)
        if per_page == LEAVES_PREVIEW:
            part.counted = f"{window.stop:,} of {total:,} leaves" if total > window.stop else ""
            part.more = f"{call_href}#{key}" if total > window.stop else None
        else:
            part.counted = window.counted("leaves")
            part.pager = window.links(_part_href(call_href, params or {}, key))
        parts.append(part)
    rng = call.get("rng")
    return {
        "position": position, "index": _text(call.get("index"), 40), "mode": mode, "state": _text(call.get("state"), 40),
        "finished": call.get("finished", True) is not False, "error": _text(call.get("error") or "", 1000),
        "autocast": _text(call.get("autocast"), 300) if call.get("autocast") else None,
        "rng": sorted(str(k) for k in rng)[:LISTED] if isinstance(rng, dict) else [],
        "parts": parts, "href": call_href,
        "op_trace": _op_trace(capture, call.get("op_trace"), listed=per_page != LEAVES_PREVIEW),
    }


def _part_href(call_href: str, params: Mapping[str, Any], key: str) -> Callable[[int], str]:
    """Links to the pages of one tree of a call page (the other trees stay on their pages)."""
    return lambda page: _href(call_href, params, **{key: _page(page)}) + f"#{key}"


def _tree(view: RepoView, capture: StoredCapture, tree: Mapping[str, Any], prefix: str, window: Window,
          histograms: list[int] | None) -> list[dict[str, Any]]:
    leaves = tree["leaves"][window.start:window.stop]
    paths = spec_leaf_window(tree, prefix, window.start, window.stop)
    rows = tree_rows(capture, {"leaves": leaves}, prefix, stats=False, paths=paths)
    for row, leaf in zip(rows, leaves, strict=True):
        if row["kind"] == "tensor":
            draw = histograms is not None and histograms[0] > 0
            _with_summary(view, capture, row, histogram=draw)
            if draw and histograms is not None:
                histograms[0] -= 1
            elif histograms is not None:
                row["hist_note"] = f"histogram not drawn in this file (the first {STANDALONE_HISTOGRAMS} call tensors are)"
        elif row["kind"] == "value":
            row["value"] = _text(python_like(leaf, capture.metadata, limit=300), 300)
        else:
            row["type"], row["reason"] = _text(row.get("type"), 200), _text(row.get("reason"), 500)
    return rows


def call_page(view: RepoView, capture: StoredCapture, position: int, params: Mapping[str, str]) -> dict[str, Any]:
    """One recorded call with every leaf of its trees, :data:`LEAVES_PER_PAGE` at a time (``?inputs=2``...).

    Raises:
        UsageError: no call at ``position``, or a page that is not a number.
    """
    calls = capture.metadata.get("calls", [])
    if not 0 <= position < len(calls):
        raise UsageError(f"{capture.ref} has calls 0-{len(calls) - 1}, not {position}" if calls
                         else f"{capture.ref} has no recorded calls")
    pages = {key: page_param(params, key) for key, _, _ in _PARTS}
    call = _call(view, capture, position, calls[position], LEAVES_PER_PAGE, pages, None,
                 params={key: _page(page) for key, page in pages.items()})
    return {"title": f"call {call['index']} of {capture.ref}", "ref": capture.ref, "call": call,
            "call_count": len(calls), "previous": position - 1 if position else None,
            "next": position + 1 if position + 1 < len(calls) else None}


_OP_ROWS = 500  # ops listed on a call's page (``modulelens show --ops`` lists them all)


def _op_trace(capture: StoredCapture, summary: Mapping[str, Any] | None, *, listed: bool) -> dict[str, Any] | None:
    """A call's op trace (docs/fidelity.md, "Op traces"): its counts, and (``listed``: on the call's
    page) its first ops, or why it cannot be read. The capture page shows the counts only: 20 calls
    of 500 ops each were 10,000 rows, and each trace a blob to read."""
    if not isinstance(summary, Mapping):
        return None
    from modulelens.errors import ModulelensError
    from modulelens.format.validate import validate_op_trace
    from modulelens.restore.summary import op_rows

    line = (f"op trace: {_text(summary.get('ops'), 20)} ops in {_text(summary.get('modules'), 20)} module calls, "
            f"{_text(summary.get('values'), 20)} outputs' values kept")
    if not listed:
        return {"summary": line, "rows": [], "more": 0, "error": None}
    tensors = capture.metadata["tensors"]
    try:
        text = capture.tensor(str(summary.get("text_id"))).numpy().tobytes().decode("utf-8")
        document = validate_op_trace(json.loads(text), f"{capture.ref} op trace", tensors.get)
    except (ModulelensError, ValueError, KeyError) as error:
        return {"summary": line, "rows": [], "more": 0, "error": f"the op trace cannot be read: {error}"}
    rows = [{**row, "outputs": ", ".join(f"{o['dtype']}{o['shape']}" if "dtype" in o else repr(o.get("scalar"))
                                        for o in row["outputs"]),
             "source": (row["source"] or "").replace("\\", "/").rsplit("/", 1)[-1]}
            for row in op_rows(document)[:_OP_ROWS]]
    return {"summary": line, "rows": rows, "more": max(0, len(document["ops"]) - _OP_ROWS), "error": None}


def histogram_of(view: RepoView, capture: StoredCapture, tid: str) -> dict[str, Any]:
    """One tensor's histogram and statistics (what a click on a call tensor shows).

    Raises:
        UsageError: the capture has no tensor ``tid``.
    """
    entry = capture.metadata["tensors"].get(tid)
    if entry is None:
        raise UsageError(f"{capture.ref} has no tensor {tid[:100]!r}")
    row = _with_summary(view, capture, {"kind": "tensor", "id": tid, "path": tid, "shape": entry["shape"],
                                        "dtype": entry["dtype"], "nbytes": entry["nbytes"],
                                        "shape_only": bool(entry.get("shape_only"))})
    return {"ref": capture.ref, "row": row}


def _environment(env: Mapping[str, Any]) -> list[tuple[str, str]]:
    rows = _pairs({k: v for k, v in env.items() if k != "argv"})
    argv = env.get("argv")
    if isinstance(argv, list):
        rows.insert(0, ("command", _text(" ".join(str(a) for a in argv[:1000]))))
    return rows


def _warnings(meta: Mapping[str, Any]) -> list[str]:
    """What a reader of this capture should know: incomplete records, missing constructor,
    values that were not recorded, calls that raised, tensors kept shape-only (each list bounded)."""
    found = []
    settings = meta.get("capture") or {}
    if isinstance(settings, dict) and settings.get("complete") is False:
        found.append("the capture is incomplete: the job ended (or saving stopped) before every requested call was recorded")
    missing = (meta.get("module") or {}).get("construction_missing")
    if missing:
        found.append(f"constructor not recorded: {_text(missing, 500)}")
    unrecorded = meta.get("unrecorded") or []
    for entry in unrecorded[:LISTED]:
        entry = entry if isinstance(entry, dict) else {"path": entry}
        found.append(f"not recorded: {_text(entry.get('path'), 200)} ({_text(entry.get('type'), 200)}): "
                     f"{_text(entry.get('reason'), 500)}")
    if len(unrecorded) > LISTED:
        found.append(f"… and {len(unrecorded) - LISTED:,} more values not recorded")
    raised = [call for call in meta.get("calls") or [] if call.get("finished", True) is False]
    for call in raised[:LISTED]:
        found.append(f"call {_text(call.get('index'), 40)} raised in the original job: {_text(call.get('error') or 'no message', 500)}")
    if len(raised) > LISTED:
        found.append(f"… and {len(raised) - LISTED:,} more calls that raised")
    shape_only = meta.get("shape_only") or []
    if shape_only:
        found.append(f"{len(shape_only):,} tensor(s) stored shape-only (dtype, shape and statistics, no values): "
                     + ", ".join(_text(p, 100) for p in shape_only[:8]) + (" ..." if len(shape_only) > 8 else ""))
    return found


def _sources(capture: StoredCapture) -> list[dict[str, Any]]:
    texts = capture.source_texts(SOURCES_SHOWN)
    shown = []
    for source in texts:
        text = source["text"]
        if len(text) > SOURCE_LIMIT:
            text = text[:SOURCE_LIMIT] + f"\n… ({len(text) - SOURCE_LIMIT:,} more characters not shown)"
        shown.append({"module": _text(source["module"], 300), "file": _text(source["file"], 500), "text": text,
                      "classes": _listed(source["classes"], 20)})
    count = len(capture.metadata.get("sources") or {})
    if count > SOURCES_SHOWN:
        shown.append({"module": "…", "file": f"{count - SOURCES_SHOWN:,} more stored source files not shown",
                      "text": "", "classes": []})
    return shown


# --------------------------------------------------------------------------------------- reports


def _report_line(report: Mapping[str, Any]) -> dict[str, Any]:
    passed = report.get("passed") if isinstance(report.get("passed"), bool) else None
    status = report.get("status") if report.get("status") in ("PASS", "FAIL", "UNVERIFIED") else None
    return {"kind": _text(report.get("kind", "?"), 40), "created": _text(report.get("created", ""), 40),
            "passed": None if status == "UNVERIFIED" else passed,
            "verdict": status or ("passed" if passed else "failed" if passed is False else None)}


def reports_page(view: RepoView, capture: StoredCapture, page: int = 1, *,
                 found: Reports | None = None) -> dict[str, Any]:
    """The reports stored with one version, newest first, :data:`REPORTS_PER_PAGE` at a time, with
    their plots; reports that are not reports (damaged, hostile) are named, not shown. ``found``:
    the version's reports, when the caller has read them."""
    reports, problems = found or view.reports(capture.ref)
    window = Window.of(len(reports), page, REPORTS_PER_PAGE)
    plots = [SWEEP_PLOTS]
    shown = [_report(view, r, plots) for r in reports[window.start:window.stop]]
    profiles = [r for r in reports if r.get("kind") == "profile" and isinstance(r.get("latency"), dict)][:PLOTTED_PROFILES]
    paths = tuple(str(r.get("path", "")) for r in profiles)
    history = view.drawn(("history", *paths), lambda: _plot(charts.history_plot, profiles))
    base = f"/capture/{quote(capture.ref, safe='/:')}/reports"
    return {"title": f"reports of {capture.ref}", "ref": capture.ref, "name": capture.name,
            "report_list": shown, "history_plot": history, "report_count": len(reports),
            "reports_counted": window.counted("reports"), "reports_pager": window.links(lambda p: _href(base, {}, page=_page(p))),
            "history_counted": f"the newest {len(profiles)} of {sum(r.get('kind') == 'profile' for r in reports):,} "
                               "profile reports" if len(profiles) == PLOTTED_PROFILES else "",
            "report_problems": _listed(problems, 20)}


def _plot(draw: Callable[..., str | None], *args: Any) -> str | dict[str, str] | None:
    """A plot's data URI, or ``{"error": ...}`` when it cannot be drawn."""
    try:
        return draw(*args)
    except ImportError:
        return {"error": "plots need matplotlib: pip install 'modulelens[ui]'"}
    except Exception as error:  # matplotlib on stored numbers (any of its errors): the page shows the rest
        return {"error": f"plot not drawn: {type(error).__name__}: {_text(str(error), 200)}"}


def _report(view: RepoView, report: Mapping[str, Any], plots: list[int]) -> dict[str, Any]:
    kind = _text(report.get("kind", "?"), 40)
    text = json.dumps({k: v for k, v in report.items() if k != "path"}, indent=1, default=str)
    if len(text) > REPORT_JSON:
        text = text[:REPORT_JSON] + f"\n… ({len(text) - REPORT_JSON:,} more characters: the file {report.get('path', '')})"
    shown: dict[str, Any] = {**_report_line(report), "file": str(report.get("path", "")).rsplit("/", 1)[-1],
                             "facts": [], "tables": [], "plot": None, "notes": _listed(report.get("notes") or [], 20),
                             "json": text}
    if kind == "profile" and isinstance(report.get("latency"), dict):
        lat, memory = report["latency"], _mapping(report.get("memory"))
        flops, moved = _mapping(report.get("flops")), _mapping(report.get("bytes_moved"))
        shown["facts"] = [
            ("latency", f"median {_shown_number(lat.get('median_ms'))} ms (p10 {_shown_number(lat.get('p10_ms'))}, "
                        f"p90 {_shown_number(lat.get('p90_ms'))}, {_text(lat.get('iterations'), 20)} iterations)"),
            ("device", f"{_text(report.get('device'), 200)} ({_text(report.get('mode'), 200)})"),
            ("peak memory", human_bytes(memory["peak_bytes"]) if _number(memory.get("peak_bytes")) is not None else "-"),
            ("FLOPs", _shown_number(flops.get("total"))),
            ("bytes moved", human_bytes(moved["total"]) if _number(moved.get("total")) is not None else "-"),
            ("achieved", _shown_number(report.get("achieved_flops_per_s"), "FLOP/s")),
            ("arithmetic intensity", _shown_number(report.get("arithmetic_intensity"), "FLOP/byte")),
        ]
        shown["tables"].append(_table("top operators", ("operator", "self ms / iter", "%"),
                                      [(op.get("name"), _shown_number(op.get("self_ms_per_iter")), _shown_number(op.get("percent")))
                                       for op in _dicts(report.get("top_ops"))]))
        sweep = _dicts(report.get("batch_sweep"))
        shown["tables"].append(_table("batch sizes", ("batch", "median ms", "p10", "p90", "samples/s", "FLOP/s"),
                                      [(r.get("batch_size"), _shown_number(r.get("median_ms")) if r.get("median_ms") is not None
                                        else r.get("error", ""), _shown_number(r.get("p10_ms")), _shown_number(r.get("p90_ms")),
                                        _shown_number(r.get("throughput_per_s")), _shown_number(r.get("achieved_flops_per_s")))
                                       for r in sweep]))
        if sweep and plots[0] > 0:
            plots[0] -= 1
            shown["plot"] = view.drawn(("sweep", str(report.get("path", ""))), lambda: _plot(charts.sweep_plot, dict(report)))
        elif sweep:
            shown["notes"].append(f"sweep plot not drawn here (only the first {SWEEP_PLOTS} on a page are): the table has its numbers")
    elif isinstance(report.get("calls"), list):
        rows = []
        for c in _dicts(report["calls"]):
            verdict = c.get("status", c.get("passed"))
            rows.append((c.get("index"), "pass" if verdict in (True, "pass") else "FAIL" if verdict in (False, "fail")
                         else _text(verdict, 40), _shown_number(c.get("max_abs_error")), _shown_number(c.get("max_rel_error")),
                         c.get("error") or c.get("detail") or ""))
        shown["tables"].append(_table("calls", ("call", "result", "max abs err", "max rel err", "detail"), rows))
        shown["tables"].append(_divergence_table([(c.get("index"), c.get("divergence")) for c in _dicts(report["calls"])]))
        for key in ("candidate", "device", "mode", "speedup", "status"):
            if key in report:
                shown["facts"].append((key, _text(report[key], 500)))
        shown["notes"] += [f"cannot verify: {line}" for line in _listed(report.get("unverified") or [], 20)]
        shown["notes"] += [f"failure: {line}" for line in _listed(report.get("failures") or [], 20)]
    if isinstance(report.get("divergence"), dict) and not isinstance(report.get("calls"), list):  # kernel verify
        shown["tables"].append(_divergence_table([(report["divergence"].get("sample"), report["divergence"])]))
    shown["tables"] = [t for t in shown["tables"] if t["rows"]]
    return shown


def _shown_number(value: Any, unit: str = "") -> str:
    """A report's number as text: a real number formatted, ``nan``/``inf`` as they are, anything else ``-``."""
    return human_number(value, unit) if _number(value) is not None else (value if is_number(value) else "-")


def _divergence_table(found: list[tuple[Any, Any]]) -> dict[str, Any]:
    """Where each located call first diverged (docs/tools.md, "First divergence")."""
    rows = []
    for where, divergence in found:
        if not isinstance(divergence, Mapping):
            continue
        first = _mapping(divergence.get("first"))
        reference, last = _mapping(first.get("reference")), _mapping(divergence.get("last_agreeing"))
        rows.append((where, reference.get("module", "-") or "<root>", reference.get("op", "-"),
                     str(reference.get("source") or "").replace("\\", "/").rsplit("/", 1)[-1],
                     human_number(first.get("max_ulps")) if isinstance(first.get("max_ulps"), (int, float))
                     else first.get("max_ulps", "-"),
                     f"{last.get('module') or '<root>'} {last.get('op')}" if last else "-",
                     divergence.get("summary", "")))
    return _table("first divergence", ("call", "module", "op", "source", "ULPs", "last agreeing op", "summary"), rows)


def _table(title: str, headers: tuple[str, ...], rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    shown = [["" if c is None else _text(c, 300) for c in row] for row in rows[:REPORT_ROWS]]
    more = f"{len(rows) - REPORT_ROWS:,} more rows not shown (the stored JSON has them)" if len(rows) > REPORT_ROWS else ""
    return {"title": title, "headers": headers, "rows": shown, "more": more}


# ------------------------------------------------------------------------------------------ diff


def diff_page(view: RepoView, a: StoredCapture, b: StoredCapture) -> dict[str, Any]:
    """Two versions side by side: constructor, per-tensor weight drift, input and output statistics.

    Weights are compared from the memory-mapped payloads a chunk at a time
    (:func:`modulelens.tools.diff.tensor_changes`); inputs and outputs by their recorded
    statistics, pooled over each capture's first :data:`DIFF_CALLS` calls. Running B's module on
    A's inputs is an action (``--allow-run``): it rebuilds a module.
    """
    from modulelens.tools.diff import tensor_changes

    ma, mb = a.metadata, b.metadata
    ca = (ma.get("constructions") or {}).get(ma["module"].get("construction") or "")
    cb = (mb.get("constructions") or {}).get(mb["module"].get("construction") or "")
    args_a = argument_texts(ca, ma) if ca else {}
    args_b = argument_texts(cb, mb) if cb else {}
    constructor = [{"argument": _text(k, 200), "a": _text(args_a.get(k, "-")), "b": _text(args_b.get(k, "-")),
                    "changed": args_a.get(k) != args_b.get(k)} for k in dict.fromkeys([*args_a, *args_b])]
    tensors = [{**t, "max_abs": human_number(t["max_abs_diff"]), "rel": human_number(t["rel_norm"])}
               for t in tensor_changes(a, b)]
    changed_first = sorted(tensors, key=lambda t: t["status"] == "same")  # what changed, then the rest
    pooled = [f"{c.ref}: the first {DIFF_CALLS} of {len(c.metadata.get('calls', [])):,} calls"
              for c in (a, b) if len(c.metadata.get("calls", [])) > DIFF_CALLS]
    inputs, outputs = _drift(view, a, b, "inputs"), _drift(view, a, b, "output")
    return {
        "title": f"diff {a.ref} → {b.ref}", "a": a.ref, "b": b.ref,
        "class_a": _text(ma["module"].get("class", ""), 500), "class_b": _text(mb["module"].get("class", ""), 500),
        "constructor": constructor[:DIFF_ROWS], "constructor_missing": [r.ref for r, c in ((a, ca), (b, cb)) if not c],
        "tensors": changed_first[:DIFF_ROWS], "tensor_count": len(tensors),
        "identical": sum(t["status"] == "same" for t in tensors),
        "inputs": inputs[:DIFF_ROWS], "outputs": outputs[:DIFF_ROWS],
        "cut": [f"{what}: {len(rows) - DIFF_ROWS:,} more rows not shown" for what, rows in
                (("constructor", constructor), ("weights", tensors), ("inputs", inputs), ("outputs", outputs))
                if len(rows) > DIFF_ROWS],
        "pooled": "; ".join(pooled),
    }


def _pooled(view: RepoView, capture: StoredCapture, part: str) -> dict[str, dict[str, Any]]:
    """Per leaf path, statistics pooled over the first recorded calls (from each tensor's summary)."""
    pooled: dict[str, dict[str, Any]] = {}
    for call in capture.metadata.get("calls", [])[:DIFF_CALLS]:
        tree = call.get("inputs" if part == "inputs" else "output")
        if not isinstance(tree, dict) or not isinstance(tree.get("leaves"), list):
            continue
        window = Window.of(len(tree["leaves"]), 1, DIFF_LEAVES)
        leaves = tree["leaves"][:window.stop]
        for row in tree_rows(capture, {"leaves": leaves}, part, stats=False,
                             paths=spec_leaf_window(tree, part, 0, window.stop)):
            if row["kind"] != "tensor":
                continue
            summary = view.summary(capture, row["id"])["stats"]
            stats = summary if isinstance(summary, dict) else {}
            into = pooled.setdefault(row["path"], {"shape": row["shape"], "dtype": row["dtype"], "n": 0, "sum": 0.0,
                                                   "sq": 0.0, "min": math.inf, "max": -math.inf})
            numbers = {k: _number(stats.get(k)) for k in ("mean", "std", "min", "max")}
            count = (_number(stats.get("numel")) or 0) - (_number(stats.get("nonfinite")) or 0)
            if any(v is None for v in numbers.values()) or count <= 0:
                continue
            mean, std = float(numbers["mean"] or 0.0), float(numbers["std"] or 0.0)
            into["n"] += count
            into["sum"] += mean * count
            into["sq"] += (std ** 2 + mean ** 2) * count
            into["min"] = min(into["min"], float(numbers["min"] or 0.0))
            into["max"] = max(into["max"], float(numbers["max"] or 0.0))
    for into in pooled.values():
        n = into.pop("n")
        total, squares = into.pop("sum"), into.pop("sq")
        into["mean"] = total / n if n else None
        into["std"] = math.sqrt(max(squares / n - (total / n) ** 2, 0.0)) if n else None
        if not n:
            into["min"] = into["max"] = None
    return pooled


def _drift(view: RepoView, a: StoredCapture, b: StoredCapture, part: str) -> list[dict[str, Any]]:
    pa, pb = _pooled(view, a, part), _pooled(view, b, part)
    rows = []
    for path in dict.fromkeys([*pa, *pb]):
        sa, sb = pa.get(path), pb.get(path)
        row: dict[str, Any] = {"path": path, "a": _described(sa), "b": _described(sb), "shift": {}}
        if sa and sb:
            for key in ("mean", "std", "min", "max"):
                if sa[key] is not None and sb[key] is not None:
                    row["shift"][key] = human_number(sb[key] - sa[key])
        row["changed"] = any(v not in ("0", "-") for v in row["shift"].values()) or not (sa and sb)
        rows.append(row)
    return rows


def _described(stats: dict[str, Any] | None) -> str:
    if stats is None:
        return "-"
    head = f"{stats['dtype']}{stats['shape']}"
    if stats["mean"] is None:
        return head
    return (f"{head} mean {human_number(stats['mean'])} std {human_number(stats['std'])} "
            f"[{human_number(stats['min'])}, {human_number(stats['max'])}]")
