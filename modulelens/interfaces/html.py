"""Rich HTML for Jupyter: captures, calls and reports as tables.

Restore objects know nothing of HTML (restore must not import interfaces). Jupyter finds these
renderers through IPython's display formatters, registered by :func:`register_formatters` by
class *name* (so nothing is imported until an object is shown), from two places above every
layer: ``import modulelens`` when an IPython shell is running (a plain Jupyter kernel, no
``%load_ext``) and ``%load_ext modulelens`` (a shell started after the import).

Every function returns one self-contained ``<div class="modulelens">`` fragment with inline styles
(notebook front ends strip ``<style>`` blocks inconsistently). All text is escaped.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from modulelens.format.human import human_bytes, human_number

if TYPE_CHECKING:
    from modulelens.restore.calls import Call
    from modulelens.restore.loader import Capture
    from modulelens.restore.replay import ReplayReport

PASS_COLOR = "#1a7f37"
FAIL_COLOR = "#cf222e"
MAX_STATE_ROWS = 30
MAX_CALLS = 4

_TABLE = "border-collapse:collapse;font-size:12px;margin:4px 0 8px 0"
_CELL = "border:1px solid #d0d7de;padding:2px 6px;text-align:left;font-family:monospace"
_HEAD = _CELL + ";background:#f6f8fa;font-weight:600"


def esc(value: object) -> str:
    """HTML-escape ``str(value)``."""
    return html.escape(str(value), quote=True)


def badge(passed: bool | None, text: str | None = None) -> str:
    """A coloured PASS / FAIL label (grey when unknown)."""
    label = text or ("PASS" if passed else "FAIL" if passed is not None else "?")
    color = PASS_COLOR if passed else FAIL_COLOR if passed is not None else "#57606a"
    return (f'<span class="modulelens-{"pass" if passed else "fail"}" style="color:#fff;background:{color};'
            f'padding:1px 6px;border-radius:3px;font-weight:600">{esc(label)}</span>')


def fmt_number(value: object) -> str:
    """Numbers as the CLI prints them (:func:`~modulelens.format.human.human_number`); booleans as text."""
    if isinstance(value, bool):
        return str(value)
    return human_number(value) if isinstance(value, (int, float)) or value is None else str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, raw: bool = False) -> str:
    """An HTML table; cells are escaped unless ``raw`` (then they must already be HTML)."""
    head = "".join(f'<th style="{_HEAD}">{esc(h)}</th>' for h in headers)
    body = "".join(
        "<tr>" + "".join(f'<td style="{_CELL}">{cell if raw else esc(cell)}</td>' for cell in row) + "</tr>"
        for row in rows
    )
    return f'<table style="{_TABLE}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _wrap(inner: str) -> str:
    return f'<div class="modulelens" style="font-family:sans-serif;font-size:13px">{inner}</div>'


_TENSOR_HEADERS = ("name", "shape", "dtype", "device", "min", "max", "mean", "std", "non-finite")


def tensor_table(rows: Sequence[dict[str, Any]]) -> str:
    """A table of tensor rows (from ``tensor_info``): shape, dtype, device and statistics."""
    cells = []
    for row in rows:
        if row["kind"] == "tensor":
            stats = row.get("stats") or {}
            bad = stats.get("nonfinite", 0)
            nonfinite = (f'<span style="color:{FAIL_COLOR};font-weight:600">{bad}</span>' if bad
                         else ("0" if stats else ""))
            mean = stats.get("mean", stats.get("fraction_true"))
            cells.append([esc(row["path"]), esc(row["shape"]), esc(row["dtype"]), esc(row["device"]),
                          *(esc(fmt_number(v) if stats else "") for v in
                            (stats.get("min"), stats.get("max"), mean, stats.get("std"))), nonfinite])
        elif row["kind"] == "unrecorded":
            cells.append([esc(row["path"]), f"<i>not recorded: {esc(row.get('type'))}</i>", "", "", "", "", "", "", ""])
        else:
            cells.append([esc(row["path"]), f"value: {esc(row.get('value'))}", "", "", "", "", "", "", ""])
    return table(_TENSOR_HEADERS, cells, raw=True)


def _call_title(call: Call) -> str:
    mode = ("train" if call.training else "eval") + ("" if call.grad_enabled else ", no_grad")
    extra = "" if call.finished else f' <span style="color:{FAIL_COLOR}">(raised in the original job)</span>'
    return f"call {call.index} <span style=\"color:#57606a\">({esc(mode)}, state {call.state_index})</span>{extra}"


def _call_section(call: Call) -> str:
    from modulelens.interfaces.tensor_info import call_rows

    rows = call_rows(call)
    return (f"<div><b>{_call_title(call)}</b>"
            f"<div>inputs</div>{tensor_table(rows['inputs'])}"
            f"<div>outputs</div>{tensor_table(rows['outputs'])}</div>")


def call_html(call: Call) -> str:
    """HTML for one recorded call: its input and output tensors."""
    return _wrap(f"<div>{esc(call.capture.ref)}</div>" + _call_section(call))


def capture_html(capture: Capture) -> str:
    """HTML for a capture: class, constructor, parameters/buffers and recorded calls."""
    meta = capture.metadata
    module = meta["module"]
    states = meta.get("states", [])
    parts = [f'<div style="font-size:14px"><b>{esc(capture.ref)}</b> &nbsp; '
             f'<code>{esc(capture.module_class)}</code></div>']
    qualified = module.get("qualified_name") or "<root>"
    parts.append(f"<div>captured as <code>{esc(qualified)}</code>; {len(capture.calls)} call(s), "
                 f"{len(states)} state(s)</div>")
    construction = meta.get("constructions", {}).get(module.get("construction") or "")
    if construction is not None:
        text = json.dumps({"args": construction["args"], "kwargs": construction["kwargs"]})
        if len(text) > 400:
            text = text[:397] + "..."
        parts.append(f"<div>constructor: <code>{esc(text)}</code></div>")
    else:
        reason = module.get("construction_missing", "no constructor record")
        parts.append(f'<div>constructor: <span style="color:{FAIL_COLOR}">not recorded</span> ({esc(reason)})</div>')
    if states:
        from modulelens.interfaces.tensor_info import state_rows

        total = len(states[0]["parameters"]) + len(states[0]["buffers"])
        rows = state_rows(capture, 0, limit=MAX_STATE_ROWS)
        parts.append(f"<details open><summary>parameters and buffers ({total})</summary>{tensor_table(rows)}"
                     + (f"<div>... {total - MAX_STATE_ROWS} more</div>" if total > MAX_STATE_ROWS else "")
                     + "</details>")
    calls = "".join(_call_section(call) for call in capture.calls[:MAX_CALLS])
    if len(capture.calls) > MAX_CALLS:
        calls += f"<div>... {len(capture.calls) - MAX_CALLS} more call(s): capture.calls[i]</div>"
    parts.append(f"<details open><summary>recorded calls ({len(capture.calls)})</summary>{calls}</details>")
    parts.extend(f"<div>note: {esc(note)}</div>" for note in capture.notes)
    from modulelens.interfaces.ui.discovery import capture_url

    url = capture_url(capture.repo.location, capture.ref)  # a running `modulelens ui` of this repo
    if url:
        parts.append(f'<div><a href="{esc(url)}" target="_blank" rel="noopener noreferrer">open in modulelens ui</a></div>')
    return _wrap("".join(parts))


def replay_html(report: ReplayReport) -> str:
    """HTML for a replay report: a coloured verdict and one row per call."""
    verdict = {"PASS": True, "FAIL": False}.get(report.status)  # UNVERIFIED: grey, neither
    head = (f"<div>{badge(verdict, report.status)} replay of <b>{esc(report.ref)}</b> on {esc(report.device)} "
            f"({esc(report.mode)}{', ' + esc(report.dtype) if report.dtype else ''})</div>")
    cannot = "".join(f"<div>cannot verify: {esc(reason)}</div>" for reason in report.unverified)
    rows = []
    for c in report.calls:
        abs_err = max((leaf.max_abs_error for leaf in c.all_leaves), default=0.0)
        rel_err = max((leaf.max_rel_error for leaf in c.all_leaves), default=0.0)
        ulps = max((leaf.max_ulps for leaf in c.all_leaves if leaf.max_ulps is not None), default=None)
        detail = c.error or c.where() or "; ".join(c.unverified) or f"{len(c.leaves)} output leaves match"
        rows.append([esc(c.index), badge({"pass": True, "fail": False}.get(c.status), c.status), esc(fmt_number(abs_err)),
                     esc(fmt_number(rel_err)), esc(fmt_number(ulps)), esc(f"{c.seconds * 1e3:.2f} ms"), esc(detail)])
    body = table(("call", "result", "max abs err", "max rel err", "max ULPs", "time", "detail"), rows, raw=True)
    located = "".join(f"<div>call {esc(c.index)}: {esc(c.divergence.summary())}</div>"  # docs/tools.md, "First divergence"
                      for c in report.calls if c.divergence is not None)
    notes = "".join(f"<div>note: {esc(n)}</div>" for n in report.notes)
    return _wrap(head + cannot + body + located + notes)


def result_html(title: str, data: object, passed: bool | None = None) -> str:
    """Generic HTML for a tool result (profile, verify...) given as JSON-ready data."""
    head = f"<div>{badge(passed) + ' ' if passed is not None else ''}<b>{esc(title)}</b></div>"
    return _wrap(head + _data_html(data, depth=0))


def _data_html(data: object, depth: int) -> str:
    if isinstance(data, dict) and depth < 3:
        rows = [[esc(k), _data_html(v, depth + 1)] for k, v in data.items()]
        return table(("key", "value"), rows, raw=True)
    if isinstance(data, list) and data and all(isinstance(x, dict) for x in data) and depth < 3:
        keys: list[str] = []
        for item in data:
            keys.extend(k for k in item if k not in keys)
        rows = [[_data_html(item.get(k), depth + 1) for k in keys] for item in data[:100]]
        return table(keys, rows, raw=True)
    if isinstance(data, bool):
        return badge(data, str(data))
    if isinstance(data, float):
        return esc(fmt_number(data))
    text = json.dumps(data, default=str) if isinstance(data, (list, dict)) else str(data)
    return f"<code>{esc(text if len(text) <= 300 else text[:297] + '...')}</code>"


def _notes(notes: Iterable[str]) -> str:
    return "".join(f"<div>note: {esc(n)}</div>" for n in notes)


def _failures(lines: Sequence[str], limit: int = 10) -> str:
    """Failures right under the verdict, in red, so they are visible without scrolling."""
    items = "".join(f'<li style="color:{FAIL_COLOR}">{esc(line)}</li>' for line in lines[:limit])
    more = f"<li>... {len(lines) - limit} more</li>" if len(lines) > limit else ""
    return f'<ul style="margin:2px 0 6px 0">{items}{more}</ul>' if lines else ""


def verify_html(d: dict[str, Any]) -> str:
    """Compact HTML for a verification (``VerifyReport.to_dict()``): verdict, failures, then per call."""
    speed = f" &nbsp; speedup {d['speedup']:.2f}x" if d.get("speedup") else ""
    verdict = {"PASS": True, "FAIL": False}.get(d["status"])  # UNVERIFIED: grey, neither
    head = (f"<div>{badge(verdict, d['status'])} <b>{esc(d['candidate'])}</b> against <b>{esc(d['ref'])}</b> "
            f"on {esc(d['device'])}{speed}</div>")
    cannot = "".join(f"<div>cannot verify: {esc(reason)}</div>" for reason in d["unverified"])
    rows = [[esc(c["index"]), badge({"pass": True, "fail": False}.get(c["status"]), c["status"]),
             *(esc(fmt_number(c.get(k))) for k in ("max_abs_error", "max_rel_error", "max_ulps", "reference_ms",
                                                   "candidate_ms")),
             esc("-" if c.get("speedup") is None else f"{c['speedup']:.2f}x")] for c in d["calls"]]
    body = table(("call", "result", "max abs err", "max rel err", "max ULPs", "ref ms", "cand ms", "speedup"), rows, raw=True)
    return _wrap(head + _failures(d["failures"]) + cannot + (body if rows else "") + _notes(d["notes"]))


def profile_html(d: dict[str, Any], plot_png: bytes | None = None) -> str:
    """Compact HTML for a profile (``ProfileReport.to_dict()``): latency first, then the metrics,
    the top operators, the batch sweep and its plot inline."""
    lat = d["latency"]
    head = (f"<div><b>profile {esc(d['ref'])}</b> call {esc(d['call_index'])} on {esc(d['device'])} "
            f"({esc(d['mode'])}): <b>median {esc(fmt_number(lat['median_ms']))} ms</b> "
            f"(p10 {esc(fmt_number(lat['p10_ms']))}, p90 {esc(fmt_number(lat['p90_ms']))}, "
            f"{esc(lat['iterations'])} iterations)</div>")
    peak = d["memory"].get("peak_bytes")
    metrics = [("peak memory", "-" if peak is None else human_bytes(peak)),
               ("FLOPs", human_number(d["flops"]["total"])),
               ("bytes moved", human_bytes(d["bytes_moved"]["total"])),
               ("achieved", human_number(d["achieved_flops_per_s"], "FLOP/s")),
               ("arithmetic intensity", human_number(d["arithmetic_intensity"], "FLOP/byte"))]
    parts = [head, table(("metric", "value"), metrics)]
    ops = [[op["name"], fmt_number(op["self_ms_per_iter"]), f"{op['percent']:.1f}"] for op in d["top_ops"][:5]]
    if ops:
        parts.append(table(("top operator", "self ms", "%"), ops))
    if d.get("batch_sweep"):
        sweep = [[row["batch_size"], fmt_number(row.get("median_ms")) if row.get("median_ms") is not None
                  else row.get("error", ""), human_number(row.get("throughput_per_s"))] for row in d["batch_sweep"]]
        parts.append(table(("batch", "median ms", "samples/s"), sweep))
    if plot_png:
        encoded = base64.b64encode(plot_png).decode("ascii")
        parts.append(f'<img alt="latency vs batch size" src="data:image/png;base64,{encoded}" style="max-width:640px">')
    return _wrap("".join(parts) + _notes(d["notes"]))


def diff_html(d: dict[str, Any]) -> str:
    """Compact HTML for a diff (``DiffReport.to_dict()``): what changed first, unchanged tensors counted."""
    s = d["summary"]
    same = sum(t["status"] == "same" for t in d["tensors"])
    parts = [f"<div><b>diff {esc(d['a'])} &rarr; {esc(d['b'])}</b>: {same}/{esc(s['tensors'])} tensors identical"
             + (f", class {esc(d['class_a'])} &rarr; {esc(d['class_b'])}" if s["class_changed"] else "") + "</div>"]
    if d["constructor"]:
        parts.append(table(("argument", "A", "B"), [[c["argument"], c["a"], c["b"]] for c in d["constructor"]]))
    changed = [[t["name"], t["status"], fmt_number(t["max_abs_diff"]), fmt_number(t["rel_norm"])]
               for t in d["tensors"] if t["status"] != "same"]
    if changed:
        parts.append(table(("tensor", "status", "max abs diff", "rel norm"), changed[:MAX_STATE_ROWS]))
    if d["outputs"]:
        rows = [[esc(o["index"]), badge(o["same"], "same" if o["same"] else "differs"),
                 esc(fmt_number(o["max_abs_error"])), esc(o["error"] or "")] for o in d["outputs"]]
        parts.append(f"<div>outputs of {esc(d['b'])} on {esc(d['a'])}'s inputs</div>"
                     + table(("call", "result", "max abs err", "detail"), rows, raw=True))
    return _wrap("".join(parts) + _notes(d["notes"]))


def export_html(d: dict[str, Any]) -> str:
    """Compact HTML for a kernel problem export (``ExportResult.to_dict()``)."""
    m = d["manifest"]
    compatible = m["kernelbench_compatible"]
    check = m.get("self_check") or {}
    parts = [f"<div>{badge(compatible, 'KernelBench compatible' if compatible else 'not KernelBench compatible')} "
             f"<b>{esc(m['capture']['ref'])}</b> &rarr; <code>{esc(d['directory'])}</code></div>"]
    if check:
        ok = bool(check.get("reproduces_recorded_outputs"))
        parts.append(f"<div>{badge(ok, 'reproduces' if ok else 'does not reproduce')} "
                     f"problem.py vs the recorded outputs {esc(check.get('error', ''))}</div>")
    parts.append(_failures(m.get("kernelbench_incompatible_reasons", [])))
    parts.append(table(("file", "hash"), [[name, digest[:22] + "..."] for name, digest in m["files"].items()]))
    parts.append(f"<div>verify: <code>{esc(m['commands']['verify'])}</code></div>")
    return _wrap("".join(parts) + _notes(m["notes"]))


def captures_html(rows: Sequence[dict[str, Any]], root: str) -> str:
    """HTML listing of captures (rows are ``VersionInfo.to_dict()``)."""
    if not rows:
        return _wrap(f"<div>no captures in {esc(root)}</div>")
    cells = [[r["ref"], ", ".join(r["aliases"]), r["module_class"].rsplit(":", 1)[-1], human_bytes(r["payload_bytes"]),
              r["created"]] for r in rows]
    return _wrap(f"<div>captures in {esc(root)}</div>" + table(("ref", "aliases", "module class", "payload", "created"),
                                                            cells))


_FORMATTERS = (("modulelens.restore.loader", "Capture", capture_html), ("modulelens.restore.calls", "Call", call_html),
               ("modulelens.restore.replay", "ReplayReport", replay_html))


def register_formatters(shell: Any) -> None:
    """Show captures, calls and replay reports as HTML in ``shell`` (an IPython ``InteractiveShell``).

    Registered by module and class name, so neither torch nor the restore layer is imported here.
    """
    formatter = shell.display_formatter.formatters["text/html"]
    for module, name, render in _FORMATTERS:
        formatter.for_type_by_name(module, name, render)
