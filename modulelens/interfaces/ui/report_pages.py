"""The reports stored with a version, as page data: each kind rendered as what it says (a replay or
verify report's calls and first divergence, a profile's facts and plots, a kernel candidate's
verdict, samples, timings and static check), never as raw JSON alone (the stored JSON is one
click away, bounded).

Reports travel with push and pull, so a report may come from anyone: every field is read through
the helpers of :mod:`.shown` (a value of an unexpected type shows as text or ``-``, never fails
the page), every table is bounded (:data:`~.shown.REPORT_ROWS`), and every number goes through the
one formatter (``speedup 0.69x``, ``1.23 ms``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from modulelens.interfaces.ui import charts
from modulelens.interfaces.ui.repo_view import RepoView, StoredCapture
from modulelens.interfaces.ui.shown import (
    PLOTTED_PROFILES,
    REPORT_JSON,
    REPORT_ROWS,
    REPORTS_PER_PAGE,
    SWEEP_PLOTS,
    Window,
    as_text,
    href_with,
    listed,
    mapping_or_empty,
    objects_in,
    page_in_link,
    real_number,
    shown_bytes,
    shown_ms,
    shown_number,
    shown_percent,
    shown_ratio,
    when,
)
from modulelens.repo.reports import VersionReports

_VERDICTS = ("PASS", "FAIL", "UNVERIFIED")


def report_line(report: Mapping[str, Any]) -> dict[str, Any]:
    """One report in a list: its kind, when, its verdict (``passed``: ``None`` when it has none)."""
    passed = report.get("passed") if isinstance(report.get("passed"), bool) else None
    status = report.get("status") if report.get("status") in _VERDICTS else None
    candidate = mapping_or_empty(report.get("candidate"))
    return {"kind": as_text(report.get("kind", "?"), 40), "created": when(report.get("created", "")),
            "passed": None if status == "UNVERIFIED" else passed,
            "verdict": status or ("passed" if passed else "failed" if passed is False else None),
            "file": str(report.get("path", "")).replace("\\", "/").rsplit("/", 1)[-1],
            "about": as_text(candidate.get("path", "").rsplit("/", 1)[-1] if isinstance(candidate.get("path"), str)
                             else report.get("candidate") if isinstance(report.get("candidate"), str) else "", 200)}


def report_anchor(line: Mapping[str, Any]) -> str:
    """The id of a report's section on the reports page (its file name, which is unique per version)."""
    return "report-" + quote(str(line.get("file", "")), safe="")


def reports_page(view: RepoView, capture: StoredCapture, page: int = 1, *,
                 found: VersionReports | None = None) -> dict[str, Any]:
    """The reports stored with one version, newest first, :data:`~.shown.REPORTS_PER_PAGE` at a time,
    with their plots; reports that are not reports (damaged, hostile) are named, not shown. Only
    the files of the page are read and checked, and the newest :data:`~.shown.PLOTTED_PROFILES`
    profile reports for the history figure; the others are counted by name.
    ``found``: the version's reports, when the caller has listed them."""
    stored = found if found is not None else view.reports(capture.name, capture.version)
    window = Window.of(len(stored), page, REPORTS_PER_PAGE)
    plots = [SWEEP_PLOTS]
    reports, problems = stored.read(window.start, window.stop)
    shown = [_report(view, r, plots) for r in reports]
    newest, _ = stored.read(0, PLOTTED_PROFILES, kind="profile")  # (a damaged one: named where its page shows it)
    profiles = [r for r in newest if r.get("kind") == "profile" and isinstance(r.get("latency"), dict)]
    paths = tuple(str(r.get("path", "")) for r in profiles)
    history = view.drawn(("history", *paths), lambda: _plot(charts.history_plot, profiles))
    base = f"/capture/{quote(capture.ref, safe='/:')}/reports"
    named = stored.count("profile")
    return {"title": f"reports of {capture.ref}", "ref": capture.ref, "name": capture.name,
            "report_list": shown, "history_plot": history, "report_count": len(stored),
            "reports_counted": window.counted("reports"),
            "reports_pager": window.links(lambda p: href_with(base, {}, page=page_in_link(p))),
            "history_counted": f"the newest {len(profiles)} of {named:,} profile reports" if named > PLOTTED_PROFILES else "",
            "report_problems": listed(problems, 20)}


def _plot(draw: Callable[..., str | None], *args: object) -> str | dict[str, str] | None:
    """A plot's data URI, or ``{"error": ...}`` when it cannot be drawn."""
    try:
        return draw(*args)
    except ImportError:
        return {"error": "plots need matplotlib: pip install 'modulelens[ui]'"}
    except Exception as error:  # matplotlib on stored numbers (any of its errors): the page shows the rest
        return {"error": f"plot not drawn: {type(error).__name__}: {as_text(str(error), 200)}"}


def _report(view: RepoView, report: Mapping[str, Any], plots: list[int]) -> dict[str, Any]:
    kind = as_text(report.get("kind", "?"), 40)
    text = json.dumps({k: v for k, v in report.items() if k != "path"}, indent=1, default=str)
    if len(text) > REPORT_JSON:
        text = text[:REPORT_JSON] + f"\n… ({len(text) - REPORT_JSON:,} more characters: the file {report.get('path', '')})"
    line = report_line(report)
    shown: dict[str, Any] = {**line, "anchor": report_anchor(line), "facts": [], "tables": [], "plot": None,
                             "notes": listed(report.get("notes") or [], 20), "problems": [], "json": text}
    if kind == "profile" and isinstance(report.get("latency"), dict):
        _profile(view, report, shown, plots)
    elif kind == "kernel":
        _kernel(report, shown)
    elif isinstance(report.get("calls"), list):
        _calls(report, shown)
    if isinstance(report.get("divergence"), dict) and not isinstance(report.get("calls"), list):  # kernel verify
        shown["tables"].append(_divergence_table([(report["divergence"].get("sample"), report["divergence"])]))
    shown["tables"] = [t for t in shown["tables"] if t["rows"]]
    return shown


def _profile(view: RepoView, report: Mapping[str, Any], shown: dict[str, Any], plots: list[int]) -> None:
    lat, memory = report["latency"], mapping_or_empty(report.get("memory"))
    flops, moved = mapping_or_empty(report.get("flops")), mapping_or_empty(report.get("bytes_moved"))
    shown["facts"] = [
        ("latency", f"median {shown_ms(lat.get('median_ms'))} (p10 {shown_ms(lat.get('p10_ms'))}, "
                    f"p90 {shown_ms(lat.get('p90_ms'))}, {as_text(lat.get('iterations'), 20)} iterations)"),
        ("device", f"{as_text(report.get('device'), 200)} ({as_text(report.get('mode'), 200)})"),
        ("peak memory", shown_bytes(memory.get("peak_bytes"))),
        ("FLOPs", shown_number(flops.get("total"), "FLOP")),
        ("bytes moved", shown_bytes(moved.get("total"))),
        ("achieved", shown_number(report.get("achieved_flops_per_s"), "FLOP/s")),
        ("arithmetic intensity", shown_number(report.get("arithmetic_intensity"), "FLOP/byte")),
    ]
    shown["tables"].append(_table("top operators", ("operator", "self time / iter", "share"),
                                  [(op.get("name"), shown_ms(op.get("self_ms_per_iter")), shown_percent(op.get("percent")))
                                   for op in objects_in(report.get("top_ops"))]))
    sweep = objects_in(report.get("batch_sweep"))
    shown["tables"].append(_table("batch sizes", ("batch", "median", "p10", "p90", "samples/s", "FLOP/s"),
                                  [(r.get("batch_size"), shown_ms(r.get("median_ms")) if r.get("median_ms") is not None
                                    else r.get("error", ""), shown_ms(r.get("p10_ms")), shown_ms(r.get("p90_ms")),
                                    shown_number(r.get("throughput_per_s")), shown_number(r.get("achieved_flops_per_s")))
                                   for r in sweep]))
    if sweep and plots[0] > 0:
        plots[0] -= 1
        shown["plot"] = view.drawn(("sweep", str(report.get("path", ""))), lambda: _plot(charts.sweep_plot, dict(report)))
    elif sweep:
        shown["notes"].append(f"sweep plot not drawn here (only the first {SWEEP_PLOTS} on a page are): the table has its numbers")


def _calls(report: Mapping[str, Any], shown: dict[str, Any]) -> None:
    """A replay, verify or diverge report: one row per call, the first divergence of each that has one."""
    rows = []
    for c in objects_in(report["calls"]):
        verdict = c.get("status", c.get("passed"))
        rows.append((c.get("index"), "pass" if verdict in (True, "pass") else "FAIL" if verdict in (False, "fail")
                     else as_text(verdict, 40), shown_number(c.get("max_abs_error")), shown_number(c.get("max_rel_error")),
                     shown_number(c.get("max_ulps")), c.get("error") or c.get("detail") or ""))
    shown["tables"].append(_table("calls", ("call", "result", "max abs err", "max rel err", "max ULPs", "detail"), rows))
    shown["tables"].append(_divergence_table([(c.get("index"), c.get("divergence")) for c in objects_in(report["calls"])]))
    for key in ("candidate", "device", "mode"):
        if key in report:
            shown["facts"].append((key, as_text(report[key], 500)))
    if "speedup" in report:
        shown["facts"].append(("speedup", shown_ratio(report["speedup"])))
    shown["problems"] += [f"cannot verify: {line}" for line in listed(report.get("unverified") or [], 20)]
    shown["problems"] += listed(report.get("failures") or [], 20)


def _kernel(report: Mapping[str, Any], shown: dict[str, Any]) -> None:
    """``modulelens kernel verify``'s report (kernels/verify.py): the candidate, its verdict per
    sample, the timings and speedups, the static check, what needs a human's review."""
    candidate = mapping_or_empty(report.get("candidate"))
    correctness, timing = mapping_or_empty(report.get("correctness")), mapping_or_empty(report.get("timing"))
    static, runtime = mapping_or_empty(report.get("static")), mapping_or_empty(report.get("runtime"))
    facts = [("candidate", as_text(candidate.get("path", "-"), 500)),
             ("entry, backend", f"{as_text(candidate.get('entry') or '-', 60)}, {as_text(candidate.get('backend') or '-', 60)}"),
             ("source hash", as_text(candidate.get("hash", "-"), 80)),
             ("device", as_text(runtime.get("device_name") or runtime.get("device") or "-", 200))]
    if correctness:
        facts.append(("correctness", f"{as_text(correctness.get('passed_samples', '-'), 20)} of "
                                     f"{as_text(correctness.get('samples', '-'), 20)} samples pass "
                                     f"({as_text(correctness.get('recorded_samples', 0), 20)} recorded calls, "
                                     f"{as_text(correctness.get('random_samples', 0), 20)} random inputs"
                                     + (f", {as_text(correctness['skipped_samples'], 20)} skipped"
                                        if correctness.get("skipped_samples") else "") + ")"))
    if timing.get("measured") is True:
        spread = (f" (p10 {shown_ratio(timing.get('speedup_p10'))}, p90 {shown_ratio(timing.get('speedup_p90'))})"
                  if real_number(timing.get("speedup_p10")) is not None else "")
        facts.append(("speedup", f"{shown_ratio(timing.get('speedup_geomean'))} geometric mean over "
                                 f"{as_text(timing.get('speedup_samples', 0), 20)} passing samples{spread}"
                                 + ("" if timing.get("trusted", True) is not False else "; too noisy to trust")))
    elif timing:
        facts.append(("timing", "not measured" + (f": {as_text(timing['reason'], 500)}" if timing.get("reason") else "")))
    shown["facts"] = facts
    if report.get("review_required") is True:
        shown["problems"] += [f"needs review: {line}" for line in listed(report.get("review_reasons") or [], 20)]
    shown["problems"] += listed(report.get("failures") or [], 20)
    shown["problems"] += [f"failed check: {line}" for line in listed(report.get("failed_checks") or [], 20)]
    samples = objects_in(report.get("samples"))
    shown["tables"].append(_table("samples", ("sample", "kind", "call", "result", "max abs err", "max rel err",
                                              "compared with", "detail"),
                                  [(s.get("sample"), s.get("kind"), s.get("call_index"),
                                    "pass" if s.get("passed") is True else "FAIL" if s.get("passed") is False else "skipped",
                                    shown_number(s.get("max_abs_error")), shown_number(s.get("max_rel_error")),
                                    s.get("expected_from", ""), s.get("error") or s.get("skipped") or s.get("note") or "")
                                   for s in samples]))
    timed = [row for row in objects_in(timing.get("samples")) if row.get("speedup") is not None]
    shown["tables"].append(_table("timing (median of each)", ("sample", "reference", "candidate", "speedup"),
                                  [(row.get("sample"), shown_ms(mapping_or_empty(row.get("reference")).get("median_ms")),
                                    shown_ms(mapping_or_empty(row.get("candidate")).get("median_ms")), shown_ratio(row.get("speedup")))
                                   for row in timed]))
    findings = [("error", f) for f in objects_in(static.get("errors"))] + [("warning", f) for f in objects_in(static.get("warnings"))]
    shown["tables"].append(_table("static check", ("severity", "rule", "line", "finding"),
                                  [(severity, f.get("rule"), f.get("line"), f.get("message")) for severity, f in findings]))


def _divergence_table(found: Sequence[tuple[object, object]]) -> dict[str, Any]:
    """Where each located call first diverged (docs/tools.md, "First divergence")."""
    rows = []
    for where, divergence in found:
        if not isinstance(divergence, Mapping):
            continue
        first = mapping_or_empty(divergence.get("first"))
        reference, last = mapping_or_empty(first.get("reference")), mapping_or_empty(divergence.get("last_agreeing"))
        rows.append((where, reference.get("module", "-") or "<root>", reference.get("op", "-"),
                     str(reference.get("source") or "").replace("\\", "/").rsplit("/", 1)[-1],
                     shown_number(first.get("max_ulps")) if "max_ulps" in first else "-",
                     f"{last.get('module') or '<root>'} {last.get('op')}" if last else "-",
                     divergence.get("summary", "")))
    return _table("first divergence", ("call", "module", "op", "source", "ULPs", "last agreeing op", "summary"), rows)


def _table(title: str, headers: tuple[str, ...], rows: Sequence[tuple[object, ...]]) -> dict[str, Any]:
    shown = [["" if c is None else as_text(c, 300) for c in row] for row in rows[:REPORT_ROWS]]
    more = f"{len(rows) - REPORT_ROWS:,} more rows not shown (the stored JSON has them)" if len(rows) > REPORT_ROWS else ""
    return {"title": title, "headers": headers, "rows": shown, "more": more}
