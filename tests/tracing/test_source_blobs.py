"""Source files are stored once, as content-addressed blobs referenced from each capture's
metadata (issue 11), and captures holding the text inline (written before) still load."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

import modulelens


class Tower(nn.Module):  # defined in this (user) file: the capture stores this file's source
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.left = nn.Linear(dim, dim)
        self.right = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.left(x) + self.right(x)


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.a = Tower(dim)
        self.b = Tower(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def test_a_source_file_is_one_blob_shared_by_every_capture(repo: modulelens.Repo) -> None:
    model = Block(4)
    with modulelens.capture(model, targets=["a", "b"], repo=repo, name="job") as cap:
        model(torch.randn(2, 4))
    metas = [repo.read_metadata(info.name, info.version) for info in cap.saved]
    entries = [meta["sources"][__name__] for meta in metas]
    assert all("text" not in entry for entry in entries)  # no copy of the file in the metadata
    blobs = {meta["tensors"][entry["text_id"]]["payload"] for meta, entry in zip(metas, entries, strict=True)}
    assert len(blobs) == 1  # one blob for both captures
    text = Path(__file__).read_text()
    loaded = modulelens.load("job/a", repo=repo)
    assert loaded.stored_source(__name__) == text
    assert loaded.replay().passed


def test_captures_with_inline_source_text_still_load(repo: modulelens.Repo) -> None:
    model = Block(4)
    with modulelens.capture(model, targets=["a"], repo=repo, name="old") as cap:
        model(torch.randn(2, 4))
    info = cap.saved[0]
    path = repo.version_path(info.name, info.version) / "capture.json"
    meta = json.loads(path.read_text())
    entry = meta["sources"][__name__]
    entry["text"] = Path(__file__).read_text()  # the form captures had before source blobs
    del meta["tensors"][entry.pop("text_id")]
    path.write_text(json.dumps(meta))
    loaded = modulelens.load("old/a", repo=repo)
    assert loaded.stored_source(__name__) == entry["text"]
    assert loaded.replay().passed
