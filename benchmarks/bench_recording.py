"""Recording overhead: a forward pass while the inputs and outputs of chosen submodules are recorded,
modulelens against nnsight (https://nnsight.net), and both against the same forward untraced.

    python benchmarks/bench_recording.py [--steps 20] [--rounds 9]

Each contender records the same thing on its own copy of the model: every call's inputs and output of
the four targets.
  * untraced:    model(x)
  * modulelens:  a capture of the targets (Recording(max_calls=steps)); each timed forward records
                 every target (snapshot copies of its tensors, kept in memory; saving is not timed)
  * nnsight:     with NNsight(model).trace(x): target.input.save(); target.output.save() for each target
  * done:        model(x) under a capture whose targets have all their calls (Recording(max_calls=1),
                 recorded before timing starts): what the rest of a job pays once recording is over
Each contender has its own copy of the model (same weights); every step runs the four in a
different order (all 24 in turn), --steps steps per round (a fresh capture each round), and the
ratios are medians of per-step ratios. The models run with their default settings (a transformers model built from a
config is in train mode, with caches on), on 1 thread.
nnsight is in the `bench` extra (pip install -e ".[bench]").
"""

from __future__ import annotations

import argparse
import copy
import itertools
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _common import median, report

import modulelens
from modulelens.demo.model import CARDINALITIES, RecModel, synthetic_batch

try:
    from nnsight import NNsight
except ImportError:  # pragma: no cover - the benchmark says how to get it
    sys.exit('bench_recording.py compares against nnsight: pip install -e ".[bench]"')


def _gpt2() -> tuple[nn.Module, tuple[Any, ...], list[str]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=1000, n_positions=128,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, config.vocab_size, (8, 64), generator=torch.Generator().manual_seed(0))
    return model, (ids,), [f"transformer.h.{i}" for i in range(config.n_layer)]


def _recmodel() -> tuple[nn.Module, tuple[Any, ...], list[str]]:
    model = RecModel(CARDINALITIES)
    dense, sparse, _ = synthetic_batch(512, torch.Generator().manual_seed(0))
    return model, (dense, sparse), ["embeddings", "attention", "interaction", "top_mlp"]


def _nnsight_recorder(model: nn.Module, inputs: tuple[Any, ...], targets: list[str]) -> Callable[[], list[Any]]:
    wrapped = NNsight(model)
    envoys = [_envoy(wrapped, name) for name in targets]

    def record() -> list[Any]:
        saved: list[Any] = []
        with wrapped.trace(*inputs):  # targets in the order they run, as nnsight requires
            for envoy in envoys:
                saved.append(envoy.input.save())
                saved.append(envoy.output.save())
        return saved

    return record


def _envoy(wrapped: Any, name: str) -> Any:
    envoy = wrapped
    for part in name.split("."):
        envoy = envoy[int(part)] if part.isdigit() else getattr(envoy, part)
    return envoy


def measure(label: str, model: nn.Module, inputs: tuple[Any, ...], targets: list[str], steps: int, rounds: int,
            repo: Path) -> dict[str, Any]:
    """Four copies of one model (same weights), one per contender, stepped in turn: each step runs
    all four, in each order in turn, so a slow spell of the machine (this one's clock varies by a
    third over seconds) falls on all four alike. The ratios are medians of per-step ratios."""
    plain, traced, wrapped, finished = model, copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model)
    nnsight_record = _nnsight_recorder(wrapped, inputs, targets)
    # The capture stays open (as in a job's `with` block) after its targets have their one call.
    done = modulelens.capture(finished, targets=targets, repo=repo, name="bench-done",
                              record=modulelens.Recording(max_calls=1))
    finished(*inputs)
    assert done.complete and done.tracer.active_hooks == 0, "the done capture still has hooks"
    contenders: dict[str, Callable[[], Any]] = {
        "untraced": lambda: plain(*inputs),
        "modulelens": lambda: traced(*inputs),
        "nnsight": nnsight_record,
        "done": lambda: finished(*inputs),
    }
    times: dict[str, list[float]] = {k: [] for k in contenders}
    # Every order of the four in turn, not a rotation of one: a rotation keeps who follows whom, so
    # one contender would always run right after nnsight's trace and pay for what it leaves behind.
    orders = list(itertools.permutations(contenders))
    for r in range(rounds + 1):  # round 0 warms every path up and is not kept
        capture = modulelens.capture(traced, targets=targets, repo=repo, name="bench",
                                     record=modulelens.Recording(max_calls=steps + 1))
        try:
            traced(*inputs)  # the first recorded call of each target (imports, first snapshots): not timed
            for step in range(steps):
                for key in orders[(r * steps + step) % len(orders)]:
                    start = time.perf_counter()
                    contenders[key]()
                    if r:
                        times[key].append(time.perf_counter() - start)
        finally:
            recorded = [len(record.calls) for record in capture.tracer.records.values()]
            assert recorded == [steps + 1] * len(targets), f"not every call was recorded: {recorded}"
            capture.stop()
            capture.tracer.records.clear()  # nothing is saved: recording alone is measured
    done.stop()
    ml, nn_, base = (median(times[k]) for k in ("modulelens", "nnsight", "untraced"))

    def paired(a: str, b: str) -> float:
        return median([x / y for x, y in zip(times[a], times[b], strict=True)])

    return {"model": label, "targets": len(targets), "untraced_ms": base * 1e3, "modulelens_ms": ml * 1e3,
            "nnsight_ms": nn_ * 1e3, "modulelens_vs_untraced": paired("modulelens", "untraced"),
            "nnsight_vs_untraced": paired("nnsight", "untraced"),
            "modulelens_vs_nnsight": paired("modulelens", "nnsight"), "done_ms": median(times["done"]) * 1e3,
            "done_vs_untraced": paired("done", "untraced"), "steps_timed": len(times["untraced"])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    modulelens.track_init()
    rows = []
    with tempfile.TemporaryDirectory() as repo:
        for label, build in (("GPT-2 (4 blocks of 256, batch 8 x 64 tokens)", _gpt2),
                             ("demo RecModel (batch 512)", _recmodel)):
            model, inputs, targets = build()
            rows.append(measure(label, model, inputs, targets, args.steps, args.rounds, Path(repo)))
    report("recording", "forward pass while recording every call's inputs and output of 4 submodules", rows,
           ["model", "untraced_ms", "modulelens_ms", "nnsight_ms", "modulelens_vs_nnsight", "done_vs_untraced"],
           {"steps": args.steps, "rounds": args.rounds, "threads": 1, "paired": "per step"})


if __name__ == "__main__":
    main()
