"""A repo like the one ``modulelens demo`` makes, in seconds: the demo's model and targets, trained
under capture in-process, plus what the UI's pages need that the demo alone does not have (a
second version of ``top_mlp`` after more training, a shape-only tensor, stored reports).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

import modulelens
from modulelens.demo.model import CARDINALITIES, RecModel, synthetic_batch
from modulelens.tools.timing import TimingConfig

TARGETS = ["embeddings", "attention", "interaction", "top_mlp"]


def _train(model: RecModel, steps: int, generator: torch.Generator) -> None:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for _ in range(steps):
        dense, sparse, labels = synthetic_batch(64, generator)
        optimizer.zero_grad()
        loss_fn(model(dense, sparse), labels).backward()
        optimizer.step()


def make_demo_repo(root: Path, *, reports: bool = True) -> dict[str, Any]:
    """The demo's captures in ``root`` (``demo/<target>:v1``, then ``demo/top_mlp:v2`` after more
    training, with tags, a golden alias, a shape-only input, and a replay and a profile report).

    Returns:
        ``{"repo": Repo, "refs": [...], "top_v1", "top_v2"}``.
    """
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    handle = modulelens.track_init()
    try:
        model = RecModel(CARDINALITIES)
    finally:
        handle.stop()
    repo = modulelens.Repo(root)
    # the attention block's [64, 4, 16] input and output go shape-only (dtype, shape, statistics)
    with modulelens.capture(model, targets=TARGETS, repo=repo, name="demo", tags=["demo", "rec"],
                            record=modulelens.Recording(warmup=1, max_calls=2), metadata={"step": 3},
                            payload=modulelens.PayloadPolicy(shape_only_over=8192), strict=True) as first:
        _train(model, 3, generator)
    _train(model, 5, generator)
    with modulelens.capture(model, targets=["top_mlp"], repo=repo, name="demo", tags=["demo", "retrained"],
                            record=modulelens.Recording(max_calls=1), metadata={"step": 8}, strict=True) as second:
        _train(model, 1, generator)
    refs = [v.ref for v in first.saved] + [v.ref for v in second.saved]
    top_v1 = next(r for r in refs if r.startswith("demo/top_mlp:v1"))
    top_v2 = next(r for r in refs if r.startswith("demo/top_mlp:v2"))
    repo.set_alias(top_v1, "golden")
    if reports:
        capture = modulelens.load(top_v2, repo=repo)
        report = capture.replay()
        repo.add_report(capture.ref, "replay", report.to_dict())
        time.sleep(1.1)  # reports are stamped to the second: the profile is the newer one
        modulelens.profile(capture, batch_sizes=[1, 8, 32], timing=TimingConfig(warmup=1, iters=5), store=True)
    return {"repo": repo, "refs": refs, "top_v1": top_v1, "top_v2": top_v2}
