"""Rich HTML for Jupyter: captures, calls and reports as tables (``_repr_html_`` delegates here).

Every function returns one self-contained ``<div class="modulelens">`` fragment with inline styles
(notebook front ends strip ``<style>`` blocks inconsistently). All text is escaped.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from modulelens.interfaces.tensor_info import call_rows, state_rows

if TYPE_CHECKING:
    from modulelens.restore.loader import Call, Capture
    from modulelens.restore.replay import ReplayReport

PASS_COLOR = "#1a7f37"
FAIL_COLOR = "#cf222e"
MAX_STATE_ROWS = 30
MAX_CALLS = 4

_TABLE = "border-collapse:collapse;font-size:12px;margin:4px 0 8px 0"
_CELL = "border:1px solid #d0d7de;padding:2px 6px;text-align:left;font-family:monospace"
_HEAD = _CELL + ";background:#f6f8fa;font-weight:600"


def esc(value: Any) -> str:
    """HTML-escape ``str(value)``."""
    return html.escape(str(value), quote=True)


def badge(passed: bool | None, text: str | None = None) -> str:
    """A coloured PASS / FAIL label (grey when unknown)."""
    label = text or ("PASS" if passed else "FAIL" if passed is not None else "?")
    color = PASS_COLOR if passed else FAIL_COLOR if passed is not None else "#57606a"
    return (f'<span class="modulelens-{"pass" if passed else "fail"}" style="color:#fff;background:{color};'
            f'padding:1px 6px;border-radius:3px;font-weight:600">{esc(label)}</span>')


def fmt_number(value: Any) -> str:
    """Compact numbers for tables (``1.23e-05``, ``0.5``); anything else as text."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


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


_TENSOR_HEADERS = ("name", "shape", "dtype", "device", "min", "max", "mean", "std", "nan/inf")


def tensor_table(rows: Sequence[dict[str, Any]]) -> str:
    """A table of tensor rows (from ``tensor_info``): shape, dtype, device and statistics."""
    cells = []
    for row in rows:
        if row["kind"] == "tensor":
            stats = row.get("stats") or {}
            bad = (stats.get("nan") or 0) + (stats.get("inf") or 0)
            nan_inf = f'<span style="color:{FAIL_COLOR};font-weight:600">{stats["nan"]}/{stats["inf"]}</span>' \
                if bad else (f'{stats.get("nan", "")}/{stats.get("inf", "")}' if stats else "")
            cells.append([esc(row["path"]), esc(row["shape"]), esc(row["dtype"]), esc(row["device"]),
                          *(esc(fmt_number(stats.get(k))) for k in ("min", "max", "mean", "std")), nan_inf])
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
    rows = call_rows(call)
    return (f"<div><b>{_call_title(call)}</b>"
            f"<div>inputs</div>{tensor_table(rows['inputs'])}"
            f"<div>outputs</div>{tensor_table(rows['outputs'])}</div>")


def call_html(call: Call) -> str:
    """HTML for one recorded call: its input and output tensors."""
    return _wrap(f"<div>{esc(call._capture.ref)}</div>" + _call_section(call))


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
    return _wrap("".join(parts))


def replay_html(report: ReplayReport) -> str:
    """HTML for a replay report: a coloured verdict and one row per call."""
    head = (f"<div>{badge(report.passed)} replay of <b>{esc(report.ref)}</b> on {esc(report.device)} "
            f"({esc(report.mode)}{', ' + esc(report.dtype) if report.dtype else ''})</div>")
    rows = []
    for c in report.calls:
        abs_err = max((leaf.max_abs_error for leaf in c.leaves), default=0.0)
        rel_err = max((leaf.max_rel_error for leaf in c.leaves), default=0.0)
        worst = c.worst
        detail = c.error or (f"{worst.path}: {worst.message}" if worst else f"{len(c.leaves)} output leaves match")
        rows.append([esc(c.index), badge(c.passed, "pass" if c.passed else "FAIL"), esc(fmt_number(abs_err)),
                     esc(fmt_number(rel_err)), esc(f"{c.seconds * 1e3:.2f} ms"), esc(detail)])
    body = table(("call", "result", "max abs err", "max rel err", "time", "detail"), rows, raw=True)
    notes = "".join(f"<div>note: {esc(n)}</div>" for n in report.notes)
    return _wrap(head + body + notes)


def result_html(title: str, data: Any, passed: bool | None = None) -> str:
    """Generic HTML for a tool result (profile, verify...) given as JSON-ready data."""
    head = f"<div>{badge(passed) + ' ' if passed is not None else ''}<b>{esc(title)}</b></div>"
    return _wrap(head + _data_html(data, depth=0))


def _data_html(data: Any, depth: int) -> str:
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


def captures_html(rows: Sequence[dict[str, Any]], root: str) -> str:
    """HTML listing of captures (rows are ``VersionInfo.to_dict()``)."""
    if not rows:
        return _wrap(f"<div>no captures in {esc(root)}</div>")
    cells = [[r["ref"], ", ".join(r["aliases"]), r["module_class"].rsplit(":", 1)[-1], _human(r["payload_bytes"]),
              r["created"]] for r in rows]
    return _wrap(f"<div>captures in {esc(root)}</div>" + table(("ref", "aliases", "module class", "payload", "created"),
                                                            cells))


def _human(n: int) -> str:
    from modulelens.interfaces.output import human_bytes

    return human_bytes(n)
