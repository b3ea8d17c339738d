"""What the main pages show, as plain data for their templates: the repo listing (and its live job
column), a capture, one of its calls, a tensor's histogram. The server's routes and ``modulelens
report`` (the self-contained file) build the same contexts, so the saved file is the page. The
other pages have their own modules: a name's page and a capture's lineage, snippets and notes
(:mod:`.home`), the reports (:mod:`.report_pages`), the diff (:mod:`.diff_page`).

Every page is bounded whatever the capture holds (:mod:`.shown`, docs/ui.md "Limits"). Values from
a capture stay data here (strings, numbers); the templates escape every one of them (Jinja2
autoescape), and nothing here builds HTML.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from modulelens.errors import UsageError
from modulelens.format.human import human_bytes, human_number
from modulelens.interfaces.tensor_info import SAMPLE_ELEMENTS, state_rows, tree_rows
from modulelens.interfaces.ui import charts
from modulelens.interfaces.ui.home import capture_home, name_href
from modulelens.interfaces.ui.repo_view import Listing, RepoView, StoredCapture
from modulelens.interfaces.ui.report_pages import report_line
from modulelens.interfaces.ui.shown import (
    CALLS_PER_PAGE,
    LEAVES_PER_PAGE,
    LEAVES_PREVIEW,
    LISTED,
    MAX_PER_PAGE,
    PAGE_SAMPLE_ELEMENTS,
    PARAMETERS_PER_PAGE,
    PER_PAGE,
    REPORTS_LISTED,
    SOURCE_LIMIT,
    SOURCES_SHOWN,
    STANDALONE_HISTOGRAMS,
    TEXT_LIMIT,
    Window,
    as_text,
    href_with,
    listed,
    mapping_or_empty,
    page_in_link,
    page_param,
    real_number,
    shown_pairs,
)
from modulelens.interfaces.value_text import argument_texts, construction_text, python_like, short_class, spec_leaf_window
from modulelens.repo.reports import VersionReports

SORTS = ("created", "name", "class", "size", "calls")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")

# ------------------------------------------------------------------------------------------ repo

if TYPE_CHECKING:
    from modulelens.repo import VersionInfo


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
    name_href: str
    aliases: tuple[str, ...]
    tags: list[tuple[str, str]]
    cls: str
    class_path: str
    size: str
    created: str
    calls: int
    problem: str | None
    job: dict[str, str] | None  # host, command, commit (None until read, or unreadable)
    job_pending: bool  # not read yet: the page asks again (job_cells) until it is
    job_cell: str  # the id of its job cell (job_cells replaces it by this id)


def _job_cell(ref: str) -> str:
    """The id of a version's job cell: a digest of its ref, so a cell is found by its version even
    when versions saved meanwhile moved the rows."""
    return "job-" + hashlib.blake2s(ref.encode(), digest_size=8).hexdigest()


def _matching(view: RepoView, query: RepoQuery) -> tuple[Listing, list[VersionInfo], Window]:
    """Every version, the ones matching ``query`` in its order (worked out once per listing), and
    the window of its page."""
    listing = view.listing()
    key = (query.text, query.module_class, query.tag, query.since, query.until, query.sort, query.descending)
    chosen = listing.chosen(key, functools.partial(_search, query))
    return listing, chosen, Window.of(len(chosen), query.page, query.per_page)


def _search(query: RepoQuery, infos: list[VersionInfo]) -> list[VersionInfo]:
    """The versions of ``infos`` that match ``query``, in its order."""
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
    return chosen


def repo_page(view: RepoView, query: RepoQuery) -> dict[str, Any]:
    """The repo page: every version matching ``query``, from the listing summaries alone."""
    listing, chosen, window = _matching(view, query)
    shown = chosen[window.start:window.stop]
    tag_links: dict[str, str] = {}  # one link per tag, not one per row (2,000 rows: a third of the page's time)
    for tag in {t for i in shown for t in i.tags}:
        tag_links[tag] = "/?" + urlencode(query.params(tag=tag, page=1))
    name_links = {name: name_href(name) for name in {i.name for i in shown}}
    rows = [RepoRow(i.ref, "/capture/" + quote(i.ref, safe="/:"), name_links[i.name], i.aliases,
                    [(t, tag_links[t]) for t in i.tags], short_class(i.module_class), i.module_class,
                    human_bytes(i.nbytes), i.created, i.calls, i.problem, view.job_line(i.ref), view.job_pending(i.ref),
                    _job_cell(i.ref))
            for i in shown]
    pager = window.links(lambda p: "/?" + urlencode(query.params(page=p)))
    return {"title": "captures", "repo": view.location, "rows": rows, "total": len(listing.infos), "matched": len(chosen),
            "page": window.page, "pages": window.pages, "pager": pager, "classes": listing.classes[:MAX_PER_PAGE],
            "tags": listing.tags[:MAX_PER_PAGE], "query": query, "sorts": SORTS, "names": listing.names,
            "max_per_page": MAX_PER_PAGE, "jobs_pending": any(r.job_pending for r in rows),
            "job_cells_href": "/job-cells" + ("?" + urlencode(query.params()) if query.params() else "")}


def job_cells(view: RepoView, query: RepoQuery) -> dict[str, Any]:
    """The job column of the repo page ``query`` shows, as it is known now: the page asks for it
    every two seconds while a cell is still pending (a version saved after the server started is
    read by another scan), and stops once none is."""
    _, chosen, window = _matching(view, query)
    shown = chosen[window.start:window.stop]
    cells = [(_job_cell(i.ref), view.job_line(i.ref), view.job_pending(i.ref)) for i in shown]
    return {"cells": [(cell, job) for cell, job, pending in cells if not pending],
            "pending": any(pending for _, _, pending in cells),
            "job_cells_href": "/job-cells" + ("?" + urlencode(query.params()) if query.params() else "")}


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
        return {"state": query.state or None, "calls": page_in_link(query.calls_page), "parameters": page_in_link(query.parameters_page)}


def capture_page(view: RepoView, capture: StoredCapture, query: CaptureQuery | None = None, *,
                 histograms: bool = False, reports: VersionReports | None = None) -> dict[str, Any]:
    """The capture page of one version.

    Args:
        view: the repo's view (caches of tensor summaries).
        capture: the stored version.
        query: which recorded state's parameters, and which page of calls and of parameters.
        histograms: include the histogram of the call tensors shown (the self-contained file,
            which has no server to ask when one is clicked; at most :data:`STANDALONE_HISTOGRAMS`).
        reports: the version's reports, when the caller has listed them (:meth:`RepoView.reports`).

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
    call_window = Window.of(capture.call_count, query.calls_page, CALLS_PER_PAGE)
    budget = [STANDALONE_HISTOGRAMS] if histograms else None
    shown_calls = [_call(view, capture, position, capture.call(position), LEAVES_PREVIEW, {}, budget)
                   for position in range(call_window.start, call_window.stop)]
    versions = view.version_numbers(capture.name)
    earlier = [v for v in versions if v < capture.version]
    stored = reports if reports is not None else view.reports(capture.name, capture.version)
    found, report_problems = stored.read(0, max(LISTED, REPORTS_LISTED))  # the newest: all the page names
    arguments = list(argument_texts(construction, meta).items()) if construction else []
    later = [v for v in versions if v > capture.version]
    return {
        **capture_home(view, capture, found, len(stored)),  # aliases, tags, notes, lineage, snippets
        "title": capture.ref, "ref": capture.ref, "name": capture.name, "version": capture.version,
        "created": info.created, "size": human_bytes(info.nbytes),
        "module_class": as_text(module.get("class", ""), 500), "cls": short_class(module.get("class", "")),
        "qualified_name": as_text(module.get("qualified_name") or "<root>", 500),
        "constructor": as_text(construction_text(construction, meta), 4 * TEXT_LIMIT) if construction else None,
        "arguments": [(as_text(k, 200), as_text(v)) for k, v in arguments[:LISTED]],
        "arguments_more": max(len(arguments) - LISTED, 0),
        "construction_missing": as_text(module.get("construction_missing")) if module.get("construction_missing") else None,
        "state": query.state, "states": len(states), "state_links": [(str(s), href_with(base, here, state=s or None))
                                                                     for s in range(min(len(states), LISTED))],
        "parameters": parameters, "parameter_count": parameter_count,
        "parameters_counted": parameter_window.counted("parameters and buffers") if parameter_window else "",
        "parameters_pager": parameter_window.links(lambda p: href_with(base, here, parameters=page_in_link(p))) if parameter_window else [],
        "calls": shown_calls, "call_count": capture.call_count, "calls_counted": call_window.counted("recorded calls"),
        "calls_pager": call_window.links(lambda p: href_with(base, here, calls=page_in_link(p))),
        "environment": _environment(meta.get("environment") or {}),
        "distributed": shown_pairs(meta.get("distributed")),
        "capture_settings": shown_pairs(meta.get("capture")),
        "user_metadata": shown_pairs(meta.get("metadata")),
        "shape_only": listed(meta.get("shape_only") or []), "warnings": _warnings(capture),
        "sources": _sources(capture), "versions": versions[-LISTED:], "versions_more": max(len(versions) - LISTED, 0),
        "previous": f"{capture.name}:v{earlier[-1]}" if earlier else None,
        "next": f"{capture.name}:v{later[0]}" if later else None,
        "reports": [report_line(r) for r in found[:REPORTS_LISTED]], "report_count": len(stored),
        "report_problems": listed(report_problems, 10),
    }


def _parameters(view: RepoView, capture: StoredCapture,
                query: CaptureQuery) -> tuple[list[dict[str, Any]], Window, int]:
    state = capture.metadata["states"][query.state]
    tensors = capture.metadata["tensors"]
    count = sum(_numel(tensors[e["tensor"]]["shape"]) for e in state["parameters"].values())
    window = Window.of(len(state["parameters"]) + len(state["buffers"]), query.parameters_page, PARAMETERS_PER_PAGE)
    rows = state_rows(capture, query.state, stats=False, limit=window.stop)[window.start:]
    limit = _shared_sample(sum(row["kind"] == "tensor" for row in rows))
    return [_with_summary(view, capture, row, limit=limit) for row in rows], window, count


def _shared_sample(tensors: int) -> int:
    """Values sampled from each of ``tensors`` tensors on one page: :data:`~.shown.PAGE_SAMPLE_ELEMENTS`
    shared among them, at most :data:`~modulelens.interfaces.tensor_info.SAMPLE_ELEMENTS` each."""
    return max(1, min(SAMPLE_ELEMENTS, PAGE_SAMPLE_ELEMENTS // max(tensors, 1)))


def _numel(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


def _with_summary(view: RepoView, capture: StoredCapture, row: dict[str, Any], histogram: bool = True,
                  limit: int | None = None) -> dict[str, Any]:
    if row["kind"] != "tensor":
        return row
    summary = view.summary(capture, row["id"], limit)
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
    numbers = {k: human_number(real_number(stats.get(k))) for k in ("min", "max", "mean", "std")}
    if real_number(stats.get("fraction_true")) is not None:
        numbers["mean"] = f"{stats['fraction_true']:.3g} true"
    zeros = real_number(stats.get("zero_fraction"))
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
          ("buffers_after", "buffers after the call (changed by it)", "buffers"),
          ("output_grads", "gradients of the output", "output_grads"),
          ("input_grads", "gradients of the inputs", "input_grads"),
          ("param_grads", "gradients of the parameters", "param_grads"))


def _trees(call: Mapping[str, Any]) -> dict[str, Any]:
    backward = mapping_or_empty(call.get("backward"))
    return {"inputs": call.get("inputs"), "output": call.get("output"), "after": call.get("mutated_inputs"),
            "buffers_after": call.get("buffers_after"),
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
        "position": position, "index": as_text(call.get("index"), 40), "mode": mode, "state": as_text(call.get("state"), 40),
        "finished": call.get("finished", True) is not False, "error": as_text(call.get("error") or "", 1000),
        "autocast": as_text(call.get("autocast"), 300) if call.get("autocast") else None,
        "rng": sorted(str(k) for k in rng)[:LISTED] if isinstance(rng, dict) else [],
        "parts": parts, "href": call_href,
        "op_trace": _op_trace(capture, call.get("op_trace"), listed=per_page != LEAVES_PREVIEW),
    }


def _part_href(call_href: str, params: Mapping[str, Any], key: str) -> Callable[[int], str]:
    """Links to the pages of one tree of a call page (the other trees stay on their pages)."""
    return lambda page: href_with(call_href, params, **{key: page_in_link(page)}) + f"#{key}"


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
            row["value"] = as_text(python_like(leaf, capture.metadata, limit=300), 300)
        else:
            row["type"], row["reason"] = as_text(row.get("type"), 200), as_text(row.get("reason"), 500)
    return rows


def call_page(view: RepoView, capture: StoredCapture, position: int, params: Mapping[str, str]) -> dict[str, Any]:
    """One recorded call with every leaf of its trees, :data:`LEAVES_PER_PAGE` at a time (``?inputs=2``...).

    Raises:
        UsageError: no call at ``position``, or a page that is not a number.
    """
    count = capture.call_count
    if not 0 <= position < count:
        raise UsageError(f"{capture.ref} has calls 0-{count - 1}, not {position}" if count
                         else f"{capture.ref} has no recorded calls")
    pages = {key: page_param(params, key) for key, _, _ in _PARTS}
    call = _call(view, capture, position, capture.call(position), LEAVES_PER_PAGE, pages, None,
                 params={key: page_in_link(page) for key, page in pages.items()})
    return {"title": f"call {call['index']} of {capture.ref}", "ref": capture.ref, "call": call,
            "call_count": count, "previous": position - 1 if position else None,
            "next": position + 1 if position + 1 < count else None}


_OP_ROWS = 500  # ops listed on a call's page (``modulelens show --ops`` lists them all)


def _op_trace(capture: StoredCapture, summary: Mapping[str, Any] | None, *, listed: bool) -> dict[str, Any] | None:
    """A call's op trace (docs/fidelity.md, "Op traces"): its counts, and (``listed``: on the call's
    page) its first ops, or why it cannot be read. The capture page shows the counts only: 20 calls
    of 500 ops each were 10,000 rows, and each trace a blob to read."""
    if not isinstance(summary, Mapping):
        return None
    from modulelens.errors import ModulelensError
    from modulelens.format.validate_trace import validate_op_trace
    from modulelens.restore.summary import op_rows

    line = (f"op trace: {as_text(summary.get('ops'), 20)} ops in {as_text(summary.get('modules'), 20)} module calls, "
            f"{as_text(summary.get('values'), 20)} outputs' values kept")
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
    rows = shown_pairs({k: v for k, v in env.items() if k != "argv"})
    argv = env.get("argv")
    if isinstance(argv, list):
        rows.insert(0, ("command", as_text(" ".join(str(a) for a in argv[:1000]))))
    return rows


def _warnings(capture: StoredCapture) -> list[str]:
    """What a reader of this capture should know: incomplete records, missing constructor,
    values that were not recorded, calls that raised, tensors kept shape-only (each list bounded)."""
    meta = capture.metadata
    found = []
    settings = meta.get("capture") or {}
    if isinstance(settings, dict) and settings.get("complete") is False:
        found.append("the capture is incomplete: the job ended (or saving stopped) before every requested call was recorded")
    missing = (meta.get("module") or {}).get("construction_missing")
    if missing:
        found.append(f"constructor not recorded: {as_text(missing, 500)}")
    unrecorded = meta.get("unrecorded") or []
    for entry in unrecorded[:LISTED]:
        entry = entry if isinstance(entry, dict) else {"path": entry}
        found.append(f"not recorded: {as_text(entry.get('path'), 200)} ({as_text(entry.get('type'), 200)}): "
                     f"{as_text(entry.get('reason'), 500)}")
    if len(unrecorded) > LISTED:
        found.append(f"… and {len(unrecorded) - LISTED:,} more values not recorded")
    # one pass over the records without checking them (50,000 calls: milliseconds); the calls listed
    # are checked as any call a page shows (a damaged one is refused, naming its field)
    raised = [i for i, call in enumerate(meta["calls"]) if isinstance(call, dict) and call.get("finished", True) is False]
    for call in (capture.call(i) for i in raised[:LISTED]):
        found.append(f"call {as_text(call.get('index'), 40)} raised in the original job: {as_text(call.get('error') or 'no message', 500)}")
    if len(raised) > LISTED:
        found.append(f"… and {len(raised) - LISTED:,} more calls that raised")
    shape_only = meta.get("shape_only") or []
    if shape_only:
        found.append(f"{len(shape_only):,} tensor(s) stored shape-only (dtype, shape and statistics, no values): "
                     + ", ".join(as_text(p, 100) for p in shape_only[:8]) + (" ..." if len(shape_only) > 8 else ""))
    return found


def _sources(capture: StoredCapture) -> list[dict[str, Any]]:
    texts = capture.source_texts(SOURCES_SHOWN)
    shown = []
    for source in texts:
        text = source["text"]
        if len(text) > SOURCE_LIMIT:
            text = text[:SOURCE_LIMIT] + f"\n… ({len(text) - SOURCE_LIMIT:,} more characters not shown)"
        shown.append({"module": as_text(source["module"], 300), "file": as_text(source["file"], 500), "text": text,
                      "classes": listed(source["classes"], 20)})
    count = len(capture.metadata.get("sources") or {})
    if count > SOURCES_SHOWN:
        shown.append({"module": "…", "file": f"{count - SOURCES_SHOWN:,} more stored source files not shown",
                      "text": "", "classes": []})
    return shown


