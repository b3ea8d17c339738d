"""Child processes for the remote-repo tests: capture into, load from and push to repos at URLs."""

from __future__ import annotations

import json
import sys
import time

import torch
from torch import nn

import modulelens


class StoredOnly(nn.Module):
    """Defined in the child's ``__main__``: another process can rebuild it only from stored source."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(x))


def capture(repo: str, name: str, width: str) -> None:
    modulelens.track_init()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(int(width), int(width)), nn.GELU(), StoredOnly(int(width)))
    with modulelens.capture(model, targets=["0", "2"], repo=repo, name=name) as cap:
        model(torch.randn(4, int(width)))
    print(json.dumps([info.ref for info in cap.wait()]), flush=True)


def load(repo: str, *refs: str) -> None:
    results = []
    for ref in refs:
        capture = modulelens.load(ref, repo=repo)
        results.append({"passed": capture.replay().passed, "ref": capture.ref})
    print(json.dumps(results), flush=True)


def push(source: str, ref: str, target: str) -> None:
    print(json.dumps(modulelens.Repo(source).push(ref, target).to_dict()), flush=True)


def hold_lease(repo: str) -> None:
    """Take a save's lease (as a save does before uploading) and hang until killed: what a saver
    that crashes mid-upload leaves behind."""
    with modulelens.Repo(repo).writing():
        print("held", flush=True)
        time.sleep(600)


if __name__ == "__main__":
    {"capture": capture, "load": load, "push": push, "hold_lease": hold_lease}[sys.argv[1]](*sys.argv[2:])
