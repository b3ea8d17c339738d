"""Saving a whole-model capture: metadata size and save time as the model grows.

    python benchmarks/bench_metadata.py [--rounds 9]

A capture of a whole transformers Llama (built from a config, default settings, one forward) records
every submodule's construction (``module.tree``, docs/format.md): each submodule holds the model's
config, which is encoded once per capture and referenced by every record that holds it. Rows: 2 to
16 decoder layers. ``save_ms`` is the median time of ``cap.save()`` of the in-memory capture (each
save a new version of it, in a repo of its own); the whole capture of a one-call forward, so the
constructions, tree and sources are most of the metadata. Run it with another modulelens on
``PYTHONPATH`` to compare versions (it uses the public API only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import report

import modulelens


def measure(layers: int, rounds: int) -> dict[str, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config)
    with tempfile.TemporaryDirectory() as root:
        repo = modulelens.Repo(root)
        cap = modulelens.capture(model, targets=[""], repo=repo, name="llama")
        model(input_ids=torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(0)))
        cap.stop()
        times = []
        for _ in range(rounds + 1):  # the first save (imports, first source reads) is not kept
            start = time.perf_counter()
            [info] = cap.save()
            times.append(time.perf_counter() - start)
        name, version = repo.resolve(info.ref)
        meta = json.loads((repo.version_path(name, version) / "capture.json").read_text())
    sections = {key: len(json.dumps(meta[key])) for key in ("constructions", "module")}
    return {"layers": layers, "modules": len(list(model.modules())), "metadata_kb": len(json.dumps(meta)) / 1024,
            "constructions_kb": sections["constructions"] / 1024, "tree_kb": sections["module"] / 1024,
            "save_ms": statistics.median(times[1:]) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    modulelens.track_init()
    rows = [measure(layers, args.rounds) for layers in (2, 4, 8, 16)]
    report("metadata", "saving a whole tiny-Llama capture (one forward)", rows,
           ["layers", "modules", "metadata_kb", "constructions_kb", "tree_kb", "save_ms"],
           {"rounds": args.rounds, "threads": 1, "modulelens": str(Path(modulelens.__file__).parent)})


if __name__ == "__main__":
    main()
