"""``modulelens profile``: latency, memory, FLOPs, bytes and top operators of a captured module.

This module puts the report together; ``measure.py`` measures one iteration and ``sweep.py`` runs
the batch sweep and draws its plot. Everything runs on one recorded call (``call=0`` by default),
with the recorded training flag, autocast and RNG state:

* latency (median, p10, p90), peak memory, FLOPs and bytes moved, the top operators and
  optionally a Chrome trace (how each is measured: ``measure.py``);
* optionally a sweep over batch sizes on synthetic inputs of the recorded shapes, with a plot.

Forward-only runs under ``torch.no_grad()``; ``backward=True`` runs forward and backward with
floating inputs requiring grad (as inside a network) and ``ones`` as output gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from modulelens.errors import ToolError
from modulelens.format.human import human_number
from modulelens.tools.measure import build_workload, count_flops, measure
from modulelens.tools.recorded import refuse_ensemble
from modulelens.tools.reports import environment_facts, json_safe, store_report
from modulelens.tools.sweep import draw_plot, recorded_batch_size, sweep_batch_sizes
from modulelens.tools.timing import TimingConfig
from modulelens.tools.working_copy import has_buffers, run_device, working_module

if TYPE_CHECKING:
    from modulelens.restore.loader import Capture


@dataclass
class ProfileReport:
    """What :func:`profile` measured. ``to_dict()`` is the stored / ``--json`` form (docs/tools.md)."""

    ref: str
    module_class: str
    call: int
    call_index: int
    device: str
    dtype: str | None
    mode: str
    compiled: str | None
    batch_size: int | None
    latency: dict[str, Any]
    memory: dict[str, Any]
    flops: dict[str, Any]
    bytes_moved: dict[str, Any]
    achieved_flops_per_s: float | None
    arithmetic_intensity: float | None
    top_ops: list[dict[str, Any]]
    compile_seconds: float | None = None
    trace: str | None = None
    batch_sweep: list[dict[str, Any]] | None = None
    plot: str | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    report_path: str | None = None

    def to_dict(self) -> dict[str, object]:
        return json_safe({k: v for k, v in vars(self).items()})

    def __str__(self) -> str:
        lat = self.latency
        lines = [
            f"profile {self.ref} call {self.call_index} on {self.device} ({self.mode}"
            f"{', compiled ' + self.compiled if self.compiled else ''}):",
            f"  latency median {lat['median_ms']:.4g} ms  p10 {lat['p10_ms']:.4g}  p90 {lat['p90_ms']:.4g}"
            f"  ({lat['iterations']} iterations)",
            f"  peak memory {human_number(self.memory.get('peak_bytes'), 'B')} ({self.memory.get('source')})",
            f"  FLOPs {human_number(self.flops['total'])}  bytes {human_number(self.bytes_moved['total'], 'B')}"
            f"  achieved {human_number(self.achieved_flops_per_s, 'FLOP/s')}"
            f"  intensity {human_number(self.arithmetic_intensity, 'FLOP/B')}",
        ]
        if self.flops["uncounted_compute_ops"]:
            lines.append("  no FLOP formula: " + ", ".join(self.flops["uncounted_compute_ops"]))
        lines.extend(f"  {op['name']}: {op['self_ms_per_iter']:.4g} ms/iter ({op['percent']:.1f}%)"
                     for op in self.top_ops[:5])
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    __repr__ = __str__


# ------------------------------------------------------------------------------------------------
# Entry point


# Over 80 lines only through its docstring (Args/Returns/Raises/Example); the body validates and
# hands off to private helpers, one job each.
def profile(
    capture: Capture,
    *,
    call: int = 0,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    backward: bool = False,
    compile: bool | str = False,
    timing: TimingConfig = TimingConfig(),
    batch_sizes: Sequence[int] | None = None,
    plot: str | Path | None = None,
    trace: str | Path | None = None,
    top: int = 15,
    store: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ProfileReport:
    """Profile recorded call ``call`` (a position in ``capture.calls``) of the captured module.

    Args:
        capture: a loaded capture (``modulelens.load(ref, device=..., dtype=...)``).
        call: which recorded call's inputs to run (negative counts from the end).
        device, dtype: where to run (default: the capture's).
        backward: time forward+backward instead of forward under ``no_grad``.
        compile: wrap the module in ``torch.compile`` (``True`` for inductor, or a backend name).
        timing: warm-up and iteration counts (``iters=None`` times for about ``target_seconds``).
        batch_sizes: also sweep these batch sizes on synthetic inputs of the recorded shapes.
        plot: draw the sweep as a PNG here (needs ``batch_sizes``).
        trace: write a Chrome trace of a few profiled iterations here.
        top: how many operators the top-ops table keeps.
        store: keep the report with the capture's version (``modulelens show`` lists it).
        progress: told the name of each step as it starts ("timing call 3", "batch sweep: batch
            size 8 (2 of 3)"), for a status line; the CLI shows it on a terminal.

    Returns:
        A :class:`ProfileReport`.

    Raises:
        ToolError: no such call, the call did not finish in the job, CUDA asked for but absent,
            a plot without batch sizes.
        MissingDependencyError: a plot without matplotlib installed.

    Example::

        cap = modulelens.load("ranker/mlp:v2")
        report = modulelens.profile(cap, backward=True, batch_sizes=[1, 8, 64], plot="mlp.png")
        print(report.latency["median_ms"], report.flops["total"])
    """
    _check_request(capture, call, plot, batch_sizes)
    step = progress or (lambda text: None)
    recorded = capture.calls[call]
    run_on = run_device(capture, device)
    if run_on.type == "cuda" and not torch.cuda.is_available():
        raise ToolError("CUDA is not available on this machine")
    dtype = dtype if dtype is not None else capture.dtype
    module = working_module(capture, recorded.state_index, device=run_on, dtype=dtype,
                            private=recorded.training and has_buffers(capture.module))
    module.train(recorded.training)
    args, kwargs = recorded.fresh_inputs(run_on, dtype)
    backend = None if compile is False else ("inductor" if compile is True else str(compile))
    entry = capture.entry_point(module)  # the module, or its recorded method (vae:encode)
    fn: Callable[..., Any] = torch.compile(entry, backend=backend) if backend else entry
    workload = build_workload(fn, module, recorded, args, kwargs, run_on, backward)

    step(f"timing call {recorded.index} ({'compiling, then ' if backend else ''}warm-up and timed iterations; "
         "then torch.profiler)")
    measured = measure(workload, run_on, timing, compiled=backend is not None, trace=trace, top=top)
    eager = workload if not backend else build_workload(entry, module, recorded, args, kwargs, run_on, backward)
    step("counting FLOPs and bytes moved")
    flops, moved = count_flops(eager)
    notes: list[str] = list(capture.notes)
    if backend:
        notes.append("FLOPs and bytes are counted on the eager module (what the compiled graph computes, "
                     "before fusion)")
    if flops["uncounted_compute_ops"]:
        notes.append("FLOPs are a lower bound: no formula for " + ", ".join(flops["uncounted_compute_ops"]))
    seconds = measured.timing.median_ms / 1e3
    sweep = plot_path = None
    if batch_sizes:
        sweep_timing = TimingConfig(timing.warmup, timing.iters, min(timing.target_seconds, 0.5))
        sweep = sweep_batch_sizes(fn, module, recorded, args, kwargs, run_on, backward, batch_sizes, sweep_timing,
                                  progress=step, entry=entry)
        if plot is not None:
            step(f"drawing the plot into {plot}")
            plot_path = draw_plot(sweep, plot, f"{capture.ref} ({'fwd+bwd' if backward else 'fwd'}, {run_on})")
    if backward:
        for tensor in module.parameters():
            tensor.grad = None

    report = ProfileReport(
        ref=capture.ref, module_class=capture.module_class, call=call, call_index=recorded.index,
        device=str(run_on), dtype=str(dtype).removeprefix("torch.") if dtype else None,
        mode="forward+backward" if backward else "forward (no_grad)", compiled=backend,
        batch_size=recorded_batch_size(args, kwargs), latency=measured.timing.to_dict(), memory=measured.memory,
        flops=flops, bytes_moved=moved,
        achieved_flops_per_s=flops["total"] / seconds if seconds > 0 and flops["total"] else None,
        arithmetic_intensity=flops["total"] / moved["total"] if moved["total"] and flops["total"] else None,
        top_ops=measured.top_ops, compile_seconds=measured.compile_seconds, trace=str(trace) if trace else None,
        batch_sweep=sweep, plot=plot_path, environment=environment_facts(run_on), notes=notes,
    )
    if store:
        report.report_path = store_report(capture, "profile", report.to_dict())
    return report


def _check_request(capture: Capture, call: int, plot: str | Path | None, batch_sizes: Sequence[int] | None) -> None:
    refuse_ensemble(capture, "profile")
    if not capture.calls:
        raise ToolError(f"{capture.ref} has no recorded calls to profile")
    if not -len(capture.calls) <= call < len(capture.calls):
        raise ToolError(f"{capture.ref} has {len(capture.calls)} recorded call(s); there is no call {call}")
    if plot is not None and not batch_sizes:
        raise ToolError("a plot needs batch sizes to sweep (batch_sizes=[1, 8, 64] / --batch-sizes 1,8,64)")
    if not capture.calls[call].finished:
        raise ToolError(f"{capture.ref} call {capture.calls[call].index} did not finish in the original job; "
                        "pick another call")
