"""Recording overhead: a forward pass, and a training step, while the inputs and outputs of chosen
submodules are recorded, modulelens against nnsight (https://nnsight.net), and both against the
same work untraced.

    python benchmarks/bench_recording.py [--steps 20] [--rounds 9] [--train-steps 6] [--train-rounds 5] [--only train]

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
ratios are medians of per-step ratios.

The training-step row is issue 37's own case: transformers' GPT-2-small (its default config: 12
layers, 768 wide, 50,257 tokens; train mode, dropout on), one step = forward, the model's own
language-modelling loss, backward and an AdamW step, each contender with its own model copy and
optimizer, 4 blocks recorded. nnsight saves the same blocks' inputs and outputs inside its trace and
the loss; backward and the step run after the trace. The optimizer changes the blocks' weights every
step, so modulelens records a new state of each block's weights at every recorded call (large ones
streamed to the repo in the background, tracing/weights.py), as a user recording a training run
with Recording(max_calls=N) gets; the benchmark checks that each recorded call has its own state.
The models run with their default settings (a transformers model built from a
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


def _gpt2_small(batch: int, tokens: int) -> tuple[nn.Module, tuple[Any, ...], list[str]]:
    """GPT-2-small as transformers' default config builds it, its language-modelling loss on
    ``batch`` x ``tokens`` random tokens; 4 of its 12 blocks recorded (one in every three)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config()
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, config.vocab_size, (batch, tokens), generator=torch.Generator().manual_seed(0))
    return model, (ids, ids), [f"transformer.h.{i}" for i in (0, 4, 8, 11)]


def _recmodel() -> tuple[nn.Module, tuple[Any, ...], list[str]]:
    model = RecModel(CARDINALITIES)
    dense, sparse, _ = synthetic_batch(512, torch.Generator().manual_seed(0))
    return model, (dense, sparse), ["embeddings", "attention", "interaction", "top_mlp"]


class _Work:
    """What one contender runs per step on its own model: a forward pass, or (``train``) a
    training step: forward with labels, the model's own loss, backward and an AdamW step."""

    def __init__(self, model: nn.Module, inputs: tuple[Any, ...], train: bool) -> None:
        self.model, self.inputs, self.train = model, inputs, train
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4) if train else None

    def forward(self) -> Any:
        if not self.train:
            return self.model(*self.inputs)
        ids, labels = self.inputs
        return self.model(ids, labels=labels)

    def finish(self, output: Any) -> None:
        if self.optimizer is not None:
            output.loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()

    def step(self) -> None:
        self.finish(self.forward())


def _nnsight_recorder(work: _Work, targets: list[str]) -> Callable[[], None]:
    wrapped = NNsight(work.model)
    envoys = [_envoy(wrapped, name) for name in targets]
    ids, labels = work.inputs if work.train else (None, None)

    def record() -> None:
        saved: list[Any] = []
        with (wrapped.trace(ids, labels=labels) if work.train else wrapped.trace(*work.inputs)):
            for envoy in envoys:  # targets in the order they run, as nnsight requires
                saved.append(envoy.input.save())
                saved.append(envoy.output.save())
            output = wrapped.output.save()
        work.finish(output)

    return record


def _envoy(wrapped: Any, name: str) -> Any:
    envoy = wrapped
    for part in name.split("."):
        envoy = envoy[int(part)] if part.isdigit() else getattr(envoy, part)
    return envoy


def measure(label: str, model: nn.Module, inputs: tuple[Any, ...], targets: list[str], steps: int, rounds: int,
            repo: Path, train: bool = False) -> dict[str, Any]:
    """Four copies of one model (same weights), one per contender, stepped in turn: each step runs
    all four, in each order in turn, so a slow spell of the machine (this one's clock varies by a
    third over seconds) falls on all four alike. The ratios are medians of per-step ratios."""
    copies = [model, copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model)]
    plain, traced, wrapped, finished = (_Work(m, inputs, train) for m in copies)
    nnsight_record = _nnsight_recorder(wrapped, targets)
    # The capture stays open (as in a job's `with` block) after its targets have their one call.
    done = modulelens.capture(finished.model, targets=targets, repo=repo, name="bench-done",
                              record=modulelens.Recording(max_calls=1))
    finished.step()
    assert done.complete and done.tracer.active_hooks == 0, "the done capture still has hooks"
    contenders: dict[str, Callable[[], Any]] = {
        "untraced": plain.step,
        "modulelens": traced.step,
        "nnsight": nnsight_record,
        "done": finished.step,
    }
    times: dict[str, list[float]] = {k: [] for k in contenders}
    # Every order of the four in turn, not a rotation of one: a rotation keeps who follows whom, so
    # one contender would always run right after nnsight's trace and pay for what it leaves behind.
    orders = list(itertools.permutations(contenders))
    for r in range(rounds + 1):  # round 0 warms every path up and is not kept
        capture = modulelens.capture(traced.model, targets=targets, repo=repo, name="bench",
                                     record=modulelens.Recording(max_calls=steps + 1))
        try:
            traced.step()  # the first recorded call of each target (imports, first snapshots): not timed
            for step in range(steps):
                for key in orders[(r * steps + step) % len(orders)]:
                    start = time.perf_counter()
                    contenders[key]()
                    if r:
                        times[key].append(time.perf_counter() - start)
        finally:
            records = list(capture.tracer.records.values())
            recorded = [len(record.calls) for record in records]
            assert recorded == [steps + 1] * len(targets), f"not every call was recorded: {recorded}"
            # A training step changes the weights between recorded calls: each call has its own state.
            states = [len({call.state_index for call in record.calls}) for record in records]
            assert states == [steps + 1 if train else 1] * len(targets), f"weight states per target: {states}"
            capture.stop()
            capture.tracer.synchronize()  # the streamed weights' writes end inside the round that made them
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
    # at most --steps/--rounds, so run_all.py's quick check (--steps 3 --rounds 3) stays quick
    parser.add_argument("--train-steps", type=int, help="training steps per round (GPT-2-small row; default 6)")
    parser.add_argument("--train-rounds", type=int, help="rounds of the training-step row (default 5)")
    parser.add_argument("--train-tokens", type=int, default=64, help="tokens per sequence of the training step")
    parser.add_argument("--only", choices=("forward", "train"), help="one kind of row only")
    args = parser.parse_args()
    args.train_steps = args.train_steps or min(6, args.steps)
    args.train_rounds = args.train_rounds or min(5, args.rounds)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    modulelens.track_init()
    rows = []
    with tempfile.TemporaryDirectory() as repo:
        if args.only != "train":
            for label, build in (("GPT-2 (4 blocks of 256, batch 8 x 64 tokens)", _gpt2),
                                 ("demo RecModel (batch 512)", _recmodel)):
                model, inputs, targets = build()
                rows.append(measure(label, model, inputs, targets, args.steps, args.rounds, Path(repo)))
                del model, inputs
        if args.only != "forward":
            model, inputs, targets = _gpt2_small(1, args.train_tokens)
            rows.append(measure(f"GPT-2-small training step (4 of 12 blocks, batch 1 x {args.train_tokens} tokens)",
                                model, inputs, targets, args.train_steps, args.train_rounds, Path(repo), train=True))
    report("recording", "forward pass (training step: forward, loss, backward, AdamW) while recording every "
           "call's inputs and output of 4 submodules", rows,
           ["model", "untraced_ms", "modulelens_ms", "nnsight_ms", "modulelens_vs_nnsight", "done_vs_untraced"],
           {"steps": args.steps, "rounds": args.rounds, "train_steps": args.train_steps,
            "train_rounds": args.train_rounds, "threads": 1, "paired": "per step"})


if __name__ == "__main__":
    main()
