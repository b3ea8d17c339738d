"""Batch-size sweeps of a recorded call on synthetic inputs, and their plot (``profile --batch-sizes``).

Each batch size gets inputs like the recorded ones with the batch dimension resized
(:func:`synthetic_inputs`: values drawn like the recorded ones, index tensors in range), and is
timed and counted like the recorded call itself (:mod:`modulelens.tools.measure`). One size
failing (out of memory) is a row with its error; the others are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from modulelens.errors import MissingDependencyError, ToolError
from modulelens.restore.synthesize import random_like
from modulelens.tools.measure import build_workload, count_flops, tensor_leaves
from modulelens.tools.timing import Timing, TimingConfig, time_iterations

if TYPE_CHECKING:
    from modulelens.restore.calls import Call


def recorded_batch_size(args: tuple[object, ...], kwargs: Mapping[str, object]) -> int | None:
    """Dim 0 of the first input tensor with at least one dimension (``None`` if there is none).

    Example::

        recorded_batch_size(*cap.calls[0].inputs)   # 64
    """
    for tensor in tensor_leaves((args, kwargs)):
        if tensor.dim() >= 1:
            return int(tensor.shape[0])
    return None


def synthetic_inputs(
    args: tuple[object, ...],
    kwargs: Mapping[str, object],
    batch_size: int,
    *,
    generator: torch.Generator | None = None,
) -> tuple[tuple[object, ...], dict[str, object]]:
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

    def resize(value: object) -> object:
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


def sweep_batch_sizes(
    fn: Callable[..., object],
    module: torch.nn.Module,
    call: Call,
    args: tuple[object, ...],
    kwargs: Mapping[str, object],
    device: torch.device,
    backward: bool,
    batch_sizes: Sequence[int],
    timing_config: TimingConfig,
    progress: Callable[[str], None] | None = None,
    entry: Callable[..., object] | None = None,
) -> list[dict[str, object]]:
    """One row per batch size: median/p10/p90 latency, throughput, FLOPs and achieved FLOP/s of
    ``fn`` on synthetic inputs (or the size's error); ``progress`` is told each size as it starts.
    ``entry`` is what the recorded call called, uncompiled (FLOPs are counted on it): the module, or
    its method for a method capture (default: ``module``)."""
    generator = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = []
    for size in batch_sizes:
        if int(size) < 1:
            raise ToolError(f"batch sizes must be positive, got {size}")
        row: dict[str, Any] = {"batch_size": int(size)}
        if progress is not None:
            progress(f"batch sweep: batch size {size} ({len(rows) + 1} of {len(batch_sizes)})")
        try:
            new_args, new_kwargs = synthetic_inputs(args, kwargs, int(size), generator=generator)
            new_args, new_kwargs = pytree.tree_map(
                lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, (new_args, new_kwargs))
            workload = build_workload(fn, module, call, new_args, new_kwargs, device, backward)
            with workload.context():
                config = TimingConfig(max(2, min(timing_config.warmup, 5)), timing_config.iters,
                                      timing_config.target_seconds, min_iters=5)
                timing: Timing = time_iterations(workload.step, device, config, before_each=workload.before_each)
            eager = workload
            eager_fn = module if entry is None else entry  # what the recorded call called, not compiled
            if fn is not eager_fn:
                eager = build_workload(eager_fn, module, call, new_args, new_kwargs, device, backward)
            flops, _ = count_flops(eager)
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
