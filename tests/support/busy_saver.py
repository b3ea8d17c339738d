"""Saves copies of a capture (a new 4 MiB weight each time) into a repo back to back until a stop
file appears, so that at any moment one save or another holds the repo's shared lock (what starved
gc, issue 12). Run in processes forked by the tests."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import modulelens


def save_until(root: str, name: str, stop: str, template: str, ready: str) -> None:
    """Save ``template`` (a ref in ``root``) as ``name`` until ``stop`` exists; then write the
    number of saves to ``ready`` + ``.count`` (``ready`` is created once saving starts)."""
    repo = modulelens.Repo(root)
    meta = repo.read_metadata(*repo.resolve(template))
    reader = repo.payloads(meta)
    payloads = {tid: reader.read_bytes(e) for tid, e in meta["tensors"].items() if e.get("payload")}
    meta.pop("packs", None)  # filled in again by each save
    for entry in meta["tensors"].values():
        entry.pop("pack", None)
    largest = max(payloads, key=lambda t: len(payloads[t]))
    saves = 0
    Path(ready).touch()
    while not os.path.exists(stop):
        copy = json.loads(json.dumps(meta))
        big = bytearray(payloads[largest])
        big[:8] = time.time_ns().to_bytes(8, "little")  # a new blob each time: real writes, no dedup
        repo.save_version(name, copy, {**{t: memoryview(p) for t, p in payloads.items()}, largest: memoryview(big)})
        saves += 1
    Path(ready + ".count").write_text(str(saves))
    os._exit(0)
