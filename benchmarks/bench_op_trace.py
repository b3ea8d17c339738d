"""The op trace's recording cost and the first-divergence locator's time, on a GPT-2-small block.

    python benchmarks/bench_op_trace.py [--steps 10] [--rounds 5] [--tokens 128]

A GPT-2-small block (transformers' GPT2Block from the default GPT2Config: 768 wide, 12 heads, its
default settings: training mode, dropout on) on one batch of --tokens tokens, 1 thread.

Recording (issue 36: "its cost is paid on recorded calls only"): four copies of the block (same
weights), stepped in a rotating order each step, the ratios medians of per-step ratios:
  * untraced:          block(x)
  * recorded:          a capture recording every call (Recording(max_calls=...)), no op trace
  * op trace:          the same with Recording(op_trace=True) (16 MiB of values kept per call)
  * op trace, no values: Recording(op_trace=True, op_trace_values=0) (fingerprints and statistics only)
and a warm-up call (hooks on, nothing recorded) with the op trace option on against off.

Locating (issue 36: "the locator's time"), on a capture of the block recorded with its op trace and a
rewrite whose second layer norm has another epsilon (it diverges at ``ln_2``):
  * locate:          the alignment and comparison of the two traces alone (restore.divergence.locate)
  * verify / verify + locate:  modulelens.verify(timing=None) without and with locate_divergence
  * replay / replay + locate:  a failing replay (the rewrite run on the recorded calls) without and with it
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import median, report

import modulelens
from modulelens.restore.divergence import DivergenceRule, locate, trace_call


def _block() -> tuple[torch.nn.Module, type[torch.nn.Module]]:
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    class EpsilonBlock(GPT2Block):  # the rewrite the locator is timed on
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.ln_2.eps = 1e-2

    return GPT2Block(GPT2Config(), layer_idx=0), EpsilonBlock


def recording(block: torch.nn.Module, x: torch.Tensor, steps: int, rounds: int, repo: Path) -> dict[str, Any]:
    options = {"recorded": modulelens.Recording(max_calls=steps + 1),
               "op_trace": modulelens.Recording(max_calls=steps + 1, op_trace=True),
               "op_trace_no_values": modulelens.Recording(max_calls=steps + 1, op_trace=True, op_trace_values=0)}
    copies = {"untraced": block, **{label: copy.deepcopy(block) for label in options}}
    times: dict[str, list[float]] = {label: [] for label in copies}
    order = list(copies)
    ops = 0
    for r in range(rounds + 1):  # round 0 warms every path up and is not kept
        captures = {label: modulelens.capture(copies[label], "", repo=repo, name=label, record=record)
                    for label, record in options.items()}
        try:
            for label in options:
                copies[label](x)  # the first recorded call (the weights' snapshot): not timed
            for step in range(steps):
                turn = (r * steps + step) % len(order)
                for label in order[turn:] + order[:turn]:
                    start = time.perf_counter()
                    copies[label](x)
                    if r:
                        times[label].append(time.perf_counter() - start)
        finally:
            for label, cap in captures.items():
                calls = cap.tracer.records[""].calls
                assert len(calls) == steps + 1, f"{label}: {len(calls)} calls recorded"
                if label == "op_trace":
                    trace = calls[-1].op_trace
                    assert trace is not None
                    ops = len(trace.ops)
                cap.stop()
                cap.tracer.records.clear()  # nothing is saved: recording alone is measured

    def paired(a: str, b: str) -> float:
        return median([x / y for x, y in zip(times[a], times[b], strict=True)])

    return {"untraced_ms": median(times["untraced"]) * 1e3, "recorded_ms": median(times["recorded"]) * 1e3,
            "op_trace_ms": median(times["op_trace"]) * 1e3,
            "op_trace_no_values_ms": median(times["op_trace_no_values"]) * 1e3,
            "op_trace_vs_recorded": paired("op_trace", "recorded"),
            "op_trace_no_values_vs_recorded": paired("op_trace_no_values", "recorded"),
            "recorded_vs_untraced": paired("recorded", "untraced"), "ops": ops, "steps_timed": len(times["untraced"])}


def warmup_cost(block: torch.nn.Module, x: torch.Tensor, rounds: int, repo: Path) -> dict[str, Any]:
    """Calls the capture does not record (warm-up) with the op trace option on and off."""
    on, off = block, copy.deepcopy(block)
    times: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(rounds + 1):
        caps = [modulelens.capture(on, "", repo=repo, name="on", record=modulelens.Recording(warmup=10**6, op_trace=True)),
                modulelens.capture(off, "", repo=repo, name="off", record=modulelens.Recording(warmup=10**6))]
        try:
            for step in range(4):
                for label, module in (("on", on), ("off", off)) if (r + step) % 2 else (("off", off), ("on", on)):
                    start = time.perf_counter()
                    module(x)
                    if r:
                        times[label].append(time.perf_counter() - start)
        finally:
            for cap in caps:
                cap.stop()
    return {"warmup_on_ms": median(times["on"]) * 1e3, "warmup_off_ms": median(times["off"]) * 1e3,
            "warmup_on_vs_off": median([a / b for a, b in zip(times["on"], times["off"], strict=True)])}


def locating(block: torch.nn.Module, rewrite_class: type[torch.nn.Module], x: torch.Tensor, rounds: int,
             repo: Path) -> dict[str, Any]:
    with modulelens.capture(block, "", repo=repo, name="gpt2-block", record=modulelens.Recording(op_trace=True)):
        block(x)
    capture = modulelens.load("gpt2-block", repo=repo)
    rewrite = rewrite_class(*capture.init_arguments[0], **capture.init_arguments[1])
    rewrite.load_state_dict(capture.state_dict())
    call = capture.calls[0]

    def traced(module: torch.nn.Module) -> Any:
        args, kwargs = call.fresh_inputs()
        with call.context(module, weights=False):
            return trace_call(module, lambda: module(*args, **kwargs))[1]

    expected, actual = traced(capture.module), traced(rewrite)
    rule = DivergenceRule()
    found = locate(expected, actual, rule, compared="bench")
    assert found.first is not None and found.first.reference.module == "ln_2", found.summary()
    contenders: dict[str, Callable[[], Any]] = {
        "locate": lambda: locate(expected, actual, rule, compared="bench"),
        "verify": lambda: modulelens.verify(capture, rewrite_class, timing=None, store=False, locate_divergence=False),
        "verify_locate": lambda: modulelens.verify(capture, rewrite_class, timing=None, store=False),
        "replay": lambda: capture.replay(module=rewrite, locate_divergence=False),
        "replay_locate": lambda: capture.replay(module=rewrite),
    }
    times: dict[str, list[float]] = {k: [] for k in contenders}
    order = list(contenders)
    for r in range(rounds + 1):
        for label in order[r % len(order):] + order[:r % len(order)]:
            start = time.perf_counter()
            result = contenders[label]()
            if r:
                times[label].append(time.perf_counter() - start)
            if label == "replay_locate":
                assert result.calls[0].divergence is not None and result.calls[0].divergence.found
    return {"ops": len(expected.ops), **{f"{k}_ms": median(v) * 1e3 for k, v in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    modulelens.track_init()
    block, rewrite_class = _block()
    x = torch.randn(1, args.tokens, 768, generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as repo:
        recorded = recording(block, x, args.steps, args.rounds, Path(repo))
        recorded.update(warmup_cost(block, x, args.rounds, Path(repo)))
        located = locating(block, rewrite_class, x, args.rounds, Path(repo))
    label = f"GPT-2-small block, 1 x {args.tokens} tokens"
    report("op_trace", f"op trace: recording cost and locator time ({label})",
           [{"measure": "recording", "model": label, **recorded}, {"measure": "locating", "model": label, **located}],
           ["measure", "untraced_ms", "recorded_ms", "op_trace_ms", "op_trace_vs_recorded",
            "op_trace_no_values_vs_recorded", "warmup_on_vs_off", "locate_ms", "verify_ms", "verify_locate_ms",
            "replay_ms", "replay_locate_ms", "ops"],
           {"steps": args.steps, "rounds": args.rounds, "tokens": args.tokens, "threads": 1, "paired": "per step"})


if __name__ == "__main__":
    main()
