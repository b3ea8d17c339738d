"""What reading a recorded call's inputs costs: ``call.args`` (a new copy on every access, so a call
that changes its inputs in place cannot change the recording) against the alternatives, by tensor size.

    python benchmarks/bench_call_inputs.py [--rounds 15]

One capture per row (a module taking ``count`` float32 tensors of ``size`` bytes), loaded once; each
access is timed alone and with every tensor read once after it (``+ read``: a mapping reads pages
when used). Contenders, interleaved per round:
  * call.args:   what the README's direct call uses (decoded structure memoised; each payload opened
                 once, then copied (pack members) or mapped anew copy-on-write (loose blobs))
  * reopen:      every payload opened through the repo on every access (the blob check and mapping
                 that call.args did each time before)
  * clone:       a copy of tensors decoded once (``torch.clone`` of each)
  * shared:      the tensors decoded once, no copy (the floor; what a call could corrupt)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _common import interleaved, median, report

import modulelens


class Takes(nn.Module):
    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return torch.stack([t.sum() for t in tensors]).sum()


def _tensor_ids(data: Any) -> list[str]:
    if isinstance(data, dict):
        return [data["id"]] if data.get("$type") == "tensor" else [i for v in data.values() for i in _tensor_ids(v)]
    return [i for v in data for i in _tensor_ids(v)] if isinstance(data, list) else []


def measure(repo: modulelens.Repo, count: int, size: int, rounds: int) -> dict[str, Any]:
    model = nn.Sequential(Takes())
    name = f"inputs{count}x{size}"
    with modulelens.capture(model, targets=["0"], repo=repo, name=name):
        model[0](*[torch.randn(size // 4) for _ in range(count)])
    cap = modulelens.load(f"{name}/0", repo=repo)
    call = cap.calls[0]
    ids = _tensor_ids(call.input_tree["leaves"])
    shared = call._stored_inputs[0]

    def read(tensors: Any) -> None:
        for t in tensors:
            t.sum()

    contenders = {
        "call.args": lambda: call.args,
        "call.args + read": lambda: read(call.args),
        "reopen": lambda: [cap.fresh_tensor(tid) for tid in ids],
        "reopen + read": lambda: read([cap.fresh_tensor(tid) for tid in ids]),
        "clone": lambda: [t.clone() for t in shared],
        "shared": lambda: call._stored_inputs,
    }
    for contender in contenders.values():
        contender()  # first opens, imports
    times = interleaved(contenders, rounds)
    ms = {key: median(values) * 1e3 for key, values in times.items()}
    return {"tensors": f"{count} x {size >> 10} KiB", "args_ms": ms["call.args"], "args_read_ms": ms["call.args + read"],
            "reopen_ms": ms["reopen"], "reopen_read_ms": ms["reopen + read"], "clone_ms": ms["clone"],
            "shared_ms": ms["shared"], "args_vs_reopen": ms["call.args + read"] / ms["reopen + read"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    modulelens.track_init()
    rows = []
    with tempfile.TemporaryDirectory() as root:
        repo = modulelens.Repo(root)
        for count, size in ((64, 4 << 10), (8, 256 << 10), (4, 4 << 20), (2, 16 << 20), (1, 64 << 20)):
            rows.append(measure(repo, count, size, args.rounds))
    report("call_inputs", "reading a recorded call's inputs: ms per access", rows,
           ["tensors", "args_ms", "args_read_ms", "reopen_ms", "reopen_read_ms", "clone_ms", "shared_ms",
            "args_vs_reopen"], {"rounds": args.rounds, "threads": 1})


if __name__ == "__main__":
    main()
