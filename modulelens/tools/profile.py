"""``modulelens profile``: latency, memory, FLOPs, bytes and top operators of a captured module.

Everything runs on one recorded call (``call=0`` by default), with the recorded training flag,
autocast and RNG state:

* latency: ``warmup`` untimed iterations, then per-iteration timings (CUDA events on GPU,
  ``time.perf_counter`` on CPU) -> median, p10, p90;
* peak memory: on CUDA ``torch.cuda.max_memory_allocated`` above the pre-call baseline for one
  iteration; on CPU the running sum of the CPU allocator's allocation/free events recorded by
  ``torch.profiler(profile_memory=True)`` (the peak of tensor memory allocated during an
  iteration, not the process RSS, which the allocator caches hide);
* FLOPs from ``torch.utils.flop_counter.FlopCounterMode`` (matmul/conv/attention formulas) and
  every aten op seen through a ``TorchDispatchMode``: ops with no FLOP formula are listed, not
  silently counted as zero; bytes moved = tensor bytes read + written by every non-view aten op
  (no fusion or cache reuse assumed, so an upper bound for eager mode);
* the top operators by self time from ``torch.profiler``, and optionally a Chrome trace;
* optionally a sweep over batch sizes on synthetic inputs of the recorded shapes, with a plot.

Forward-only runs under ``torch.no_grad()``; ``backward=True`` runs forward and backward with
floating inputs requiring grad (as inside a network) and ``ones`` as output gradients.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from modulelens.errors import MissingDependencyError, ToolError
from modulelens.format.human import human_number
from modulelens.restore.replay import call_context
from modulelens.restore.synthesize import random_like
from modulelens.tools.reports import environment_facts, json_safe, store_report
from modulelens.tools.timing import Timing, TimingConfig, time_iterations
from modulelens.tools.working_copy import has_buffers, run_device, working_module

if TYPE_CHECKING:
    from modulelens.restore.loader import Call, Capture

_MARK = "modulelens.iteration"
_PROFILER_ITERS = 3  # iterations under torch.profiler for the top-ops table and the trace


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

    def to_dict(self) -> dict[str, Any]:
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
# One iteration


@dataclass
class _Workload:
    """What one timed iteration runs, and how to prepare it."""

    step: Callable[[], Any]
    before_each: Callable[[], None] | None
    context: Callable[[], contextlib.AbstractContextManager[Any]]


def _workload(
    fn: Callable[..., Any],
    module: torch.nn.Module,
    call: Call,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    device: torch.device,
    backward: bool,
) -> _Workload:
    def context() -> contextlib.AbstractContextManager[Any]:
        stack = contextlib.ExitStack()
        stack.enter_context(call_context(call, device))
        stack.enter_context(torch.enable_grad() if backward else torch.no_grad())
        return stack

    if not backward:
        return _Workload(step=lambda: fn(*args, **kwargs), before_each=None, context=context)
    inputs = [t for t in tensor_leaves((args, kwargs)) if t.is_floating_point() or t.is_complex()]
    for tensor in inputs:
        tensor.requires_grad_(True)
    params = [p for p in module.parameters() if p.requires_grad]
    with context():
        output = module(*args, **kwargs)
    probe = output_tensors(output)
    if not probe:
        raise ToolError("--backward: no output requires grad (no trainable parameters and no floating inputs)")
    grads = [torch.ones_like(t) for t in probe]
    single = isinstance(output, torch.Tensor)
    del probe, output

    def before_each() -> None:
        for tensor in params:
            tensor.grad = None
        for tensor in inputs:
            tensor.grad = None

    if single:  # the common case, without flattening the output every iteration
        grad = grads[0]

        def step() -> None:
            fn(*args, **kwargs).backward(grad)
    else:
        def step() -> None:
            torch.autograd.backward(output_tensors(fn(*args, **kwargs)), grads)

    return _Workload(step=step, before_each=before_each, context=context)


# ------------------------------------------------------------------------------------------------
# FLOPs and bytes


class _OpCensus(TorchDispatchMode):
    """Counts every aten op and the tensor bytes each non-view op reads and writes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[Any] = Counter()
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.ops[func] += 1
        if not func.is_view:
            for tensor in tensor_leaves((args, kwargs, out)):
                self.bytes += tensor.numel() * tensor.element_size()
        return out


def _op_category(func: Any) -> str:
    if func.is_view:
        return "view"
    tags = set(getattr(func, "tags", ()))
    if torch.Tag.pointwise in tags:
        return "pointwise"
    if torch.Tag.reduction in tags:
        return "reduction"
    return "other"


def _count_flops(workload: _Workload) -> tuple[dict[str, Any], dict[str, Any]]:
    """FLOPs (with the ops that have no formula) and bytes moved of one iteration of ``workload``."""
    counter = FlopCounterMode(display=False)
    census = _OpCensus()
    registry = getattr(counter, "flop_registry", None)
    if registry is None:  # pragma: no cover - older torch
        from torch.utils.flop_counter import flop_registry as registry
    with workload.context():
        if workload.before_each is not None:
            workload.before_each()
        with counter, census:
            workload.step()
    per_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    uncounted = [
        {"op": str(func), "count": n, "category": _op_category(func)}
        for func, n in sorted(census.ops.items(), key=lambda item: str(item[0]))
        if func._overloadpacket not in registry
    ]
    flops = {
        "total": int(counter.get_total_flops()),
        "per_op": per_op,
        "uncounted_ops": uncounted,
        "uncounted_compute_ops": sorted({u["op"] for u in uncounted if u["category"] != "view"}),
        "method": "torch.utils.flop_counter.FlopCounterMode (matmul/conv/attention formulas); ops without a "
                  "formula are listed in uncounted_ops, not counted",
    }
    moved = {
        "total": census.bytes,
        "method": "sum of tensor bytes read and written by each non-view aten op (eager, no fusion or cache reuse)",
    }
    return flops, moved


# ------------------------------------------------------------------------------------------------
# torch.profiler: top ops, CPU memory, trace


def _profiler_pass(workload: _Workload, device: torch.device, iterations: int, trace: str | None,
                   top: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with workload.context(), torch_profile(activities=activities, profile_memory=True) as prof:
        for _ in range(iterations):
            if workload.before_each is not None:
                workload.before_each()
            with record_function(_MARK):
                workload.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    if trace:
        Path(trace).parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(trace)
    use_device = device.type == "cuda"
    rows = []
    for event in prof.key_averages():
        if event.key.startswith(("modulelens.", "ProfilerStep", "[memory]")):
            continue
        self_us = event.self_device_time_total if use_device else event.self_cpu_time_total
        total_us = event.device_time_total if use_device else event.cpu_time_total
        rows.append({"name": event.key, "calls_per_iter": event.count / iterations,
                     "self_ms_per_iter": self_us / 1e3 / iterations, "total_ms_per_iter": total_us / 1e3 / iterations})
    total = sum(r["self_ms_per_iter"] for r in rows) or 1.0
    rows.sort(key=lambda r: r["self_ms_per_iter"], reverse=True)
    for row in rows:
        row["percent"] = 100.0 * row["self_ms_per_iter"] / total
    memory: dict[str, Any] = {}
    if device.type == "cpu":
        memory = _cpu_memory_from_profiler(prof, iterations)
    return rows[:top], memory


def _cpu_memory_from_profiler(prof: Any, iterations: int) -> dict[str, Any]:
    method = ("torch.profiler(profile_memory=True): peak of the running sum of CPU allocator "
              "allocation/free events during the profiled iterations (tensor memory, not RSS)")
    try:
        events = [e for e in prof.profiler.kineto_results.events()
                  if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    except Exception as error:  # private profiler API; report rather than guess
        return {"peak_bytes": None, "source": "unavailable",
                "method": f"unavailable ({type(error).__name__}: {error})"}
    events.sort(key=lambda e: e.start_ns())
    running = peak = allocated = 0
    for event in events:
        running += event.nbytes()
        peak = max(peak, running)
        allocated += max(event.nbytes(), 0)
    return {"peak_bytes": peak, "allocated_bytes_per_iter": allocated // max(iterations, 1),
            "source": "torch.profiler CPU allocator events", "method": method}


def _cuda_memory(workload: _Workload, device: torch.device) -> dict[str, Any]:
    torch.cuda.synchronize(device)
    with workload.context():
        if workload.before_each is not None:
            workload.before_each()
        torch.cuda.synchronize(device)
        baseline = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        workload.step()
        torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    return {"peak_bytes": peak - baseline, "peak_allocated_bytes": peak, "baseline_bytes": baseline,
            "source": "torch.cuda.max_memory_allocated",
            "method": "torch.cuda.max_memory_allocated during one iteration, minus the allocation before it"}


# ------------------------------------------------------------------------------------------------
# Synthetic inputs for batch sweeps


def recorded_batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """Dim 0 of the first input tensor with at least one dimension (``None`` if there is none).

    Example::

        recorded_batch_size(*cap.calls[0].inputs)   # 64
    """
    for tensor in tensor_leaves((args, kwargs)):
        if tensor.dim() >= 1:
            return int(tensor.shape[0])
    return None


def synthetic_inputs(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    batch_size: int,
    *,
    generator: torch.Generator | None = None,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Inputs like the recorded ones with dim 0 resized to ``batch_size`` where it carries the batch.

    A tensor carries the batch when its dim 0 equals the recorded batch size (dim 0 of the first
    input tensor). Those get random values: normal with the recorded mean/std for floats, uniform
    integers in the recorded ``[min, max]`` for integer tensors, random booleans; all other values
    are kept as recorded.

    Example::

        args, kwargs = synthetic_inputs(*cap.calls[0].inputs, 64)
    """
    recorded = recorded_batch_size(args, kwargs)
    if recorded is None:
        raise ToolError("--batch-sizes: the call has no input tensor with a batch dimension")

    # without a generator, seed one from torch's global RNG (as torch.randn would use it)
    draw = generator if generator is not None else torch.Generator().manual_seed(int(torch.randint(2**62, ())))

    def resize(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != recorded:
            return value
        tensor, _ = random_like(value, draw, shape=(batch_size, *value.shape[1:]))
        return tensor.to(value.device)

    new_args, new_kwargs = pytree.tree_map(resize, (tuple(args), dict(kwargs)))
    return tuple(new_args), dict(new_kwargs)


def draw_plot(rows: list[dict[str, Any]], path: str | Path, title: str) -> str:
    """A PNG of latency (median with p10-p90) and throughput against batch size (Agg, no pyplot).

    Example::

        report = modulelens.profile(cap, batch_sizes=[1, 8, 64])
        draw_plot(report.batch_sweep, "sweep.png", report.ref)
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingDependencyError("plotting needs matplotlib: pip install 'modulelens[plot]'") from None

    ok = [r for r in rows if r.get("median_ms") is not None]
    if not ok:
        raise ToolError("nothing to plot: every batch size failed")
    sizes = [r["batch_size"] for r in ok]
    fig = Figure(figsize=(10, 4), dpi=100)
    latency_ax, throughput_ax = fig.subplots(1, 2)
    medians = [r["median_ms"] for r in ok]
    low = [r["median_ms"] - r["p10_ms"] for r in ok]
    high = [r["p90_ms"] - r["median_ms"] for r in ok]
    latency_ax.errorbar(sizes, medians, yerr=[low, high], marker="o", capsize=3)
    latency_ax.set(xlabel="batch size", ylabel="latency (ms, median, p10-p90)", title="latency")
    throughput_ax.plot(sizes, [r["throughput_per_s"] for r in ok], marker="o", color="tab:green")
    throughput_ax.set(xlabel="batch size", ylabel="samples / s", title="throughput")
    for ax in (latency_ax, throughput_ax):
        if len(sizes) > 1:
            ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(str(path), format="png")
    return str(path)


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
    fn: Callable[..., Any] = torch.compile(module, backend=backend) if backend else module
    workload = _workload(fn, module, recorded, args, kwargs, run_on, backward)

    measured = _measure(workload, run_on, timing, compiled=backend is not None, trace=trace, top=top)
    eager = workload if not backend else _workload(module, module, recorded, args, kwargs, run_on, backward)
    flops, moved = _count_flops(eager)
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
        sweep = _sweep(fn, module, recorded, args, kwargs, run_on, backward, batch_sizes, sweep_timing)
        if plot is not None:
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
    if not capture.calls:
        raise ToolError(f"{capture.ref} has no recorded calls to profile")
    if not -len(capture.calls) <= call < len(capture.calls):
        raise ToolError(f"{capture.ref} has {len(capture.calls)} recorded call(s); there is no call {call}")
    if plot is not None and not batch_sizes:
        raise ToolError("a plot needs batch sizes to sweep (batch_sizes=[1, 8, 64] / --batch-sizes 1,8,64)")
    if not capture.calls[call].finished:
        raise ToolError(f"{capture.ref} call {capture.calls[call].index} did not finish in the original job; "
                        "pick another call")


@dataclass
class _Measured:
    timing: Timing
    memory: dict[str, Any]
    top_ops: list[dict[str, Any]]
    compile_seconds: float | None


def _measure(workload: _Workload, device: torch.device, timing: TimingConfig, *, compiled: bool,
             trace: str | Path | None, top: int) -> _Measured:
    """Latency (after a first, timed compile when ``compiled``), peak memory and the top operators."""
    compile_seconds = None
    with workload.context():
        if compiled:
            start = time.perf_counter()
            if workload.before_each is not None:
                workload.before_each()
            workload.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            compile_seconds = time.perf_counter() - start
        timed = time_iterations(workload.step, device, timing, before_each=workload.before_each)
    top_ops, memory = _profiler_pass(workload, device, _PROFILER_ITERS, str(trace) if trace else None, top)
    if device.type == "cuda":
        memory = _cuda_memory(workload, device)
    return _Measured(timed, memory, top_ops, compile_seconds)


def _sweep(
    fn: Callable[..., Any],
    module: torch.nn.Module,
    call: Call,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    device: torch.device,
    backward: bool,
    batch_sizes: Sequence[int],
    timing_config: TimingConfig,
) -> list[dict[str, Any]]:
    generator = torch.Generator().manual_seed(0)
    rows = []
    for size in batch_sizes:
        if int(size) < 1:
            raise ToolError(f"batch sizes must be positive, got {size}")
        row: dict[str, Any] = {"batch_size": int(size)}
        try:
            new_args, new_kwargs = synthetic_inputs(args, kwargs, int(size), generator=generator)
            new_args, new_kwargs = pytree.tree_map(
                lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, (new_args, new_kwargs))
            workload = _workload(fn, module, call, new_args, new_kwargs, device, backward)
            with workload.context():
                config = TimingConfig(max(2, min(timing_config.warmup, 5)), timing_config.iters,
                                      timing_config.target_seconds, min_iters=5)
                timing: Timing = time_iterations(workload.step, device, config, before_each=workload.before_each)
            eager = workload
            if fn is not module:
                eager = _workload(module, module, call, new_args, new_kwargs, device, backward)
            flops, _ = _count_flops(eager)
            row.update({
                "median_ms": timing.median_ms, "p10_ms": timing.percentile(10), "p90_ms": timing.percentile(90),
                "iterations": timing.iterations,
                "throughput_per_s": size / (timing.median_ms / 1e3) if timing.median_ms > 0 else None,
                "flops": flops["total"],
                "achieved_flops_per_s": flops["total"] / (timing.median_ms / 1e3) if timing.median_ms > 0 else None,
            })
        except ToolError:
            raise
        except Exception as error:  # one size failing (e.g. out of memory) should not lose the rest
            row.update({"median_ms": None, "error": f"{type(error).__name__}: {error}"})
        rows.append(row)
    for module_param in module.parameters():
        module_param.grad = None
    return rows


def output_tensors(output: Any) -> list[torch.Tensor]:
    """Tensor leaves of an output that autograd can differentiate."""
    return [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]


def tensor_leaves(tree: Any) -> list[torch.Tensor]:
    """Every tensor leaf of a pytree, in flattening order."""
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]
