"""Pictures on the pages: tensor histograms as inline SVG, report plots as PNG images.

Histograms are many and small (one per tensor), so they are SVG bars computed here and drawn by a
template macro: no image request, no script, and they print. Report plots (latency by batch size,
memory, FLOPs and the roofline) go through matplotlib, the plotting library the rest of modulelens
uses (``modulelens profile --plot``), as PNG ``data:`` URIs: the page stays one document, which the
self-contained export (``modulelens report``) needs, and the Content-Security-Policy allows images
only from the server itself and ``data:``.
"""

from __future__ import annotations

import base64
import contextlib
import io
import math
import os
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from markupsafe import Markup, escape

from modulelens.format.human import human_number
from modulelens.interfaces.ui.shown import mapping_or_empty

HIST_WIDTH = 240
HIST_HEIGHT = 56


def histogram_bars(hist: dict[str, Any] | None, width: int = HIST_WIDTH, height: int = HIST_HEIGHT) -> dict[str, Any] | None:
    """SVG geometry of a histogram from :func:`~modulelens.interfaces.tensor_info.histogram`.

    Returns:
        ``{"width", "height", "bars": [{"x", "y", "w", "h", "count", "low", "high"}], "low", "high",
        "peak", "total"}`` with bar heights on a square-root scale (so a spike at zero does not flatten
        the rest), or ``None`` for no histogram.
    """
    if not hist or not hist.get("counts"):
        return None
    counts = hist["counts"]
    peak = max(counts) or 1
    step = width / len(counts)
    span = (hist["high"] - hist["low"]) / len(counts)
    bars = []
    for i, count in enumerate(counts):
        h = 0.0 if not count else max(1.0, (height - 2) * math.sqrt(count / peak))
        low = hist["low"] + i * span
        bars.append({"x": round(i * step + 0.5, 2), "y": round(height - h, 2), "w": round(max(step - 1, 0.5), 2),
                     "h": round(h, 2), "count": count, "low": human_number(low), "high": human_number(low + span)})
    labels = hist.get("labels") or [human_number(hist["min"]), human_number(hist["max"])]
    return {"width": width, "height": height, "bars": bars, "rects": _rects(bars), "peak": peak,
            "total": hist.get("total"), "low": labels[0], "high": labels[-1]}


def _rects(bars: list[dict[str, Any]]) -> Markup:
    """The bars as SVG ``<rect>`` elements, the markup the ``hist`` macro would write for each: one
    string here, since the template's per-attribute escaping cost ~1 ms a histogram, 0.15 s of a
    4 GiB capture's page of 128 tensors (benchmarks/bench_ui.py --gib 4). Only the labels are text;
    the rest are numbers computed above."""
    return Markup("".join(f'<rect x="{b["x"]}" y="{b["y"]}" width="{b["w"]}" height="{b["h"]}"><title>'
                          f'{escape(b["low"])} … {escape(b["high"])}: {int(b["count"])}</title></rect>' for b in bars))


def overlay_bars(first: dict[str, Any] | None, second: dict[str, Any] | None, width: int = HIST_WIDTH,
                 height: int = HIST_HEIGHT) -> dict[str, Any] | None:
    """SVG geometry of two histograms over the same bins
    (:func:`~modulelens.interfaces.tensor_info.shared_histograms`), drawn over each other: A and B.

    Each is scaled by its own count (a share of its values per bin: two samples of different sizes
    compare), on the square-root scale of :func:`histogram_bars`, against the larger peak of the two.

    Returns:
        ``{"width", "height", "a": bars, "b": bars, "low", "high", "total_a", "total_b"}`` (``bars``
        as in :func:`histogram_bars`; empty for a side without values), or ``None`` when neither has one.
    """
    sides = [h for h in (first, second) if h and h.get("counts") and h.get("total")]
    if not sides:
        return None
    ref = sides[0]
    bins = len(ref["counts"])
    shares = [[c / h["total"] for c in h["counts"]] if h in sides else [] for h in (first, second)]
    peak = max(max(share) for share in shares if share) or 1.0
    step = width / bins
    span = (ref["high"] - ref["low"]) / bins

    def bars(share: list[float], counts: list[int]) -> list[dict[str, Any]]:
        drawn = []
        for i, (part, count) in enumerate(zip(share, counts, strict=True)):
            h = 0.0 if not count else max(1.0, (height - 2) * math.sqrt(part / peak))
            low = ref["low"] + i * span
            drawn.append({"x": round(i * step + 0.5, 2), "y": round(height - h, 2), "w": round(max(step - 1, 0.5), 2),
                          "h": round(h, 2), "count": count, "low": human_number(low), "high": human_number(low + span)})
        return drawn

    drawn = [bars(share, h["counts"]) if share and h else [] for share, h in zip(shares, (first, second), strict=True)]
    return {"width": width, "height": height, "a": drawn[0], "b": drawn[1],
            "low": human_number(ref.get("span_min", ref["low"])), "high": human_number(ref.get("span_max", ref["high"])),
            "total_a": (first or {}).get("total", 0), "total_b": (second or {}).get("total", 0)}


def png_data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


TITLE_LIMIT = 120  # characters of a plot's title: a stored report's strings can be any length


_DRAWING = threading.Lock()  # matplotlib is not thread-safe, and rc_context changes the process's settings


@contextlib.contextmanager
def plain_text() -> Iterator[None]:
    """Every text matplotlib draws inside is plain text: a report's strings (a ref, a device, a date)
    are data, and as mathtext ``$\\sqrt{\\sqrt{...}}$`` made matplotlib fail or spin (issue 35).
    One drawing at a time: the server's threads would otherwise see each other's settings."""
    import matplotlib

    with _DRAWING, matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
        yield


def _label(value: object) -> str:
    text = str(value) if value is not None else ""
    return text if len(text) <= TITLE_LIMIT else text[:TITLE_LIMIT - 1] + "…"


def sweep_plot(report: dict[str, Any]) -> str | None:
    """Latency and throughput by batch size of a profile report with a sweep, as a ``data:`` URI
    (drawn by :func:`modulelens.tools.profile.draw_plot`, the plot of ``profile --plot``), from the
    rows whose numbers are real numbers (a stored ``"nan"`` or a string is left out); ``None`` when
    none is."""
    rows = [r for r in report.get("batch_sweep") or [] if isinstance(r, dict) and _drawable(r)]
    if not rows:
        return None
    from modulelens.tools.profile import draw_plot

    title = _label(f"{report.get('ref', '')} ({report.get('mode', '')}, {report.get('device', '')})")
    with tempfile.TemporaryDirectory(prefix="modulelens-ui-") as folder, plain_text():
        path = os.path.join(folder, "sweep.png")
        draw_plot(rows, path, title)
        with open(path, "rb") as handle:
            return png_data_uri(handle.read())


def _drawable(row: dict[str, Any]) -> bool:
    numbers = [_number(row.get(k)) for k in ("median_ms", "p10_ms", "p90_ms", "throughput_per_s")]
    size = row.get("batch_size")
    return all(math.isfinite(n) for n in numbers) and isinstance(size, int) and not isinstance(size, bool) and size > 0


def history_plot(reports: list[dict[str, Any]]) -> str | None:
    """Profile reports of one capture side by side, as a ``data:`` URI: median latency, peak
    memory, and the roofline view (achieved FLOP/s against arithmetic intensity, log-log; each
    batch size of a sweep is a point too). ``None`` without a profile report."""
    profiles = [r for r in reports if r.get("kind") == "profile" and isinstance(r.get("latency"), dict)]
    if not profiles:
        return None

    with plain_text():
        return _history_plot(profiles)


def _history_plot(profiles: list[dict[str, Any]]) -> str:
    from matplotlib.figure import Figure

    profiles = sorted(profiles, key=lambda r: str(r.get("created", "")))
    labels = [_label(r.get("created", "?"))[4:13] for r in profiles]
    fig = Figure(figsize=(11, 3.4), dpi=90)
    latency_ax, memory_ax, roof_ax = fig.subplots(1, 3)
    medians = [_number(r["latency"].get("median_ms")) for r in profiles]
    latency_ax.plot(range(len(profiles)), medians, marker="o")
    latency_ax.set(title="median latency (ms)", xticks=range(len(profiles)))
    latency_ax.set_xticklabels(labels, rotation=30, fontsize=7)
    peaks = [_number(mapping_or_empty(r.get("memory")).get("peak_bytes")) / 2**20 for r in profiles]
    memory_ax.bar(range(len(profiles)), [0 if math.isnan(p) else p for p in peaks], color="tab:purple")
    memory_ax.set(title="peak memory (MiB)", xticks=range(len(profiles)))
    memory_ax.set_xticklabels(labels, rotation=30, fontsize=7)
    points = []
    for r in profiles:
        points.append((_number(r.get("arithmetic_intensity")), _number(r.get("achieved_flops_per_s")), "tab:blue"))
        sweep = r.get("batch_sweep")
        for row in sweep if isinstance(sweep, list) else []:
            if not isinstance(row, dict):
                continue
            flops, achieved, median = (_number(row.get(k)) for k in ("flops", "achieved_flops_per_s", "median_ms"))
            bytes_moved = _number(mapping_or_empty(r.get("bytes_moved")).get("total"))
            if flops and bytes_moved and achieved and median:
                points.append((flops / bytes_moved, achieved, "tab:orange"))
    points = [(x, y, c) for x, y, c in points if math.isfinite(x) and math.isfinite(y) and x > 0 and y > 0]
    if points:
        roof_ax.scatter([p[0] for p in points], [p[1] for p in points], c=[p[2] for p in points])
        roof_ax.set_xscale("log")
        roof_ax.set_yscale("log")
    roof_ax.set(title="roofline: FLOP/s vs FLOP/byte", xlabel="arithmetic intensity (FLOP/byte)")
    for ax in (latency_ax, memory_ax, roof_ax):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return png_data_uri(buffer.getvalue())


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
