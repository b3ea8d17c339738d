"""Run by the tests as several concurrent processes saving under one name."""

from __future__ import annotations

import sys

import torch
from torch import nn

import modulelens


def main() -> None:
    repo, name, count, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    modulelens.track_init()
    torch.manual_seed(seed)
    module = nn.Linear(32, 32)
    for _ in range(count):
        with modulelens.capture(module, targets="Linear", repo=repo, name=name) as cap:
            module(torch.randn(4, 32))
        print(cap.wait()[0].ref, flush=True)


if __name__ == "__main__":
    main()
