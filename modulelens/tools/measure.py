"""Measuring one iteration of a recorded call: the workload, its timing, FLOPs and bytes, the
operators torch.profiler sees, and peak memory (what ``profile`` reports; the batch sweep in
``sweep.py`` measures its synthetic inputs the same way).

* latency: warm-up iterations, then per-iteration timings (:mod:`modulelens.tools.timing`);
* peak memory: on CUDA ``torch.cuda.max_memory_allocated`` above the pre-call baseline for one
  iteration; on CPU the running sum of the CPU allocator's allocation/free events recorded by
  ``torch.profiler(profile_memory=True)`` (tensor memory, not the process RSS, which the
  allocator caches hide);
* FLOPs from ``torch.utils.flop_counter.FlopCounterMode`` and every aten op seen through a
  ``TorchDispatchMode``: ops with no FLOP formula are listed, not silently counted as zero; bytes
  moved = tensor bytes read + written by every non-view aten op (an upper bound for eager mode);
* the top operators by self time from ``torch.profiler``, and optionally a Chrome trace.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from modulelens.errors import ToolError
from modulelens.restore.replay import call_context
from modulelens.tools.timing import Timing, TimingConfig, time_iterations

if TYPE_CHECKING:
    from torch._ops import OpOverload

    from modulelens.restore.calls import Call

_MARK = "modulelens.iteration"
PROFILER_ITERS = 3  # iterations under torch.profiler for the top-ops table and the trace
# What torch's profiler writes straight to the process's stderr, whatever its log level: kineto when
# it starts and stops ("USDT:... profiler_start", "STAGE:... Completed Stage: Warm Up"), and c10's
# allocator when a tensor made before profiling is freed during it ("[W1206 03:53:46.28 CPUAllocator.cpp:245]
# Memory block of unknown size was allocated before the profiling started, ..."): lines that start with,
# or contain, these.
_PROFILER_CHATTER_STARTS = (b"USDT:", b"STAGE:")
_PROFILER_CHATTER_CONTAINS = (b"Memory block of unknown size was allocated before the profiling started",)


@dataclass
class Workload:
    """What one timed iteration runs, and how to prepare it."""

    step: Callable[[], Any]
    before_each: Callable[[], None] | None
    context: Callable[[], contextlib.AbstractContextManager[Any]]


def build_workload(
    fn: Callable[..., Any],
    module: torch.nn.Module,
    call: Call,
    args: tuple[object, ...],
    kwargs: Mapping[str, object],
    device: torch.device,
    backward: bool,
) -> Workload:
    def context() -> contextlib.AbstractContextManager[object]:
        stack = contextlib.ExitStack()
        stack.enter_context(call_context(call, device))
        stack.enter_context(torch.enable_grad() if backward else torch.no_grad())
        return stack

    if not backward:
        return Workload(step=lambda: fn(*args, **kwargs), before_each=None, context=context)
    inputs = [t for t in tensor_leaves((args, kwargs)) if t.is_floating_point() or t.is_complex()]
    for tensor in inputs:
        tensor.requires_grad_(True)
    params = [p for p in module.parameters() if p.requires_grad]
    with context():
        output = fn(*args, **kwargs)
    probe = output_tensors(output)
    if not probe:
        raise ToolError("--backward: no output requires grad (no trainable parameters and no floating inputs)")
    grads = [torch.ones_like(t) for t in probe]
    single = isinstance(output, torch.Tensor)
    del probe, output

    def before_each() -> None:
        for param in params:
            param.grad = None
        for tensor in inputs:
            tensor.grad = None

    if single:  # the common case, without flattening the output every iteration
        grad = grads[0]

        def step() -> None:
            fn(*args, **kwargs).backward(grad)
    else:
        def step() -> None:
            torch.autograd.backward(output_tensors(fn(*args, **kwargs)), grads)

    return Workload(step=step, before_each=before_each, context=context)


# ------------------------------------------------------------------------------------------------
# FLOPs and bytes


class _OpCensus(TorchDispatchMode):
    """Counts every aten op and the tensor bytes each non-view op reads and writes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[OpOverload] = Counter()
        self.bytes = 0

    def __torch_dispatch__(self, func: OpOverload, types: Sequence[type], args: Sequence[object] = (),
                           kwargs: Mapping[str, object] | None = None) -> object:
        out = func(*args, **(kwargs or {}))
        self.ops[func] += 1
        if not func.is_view:
            for tensor in tensor_leaves((args, kwargs, out)):
                self.bytes += tensor.numel() * tensor.element_size()
        return out


def _op_category(func: OpOverload) -> str:
    if func.is_view:
        return "view"
    tags = set(getattr(func, "tags", ()))
    if torch.Tag.pointwise in tags:
        return "pointwise"
    if torch.Tag.reduction in tags:
        return "reduction"
    return "other"


def count_flops(workload: Workload) -> tuple[dict[str, Any], dict[str, Any]]:
    """FLOPs (with the ops that have no formula) and bytes moved of one iteration of ``workload``."""
    counter = FlopCounterMode(display=False)
    census = _OpCensus()
    registry = getattr(counter, "flop_registry", None)
    if registry is None:  # pragma: no cover - older torch
        from torch.utils.flop_counter import flop_registry

        registry = flop_registry
    with workload.context():
        if workload.before_each is not None:
            workload.before_each()
        with counter, census:
            workload.step()
    per_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    uncounted: list[dict[str, Any]] = [
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


def profiler_pass(workload: Workload, device: torch.device, iterations: int, trace: str | None,
                   top: int) -> tuple[list[dict[str, object]], dict[str, object]]:
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    prof = torch_profile(activities=activities, profile_memory=True)
    # the whole profiled run, not only start and stop: the allocator's line comes from inside it
    with workload.context(), without_profiler_chatter():
        prof.start()
        try:
            for _ in range(iterations):
                if workload.before_each is not None:
                    workload.before_each()
                with record_function(_MARK):
                    workload.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        finally:
            prof.stop()
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


def cuda_memory(workload: Workload, device: torch.device) -> dict[str, object]:
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


@contextlib.contextmanager
def without_profiler_chatter() -> Iterator[None]:
    """Keep the lines torch's profiler writes to file descriptor 2 (``USDT: ... profiler_start``, the
    allocator's "Memory block of unknown size": no log level turns them off) out of the user's terminal.

    Everything else written to stderr meanwhile (a warning, an error) is passed on when the block
    ends, so nothing but that chatter is lost.
    """
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (an embedded interpreter): nothing to filter
        yield
        return
    sys.stderr.flush()
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True)
                    if not line.startswith(_PROFILER_CHATTER_STARTS)
                    and not any(part in line for part in _PROFILER_CHATTER_CONTAINS)]
            if kept:
                os.write(2, b"".join(kept))


# ------------------------------------------------------------------------------------------------
# One measurement


@dataclass
class Measured:
    timing: Timing
    memory: dict[str, Any]
    top_ops: list[dict[str, Any]]
    compile_seconds: float | None


def measure(workload: Workload, device: torch.device, timing: TimingConfig, *, compiled: bool,
             trace: str | Path | None, top: int) -> Measured:
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
    top_ops, memory = profiler_pass(workload, device, PROFILER_ITERS, str(trace) if trace else None, top)
    if device.type == "cuda":
        memory = cuda_memory(workload, device)
    return Measured(timed, memory, top_ops, compile_seconds)


def output_tensors(output: object) -> list[torch.Tensor]:
    """Tensor leaves of an output that autograd can differentiate."""
    return [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]


def tensor_leaves(tree: object) -> list[torch.Tensor]:
    """Every tensor leaf of a pytree, in flattening order."""
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]
