"""Two threads calling one target at once: each recorded call keeps its own inputs and output."""

from __future__ import annotations

import threading
import time

import torch
from torch import nn

import modulelens


class SlowScale(nn.Module):
    """Sleeps inside forward so that calls from two threads overlap."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.arange(1.0, width + 1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.002)
        return x * self.scale + x.sum()


def test_concurrent_calls_are_paired_with_their_own_outputs(repo: modulelens.Repo) -> None:
    model = nn.Sequential(SlowScale(4))
    per_thread = 15
    with modulelens.capture(model, targets=["0"], repo=repo, name="threads", record=modulelens.Recording(max_calls=2 * per_thread)) as cap:
        def work(seed: int) -> None:
            for i in range(per_thread):
                with torch.no_grad():
                    model(torch.full((2, 4), float(seed * 100 + i)))

        threads = [threading.Thread(target=work, args=(seed,)) for seed in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    loaded = modulelens.load(cap.saved[0].ref, repo=repo)
    assert len(loaded.calls) == 2 * per_thread
    seeds = {int(call.args[0][0, 0].item()) // 100 for call in loaded.calls}
    assert seeds == {1, 2}  # both threads were recorded
    mispaired = 0
    for call in loaded.calls:
        x = call.args[0]
        expected = x * torch.arange(1.0, 5.0) + x.sum()
        mispaired += not torch.equal(call.output, expected)
    assert mispaired == 0
    assert loaded.replay().passed
