"""Reload the block captured by train.py in one plain process (no torch.distributed) and replay it.

    python replay.py [--repo DIR] [--mode fsdp|tp]
"""

from __future__ import annotations

import argparse

import modulelens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", default=None)
    parser.add_argument("--mode", choices=("fsdp", "tp"), default="fsdp")
    parser.add_argument("--target", default="blocks.2.ff")
    args = parser.parse_args()

    cap = modulelens.load(f"shardnet-{args.mode}/{args.target}", repo=args.repo)
    info = cap.metadata["distributed"]
    print(cap)
    print(f"recorded on rank {info['rank']} of {info['world_size']} ({info['backend']}), "
          f"wrapper {info['wrapper_class']}, meshes {info['meshes']}")
    for name, entry in info["parameters"].items():
        print(f"  {name}: {entry['placements']} local {entry['local_shape']} -> stored full {entry['shape']}")
    module = cap.module  # an ordinary single-device module with the full weights
    print(type(module).__name__, {n: tuple(p.shape) for n, p in module.named_parameters()})
    report = cap.replay()
    print(report)
    raise SystemExit(0 if report.passed else 1)


if __name__ == "__main__":
    main()
