"""Run by the tests: saves one capture into a repo back to back until a stop file appears, so that
at any moment one save or another holds the repo's shared lock (what starved gc, issue 12)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

import modulelens
from modulelens.format.tensors import dtype_from_name, tensor_bytes


def main() -> None:
    root, name, stop = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    repo = modulelens.Repo(root)
    module = nn.Linear(1024, 1024)  # a 4 MiB weight: each save holds the lock while it writes
    with modulelens.capture(module, targets="Linear", repo=repo, name=name, strict=True) as cap:
        module(torch.randn(2, 1024))
    meta = repo.read_metadata(*repo.resolve(cap.saved[0].ref))
    reader = repo.payloads(meta)
    payloads = {tid: bytes(tensor_bytes(reader.open_tensor(e, dtype_from_name(e["dtype"]))))
                for tid, e in meta["tensors"].items() if e.get("payload")}
    meta.pop("packs", None)
    for entry in meta["tensors"].values():
        entry.pop("pack", None)
    saves = 0
    print("saving", flush=True)
    while not stop.exists():
        copy = json.loads(json.dumps(meta))
        copy["tags"] = [str(time.time_ns())]  # a distinct capture.json each time
        big = bytearray(payloads[max(payloads, key=lambda t: len(payloads[t]))])
        big[:8] = time.time_ns().to_bytes(8, "little")  # a new blob each time: real writes, no dedup
        data = {tid: memoryview(big if len(p) == len(big) else p) for tid, p in payloads.items()}
        repo.save_version(name, copy, data)
        saves += 1
    print(saves, flush=True)


if __name__ == "__main__":
    main()
