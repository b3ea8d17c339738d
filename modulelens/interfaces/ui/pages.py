"""What each page shows, as plain data for its template: the repo listing, a capture, its reports,
a diff of two versions. The server's routes and ``modulelens report`` (the self-contained file)
build the same contexts, so the saved file is the page.

Values from a capture stay data here (strings, numbers); the templates escape every one of them
(Jinja2 autoescape), and nothing here builds HTML.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote, urlencode

from modulelens.errors import UsageError
from modulelens.format.human import human_bytes, human_number
from modulelens.interfaces.tensor_info import state_rows, tree_rows
from modulelens.interfaces.ui import charts
from modulelens.interfaces.ui.repo_view import RepoView, StoredCapture
from modulelens.interfaces.value_text import argument_texts, construction_text, python_like, short_class, spec_leaf_paths

SORTS = ("created", "name", "class", "size", "calls")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
PER_PAGE = 500


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
        ``order``, ``page``, ``per_page``; ``per_page=all`` for one page).

        Raises:
            UsageError: a value that is not one of those accepted.
        """
        def number(key: str, default: int) -> int:
            text = params.get(key) or ""
            if text == "all" and key == "per_page":
                return 10**9
            try:
                return int(text) if text else default
            except ValueError:
                raise UsageError(f"{key} must be a number, not {text!r}") from None

        return cls(text=params.get("q", "").strip(), module_class=params.get("class", ""), tag=params.get("tag", ""),
                   since=params.get("since", ""), until=params.get("until", ""), sort=params.get("sort") or "created",
                   descending=params.get("order", "desc") != "asc", page=number("page", 1),
                   per_page=number("per_page", PER_PAGE))

    def params(self, **changes: Any) -> dict[str, str]:
        """This query (with ``changes``) as URL parameters, defaults left out (for links)."""
        query = replace(self, **changes)
        pairs = {"q": query.text, "class": query.module_class, "tag": query.tag, "since": query.since,
                 "until": query.until, "sort": "" if query.sort == "created" else query.sort,
                 "order": "" if query.descending else "asc", "page": "" if query.page == 1 else str(query.page),
                 "per_page": "" if query.per_page == PER_PAGE else ("all" if query.per_page >= 10**9 else str(query.per_page))}
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
    command = job.get("command") or "-"
    return (str(job.get("host") or "-"), command if len(command) <= 60 else command[:57] + "...",
            str(job.get("git_commit") or "-")[:10])


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
    pages = max(1, math.ceil(len(chosen) / query.per_page))
    page = min(query.page, pages)
    shown = chosen[(page - 1) * query.per_page: page * query.per_page]
    tag_links: dict[str, str] = {}  # one link per tag, not one per row (2,000 rows: a third of the page's time)
    for tag in {t for i in shown for t in i.tags}:
        tag_links[tag] = "/?" + urlencode(query.params(tag=tag, page=1))
    rows = [RepoRow(i.ref, "/capture/" + quote(i.ref, safe="/:"), i.aliases, [(t, tag_links[t]) for t in i.tags],
                    short_class(i.module_class), i.module_class, human_bytes(i.nbytes), i.created, i.calls, i.problem,
                    _job_line(view.job(i.ref))) for i in shown]
    return {"title": "captures", "repo": view.location, "rows": rows, "total": len(infos), "matched": len(chosen),
            "page": page, "pages": pages, "classes": classes, "tags": tags, "query": query, "sorts": SORTS,
            "names": len({i.name for i in infos})}


# --------------------------------------------------------------------------------------- capture


@dataclass
class _Section:
    title: str
    rows: list[dict[str, Any]] = field(default_factory=list)


def capture_page(view: RepoView, capture: StoredCapture, *, state: int = 0, histograms: bool = False) -> dict[str, Any]:
    """The capture page of one version.

    Args:
        view: the repo's view (caches of tensor summaries).
        capture: the stored version.
        state: which recorded state's parameters and buffers to show.
        histograms: include the histogram of every call tensor (the self-contained file, which has
            no server to ask when one is clicked); the server sends them on request.

    Raises:
        UsageError: ``state`` is not a recorded state.
    """
    meta = capture.metadata
    module = meta.get("module", {})
    states = meta.get("states") or []
    if states and not 0 <= state < len(states):
        raise UsageError(f"{capture.ref} has states 0-{len(states) - 1}, not {state}")
    construction = (meta.get("constructions") or {}).get(module.get("construction") or "")
    info = capture.info
    params = [_with_summary(view, capture, row) for row in state_rows(capture, state, stats=False)] if states else []
    calls = [_call(view, capture, call, histograms) for call in meta.get("calls", [])]
    versions = view.version_numbers(capture.name)
    earlier = [v for v in versions if v < capture.version]
    return {
        "title": capture.ref, "ref": capture.ref, "name": capture.name, "version": capture.version,
        "aliases": info.aliases, "tags": [str(t) for t in meta.get("tags") or []], "created": info.created,
        "size": human_bytes(info.nbytes),
        "module_class": module.get("class", ""), "cls": short_class(module.get("class", "")),
        "qualified_name": module.get("qualified_name") or "<root>",
        "constructor": construction_text(construction, meta) if construction else None,
        "arguments": list(argument_texts(construction, meta).items()) if construction else [],
        "construction_missing": module.get("construction_missing"),
        "state": state, "states": len(states), "parameters": params,
        "parameter_count": sum(_numel(r["shape"]) for r in params if r.get("role") == "parameter"),
        "calls": calls, "environment": _environment(meta.get("environment") or {}),
        "distributed": sorted((meta.get("distributed") or {}).items()),
        "capture_settings": sorted((k, python_like(v)) for k, v in (meta.get("capture") or {}).items()),
        "user_metadata": sorted((str(k), python_like(v)) for k, v in (meta.get("metadata") or {}).items()),
        "shape_only": list(meta.get("shape_only") or []), "warnings": _warnings(meta),
        "sources": capture.source_texts(), "versions": versions,
        "previous": f"{capture.name}:v{earlier[-1]}" if earlier else None,
        "reports": [_report_line(r) for r in view.reports(capture.ref)],
    }


def _numel(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


def _with_summary(view: RepoView, capture: StoredCapture, row: dict[str, Any]) -> dict[str, Any]:
    if row["kind"] != "tensor":
        return row
    summary = view.summary(capture, row["id"])
    row.update(stats=summary["stats"], sampled=summary["sampled"], stats_error=summary["error"],
               histogram=charts.histogram_bars(summary["histogram"]), size=human_bytes(row["nbytes"]),
               numbers=_stat_numbers(summary["stats"]))
    return row


def _stat_numbers(stats: dict[str, Any] | None) -> dict[str, str]:
    if not stats:
        return {}
    numbers = {k: human_number(stats.get(k)) for k in ("min", "max", "mean", "std")}
    if "fraction_true" in stats:
        numbers["mean"] = f"{stats['fraction_true']:.3g} true"
    numbers["zeros"] = f"{100 * stats['zero_fraction']:.1f}%" if "zero_fraction" in stats else "-"
    numbers["nonfinite"] = str(stats.get("nonfinite", 0))
    return numbers


def _tree(view: RepoView, capture: StoredCapture, tree: Mapping[str, Any] | None, prefix: str,
          histograms: bool) -> list[dict[str, Any]]:
    if not tree:
        return []
    rows = tree_rows(capture, tree, prefix, stats=False, paths=spec_leaf_paths(tree, prefix))
    for row, leaf in zip(rows, tree.get("leaves") or [], strict=True):
        if row["kind"] == "tensor":
            _with_summary(view, capture, row)
            if not histograms:
                row["histogram"] = None
        elif row["kind"] == "value":
            row["value"] = python_like(leaf, capture.metadata, limit=300)
    return rows


def _call(view: RepoView, capture: StoredCapture, call: Mapping[str, Any], histograms: bool) -> dict[str, Any]:
    mode = ("train" if call.get("training") else "eval") + ("" if call.get("grad_enabled", True) else ", no_grad")
    backward = call.get("backward") or {}
    return {
        "index": call.get("index"), "mode": mode, "state": call.get("state"),
        "finished": call.get("finished", True), "error": call.get("error"),
        "autocast": python_like(call.get("autocast")) if call.get("autocast") else None,
        "rng": sorted((call.get("rng") or {}).keys()),
        "inputs": _tree(view, capture, call.get("inputs"), "inputs", histograms),
        "outputs": _tree(view, capture, call.get("output"), "output", histograms),
        "after": _tree(view, capture, call.get("mutated_inputs"), "after", histograms),
        "gradients": [row for part in ("output_grads", "input_grads", "param_grads")
                      for row in _tree(view, capture, backward.get(part), part, histograms)] if backward else [],
        "op_trace": _op_trace(capture, call.get("op_trace")),
    }


_OP_ROWS = 500  # ops listed on a capture page per call (``modulelens show --ops`` lists them all)


def _op_trace(capture: StoredCapture, summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A call's op trace (docs/fidelity.md, "Op traces"): its counts and its first ops, or why it cannot be read."""
    if not isinstance(summary, Mapping):
        return None
    from modulelens.errors import ModulelensError
    from modulelens.format.validate import validate_op_trace
    from modulelens.restore.summary import op_rows

    line = (f"op trace: {summary.get('ops')} ops in {summary.get('modules')} module calls, "
            f"{summary.get('values')} outputs' values kept")
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
        raise UsageError(f"{capture.ref} has no tensor {tid!r}")
    row = _with_summary(view, capture, {"kind": "tensor", "id": tid, "path": tid, "shape": entry["shape"],
                                        "dtype": entry["dtype"], "nbytes": entry["nbytes"],
                                        "shape_only": bool(entry.get("shape_only"))})
    return {"ref": capture.ref, "row": row}


def _environment(env: Mapping[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for key, value in sorted(env.items()):
        if key == "argv" and isinstance(value, list):
            rows.append(("command", " ".join(str(a) for a in value)))
        else:
            rows.append((str(key), value if isinstance(value, str) else python_like(value)))
    return rows


def _warnings(meta: Mapping[str, Any]) -> list[str]:
    """What a reader of this capture should know: incomplete records, missing constructor,
    values that were not recorded, calls that raised, tensors kept shape-only."""
    found = []
    settings = meta.get("capture") or {}
    if settings.get("complete") is False:
        found.append("the capture is incomplete: the job ended (or saving stopped) before every requested call was recorded")
    missing = (meta.get("module") or {}).get("construction_missing")
    if missing:
        found.append(f"constructor not recorded: {missing}")
    for entry in meta.get("unrecorded") or []:
        found.append(f"not recorded: {entry.get('path')} ({entry.get('type')}): {entry.get('reason')}")
    for call in meta.get("calls") or []:
        if not call.get("finished", True):
            found.append(f"call {call.get('index')} raised in the original job: {call.get('error') or 'no message'}")
    shape_only = meta.get("shape_only") or []
    if shape_only:
        found.append(f"{len(shape_only)} tensor(s) stored shape-only (dtype, shape and statistics, no values): "
                     + ", ".join(map(str, shape_only[:8])) + (" ..." if len(shape_only) > 8 else ""))
    return found


# --------------------------------------------------------------------------------------- reports


def _report_line(report: Mapping[str, Any]) -> dict[str, Any]:
    return {"kind": str(report.get("kind", "?")), "created": str(report.get("created", "")),
            "passed": report.get("passed") if isinstance(report.get("passed"), bool) else None}


def reports_page(view: RepoView, capture: StoredCapture) -> dict[str, Any]:
    """The reports stored with one version, newest first, with their plots."""
    reports = view.reports(capture.ref)
    shown = [_report(view, r) for r in reports]
    paths = tuple(str(r.get("path", "")) for r in reports)
    history = view.drawn(("history", *paths), lambda: _plot(charts.history_plot, reports))
    return {"title": f"reports of {capture.ref}", "ref": capture.ref, "name": capture.name,
            "report_list": shown, "history_plot": history}


def _plot(draw: Any, *args: Any) -> str | dict[str, str] | None:
    """A plot's data URI, or ``{"error": ...}`` when it cannot be drawn (matplotlib missing)."""
    try:
        return draw(*args)
    except ImportError:
        return {"error": "plots need matplotlib: pip install 'modulelens[ui]'"}


def _report(view: RepoView, report: Mapping[str, Any]) -> dict[str, Any]:
    kind = str(report.get("kind", "?"))
    shown: dict[str, Any] = {**_report_line(report), "file": str(report.get("path", "")).rsplit("/", 1)[-1],
                             "facts": [], "tables": [], "plot": None, "notes": [str(n) for n in report.get("notes") or []],
                             "json": json.dumps({k: v for k, v in report.items() if k != "path"}, indent=1,
                                                default=str)[:200_000]}
    if kind == "profile" and isinstance(report.get("latency"), dict):
        lat, memory = report["latency"], report.get("memory") or {}
        shown["facts"] = [
            ("latency", f"median {human_number(lat.get('median_ms'))} ms (p10 {human_number(lat.get('p10_ms'))}, "
                        f"p90 {human_number(lat.get('p90_ms'))}, {lat.get('iterations')} iterations)"),
            ("device", f"{report.get('device')} ({report.get('mode')})"),
            ("peak memory", "-" if memory.get("peak_bytes") is None else human_bytes(memory["peak_bytes"])),
            ("FLOPs", human_number((report.get("flops") or {}).get("total"))),
            ("bytes moved", human_bytes((report.get("bytes_moved") or {}).get("total") or 0)),
            ("achieved", human_number(report.get("achieved_flops_per_s"), "FLOP/s")),
            ("arithmetic intensity", human_number(report.get("arithmetic_intensity"), "FLOP/byte")),
        ]
        shown["tables"].append(_table("top operators", ("operator", "self ms / iter", "%"),
                                      [(op.get("name"), human_number(op.get("self_ms_per_iter")), human_number(op.get("percent")))
                                       for op in report.get("top_ops") or [] if isinstance(op, dict)]))
        shown["tables"].append(_table("batch sizes", ("batch", "median ms", "p10", "p90", "samples/s", "FLOP/s"),
                                      [(r.get("batch_size"), human_number(r.get("median_ms")) if r.get("median_ms") is not None
                                        else r.get("error", ""), human_number(r.get("p10_ms")), human_number(r.get("p90_ms")),
                                        human_number(r.get("throughput_per_s")), human_number(r.get("achieved_flops_per_s")))
                                       for r in report.get("batch_sweep") or [] if isinstance(r, dict)]))
        shown["plot"] = view.drawn(("sweep", str(report.get("path", ""))), lambda: _plot(charts.sweep_plot, dict(report)))
    elif isinstance(report.get("calls"), list):
        rows = []
        for c in report["calls"]:
            if not isinstance(c, dict):
                continue
            verdict = c.get("passed", c.get("status"))
            rows.append((c.get("index"), "pass" if verdict is True else "FAIL" if verdict is False else str(verdict),
                         human_number(c.get("max_abs_error")), human_number(c.get("max_rel_error")),
                         human_number(c.get("max_ulps")), c.get("error") or c.get("detail") or ""))
        shown["tables"].append(_table("calls", ("call", "result", "max abs err", "max rel err", "max ULPs", "detail"), rows))
        shown["tables"].append(_divergence_table([(c.get("index"), c.get("divergence")) for c in report["calls"]
                                                  if isinstance(c, dict)]))
    if isinstance(report.get("divergence"), dict) and not isinstance(report.get("calls"), list):  # kernel verify
        shown["tables"].append(_divergence_table([(report["divergence"].get("sample"), report["divergence"])]))
        for key in ("candidate", "device", "mode", "speedup", "status"):
            if key in report:
                shown["facts"].append((key, python_like(report[key]) if not isinstance(report[key], str) else report[key]))
        shown["notes"] += [f"failure: {f}" for f in report.get("failures") or []]
    shown["tables"] = [t for t in shown["tables"] if t["rows"]]
    return shown


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


def _mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one (a stored report is JSON of any shape)."""
    return value if isinstance(value, Mapping) else {}


def _table(title: str, headers: tuple[str, ...], rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    return {"title": title, "headers": headers, "rows": [["" if c is None else str(c) for c in row] for row in rows]}


# ------------------------------------------------------------------------------------------ diff


def diff_page(view: RepoView, a: StoredCapture, b: StoredCapture) -> dict[str, Any]:
    """Two versions side by side: constructor, per-tensor weight drift, input and output statistics.

    Weights are compared from the memory-mapped payloads a chunk at a time
    (:func:`modulelens.tools.diff.tensor_changes`); inputs and outputs by their recorded
    statistics, pooled over each capture's calls. Running B's module on A's inputs is an action
    (``--allow-run``): it rebuilds a module.
    """
    from modulelens.tools.diff import tensor_changes

    ma, mb = a.metadata, b.metadata
    ca = (ma.get("constructions") or {}).get(ma["module"].get("construction") or "")
    cb = (mb.get("constructions") or {}).get(mb["module"].get("construction") or "")
    args_a = argument_texts(ca, ma) if ca else {}
    args_b = argument_texts(cb, mb) if cb else {}
    constructor = [{"argument": k, "a": args_a.get(k, "-"), "b": args_b.get(k, "-"), "changed": args_a.get(k) != args_b.get(k)}
                   for k in dict.fromkeys([*args_a, *args_b])]
    tensors = [{**t, "max_abs": human_number(t["max_abs_diff"]), "rel": human_number(t["rel_norm"])}
               for t in tensor_changes(a, b)]
    return {
        "title": f"diff {a.ref} → {b.ref}", "a": a.ref, "b": b.ref,
        "class_a": ma["module"].get("class", ""), "class_b": mb["module"].get("class", ""),
        "constructor": constructor, "constructor_missing": [r.ref for r, c in ((a, ca), (b, cb)) if not c],
        "tensors": tensors, "identical": sum(t["status"] == "same" for t in tensors),
        "inputs": _drift(view, a, b, "inputs"), "outputs": _drift(view, a, b, "output"),
    }


def _pooled(view: RepoView, capture: StoredCapture, part: str) -> dict[str, dict[str, Any]]:
    """Per leaf path, statistics pooled over every recorded call (from each tensor's summary)."""
    pooled: dict[str, dict[str, Any]] = {}
    for call in capture.metadata.get("calls", []):
        tree = call.get("inputs" if part == "inputs" else "output")
        if not tree:
            continue
        for row in tree_rows(capture, tree, part, stats=False, paths=spec_leaf_paths(tree, part)):
            if row["kind"] != "tensor":
                continue
            stats = view.summary(capture, row["id"])["stats"] or {}
            into = pooled.setdefault(row["path"], {"shape": row["shape"], "dtype": row["dtype"], "n": 0, "sum": 0.0,
                                                   "sq": 0.0, "min": math.inf, "max": -math.inf})
            count = (stats.get("numel") or 0) - (stats.get("nonfinite") or 0)
            if "mean" not in stats or not count:
                continue
            into["n"] += count
            into["sum"] += stats["mean"] * count
            into["sq"] += (stats["std"] ** 2 + stats["mean"] ** 2) * count
            into["min"] = min(into["min"], stats["min"])
            into["max"] = max(into["max"], stats["max"])
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
