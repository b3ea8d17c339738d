"""Train ShardNet under torchrun on CPU processes (gloo) and capture one block's feed-forward.

    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc-per-node 2 train.py [--repo DIR]

``--mode fsdp`` (default): every block and the root are sharded with FSDP2 ``fully_shard``;
``--mode tp``: each block's feed-forward is tensor parallel (``up`` column-wise, ``down``
row-wise) and every rank sees the same batches. Rank 0 records ``blocks.2.ff`` after a few steps;
the other ranks only take part in gathering its sharded tensors. Then run ``replay.py``.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from shardnet import ShardNet
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

import modulelens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", default=None, help="capture repo (default: $MODULELENS_REPO or ~/.cache/...)")
    parser.add_argument("--mode", choices=("fsdp", "tp"), default="fsdp")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--target", default="blocks.2.ff")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    modulelens.track_init()  # before the model is built: constructor arguments get recorded
    torch.manual_seed(0)
    model = ShardNet()
    if args.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        for block in model.blocks:
            parallelize_module(block.ff, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    # Same call on every rank; rank 0 (ranks=[0], the default) records and saves.
    with modulelens.capture(model, [args.target], name=f"shardnet-{args.mode}", repo=args.repo,
                            record=modulelens.Recording(warmup=3)) as cap:
        for step in range(args.steps):
            gen = torch.Generator().manual_seed(step if args.mode == "tp" else step * world + rank)
            x = torch.randn(32, 16, generator=gen)
            y = torch.randint(0, 10, (32,), generator=gen)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            if rank == 0:
                print(f"step {step}: loss {loss.item():.4f}", flush=True)
    for info in cap.saved:
        print(f"rank {rank}: saved {info.ref}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
