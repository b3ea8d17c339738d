"""One rank of a distributed job for tests/tracing/test_distributed.py, started by torchrun (gloo, CPU):

    python -m torch.distributed.run --nproc-per-node 2 ... tests/support/dist_worker.py <scenario> <repo> <out dir>

Each rank writes ``<out dir>/rank<k>.json``: what it saved, the warnings modulelens gave, and
scenario facts the test checks. Reference tensors go to ``<out dir>/reference.npz`` (no pickle).
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from shardnet import ShardNet
from torch import nn

import modulelens
from modulelens.repo import Repo


def _batch(step: int, rank: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The same batch on every rank (rank=None), or one per rank."""
    gen = torch.Generator().manual_seed(1000 + step * 10 + (rank or 0) * (rank is not None))
    return torch.randn(6, 8, generator=gen), torch.randint(0, 4, (6,), generator=gen)


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def _net() -> ShardNet:
    """The example's model (examples/distributed/shardnet.py) at test size."""
    return ShardNet(features=8, dim=16, hidden=32, depth=2, classes=4)


def _refs(infos: list[Any]) -> list[str]:
    return [info.ref for info in infos]


def scenario_ddp(rank: int, repo: str, out: str) -> dict[str, Any]:
    modulelens.track_init()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(_net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    result: dict[str, Any] = {}
    # Rank 0 records (the default): blocks.1 at the second step, after one optimizer step.
    with modulelens.capture(model, ["blocks.1"], name="ddp", repo=repo, record=modulelens.Recording(warmup=1)) as cap:
        for step in range(3):
            _train_step(model, opt, *_batch(step, rank))
    result["default"] = _refs(cap.saved)
    # Every rank records the head; both save at the same moment into the same repo.
    cap = modulelens.capture(model, ["head"], name="ddpall", repo=repo, record=modulelens.Recording(ranks="all"))
    _train_step(model, opt, *_batch(5, rank))
    cap.stop()
    dist.barrier()
    result["all"] = _refs(cap.save())
    # Raw concurrent writes of one name: a shared payload and one per rank, five versions each.
    shared = torch.arange(4096, dtype=torch.float32)
    mine = torch.full((1024,), float(rank))
    from modulelens.tracing.encode import TensorTable

    table = TensorTable()
    table.add(shared, "shared")
    table.add(mine, "mine")
    dist.barrier()
    versions = []
    for _ in range(5):
        meta = {"format": "modulelens.capture", "format_version": 1, "name": None, "version": None, "created": "",
                "tags": [], "metadata": {"rank": rank},
                "module": {"class": "x:y", "qualified_name": "", "construction": None},
                "constructions": {}, "states": [], "calls": [], "capture": {}, "environment": {},
                "tensors": {tid: dict(entry) for tid, entry in table.entries.items()}}
        versions.append(Repo(repo).save_version("race/same", meta, dict(table.payloads)).version)
    result["race_versions"] = versions
    return result


def _tp_and_fsdp_models(mesh: Any) -> tuple[nn.Module, nn.Module, nn.Module]:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    tp = _net()
    tp_twin = _net()
    tp_twin.load_state_dict(tp.state_dict())
    parallelize_module(tp.blocks[0].ff, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    torch.manual_seed(1)
    fsdp = _net()
    for block in fsdp.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(fsdp, mesh=mesh)
    return tp, tp_twin, fsdp


def scenario_sharded(rank: int, repo: str, out: str) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    modulelens.track_init()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    tp, tp_twin, fsdp = _tp_and_fsdp_models(mesh)
    result: dict[str, Any] = {"tp_class": type(tp.blocks[0].ff).__name__, "fsdp_class": type(fsdp.blocks[1]).__name__}
    reference: dict[str, np.ndarray] = {}

    # Tensor parallel: every rank sees the same batch; blocks.0.ff recorded at step 1.
    opt = torch.optim.SGD(tp.parameters(), lr=0.1)
    twin_opt = torch.optim.SGD(tp_twin.parameters(), lr=0.1)
    with modulelens.capture(tp, ["blocks.0.ff", "blocks.0.ff.down"], name="tp", repo=repo, record=modulelens.Recording(warmup=1)) as cap:
        for step in range(3):
            if step == 1:  # the weights the capture will see, gathered by the test itself
                for n, p in tp.blocks[0].ff.named_parameters():
                    full = p.full_tensor()
                    reference[f"tp_full.{n}"] = full.detach().numpy().copy()
                for n, p in tp_twin.blocks[0].ff.named_parameters():
                    reference[f"tp_twin.{n}"] = p.detach().numpy().copy()
            x, y = _batch(step)
            _train_step(tp, opt, x, y)
            _train_step(tp_twin, twin_opt, x, y)
    result["tp"] = _refs(cap.saved)

    # FSDP2: each rank its own batch; the whole ShardNet (children sharded while it is entered) and an
    # FSDP-wrapped block, both recorded at step 1.
    opt = torch.optim.SGD(fsdp.parameters(), lr=0.1)
    with modulelens.capture(fsdp, ["ShardNet", "blocks.1"], name="fsdp", repo=repo, record=modulelens.Recording(warmup=1)) as cap:
        for step in range(3):
            if step == 1:
                for n, p in fsdp.named_parameters():
                    reference[f"fsdp_full.{n}"] = p.full_tensor().detach().numpy().copy()
            _train_step(fsdp, opt, *_batch(step, rank))
    result["fsdp"] = _refs(cap.saved)

    # Capture attached before parallelize_module: tensor parallel's input hook lands after ours, so
    # the tracer moves its hooks back into place and records from the next call on.
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    early = _net()
    with modulelens.capture(early, ["blocks.0.ff.down"], name="tpearly", repo=repo) as cap:
        parallelize_module(early.blocks[0].ff, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        for step in range(2):
            early(_batch(step)[0])
    result["tpearly"] = _refs(cap.saved)
    if rank == 0:
        np.savez(os.path.join(out, "reference.npz"), **reference)
    return result


def _sharded_linear(mesh: Any) -> nn.Module:
    """A Linear whose weight and bias are sharded on dim 0: its forward needs no communication,
    but gathering its parameters or output does."""
    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor

    def partition(_name: str, module: nn.Module, device_mesh: Any) -> None:
        for pname, param in list(module.named_parameters(recurse=False)):
            module.register_parameter(pname, nn.Parameter(distribute_tensor(param.detach(), device_mesh, [Shard(0)])))

    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(4, 4))
    distribute_module(model[0], mesh, partition)
    return model


def scenario_nohang(rank: int, repo: str, out: str) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate

    modulelens.track_init()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    result: dict[str, Any] = {}

    def inputs() -> Any:
        return DTensor.from_local(torch.ones(2, 4), mesh, [Replicate()])

    # 1. A sharded target called on rank 1 only, rank 0 records: rank 1 must not wait forever.
    model = _sharded_linear(mesh)
    start = time.monotonic()
    with modulelens.capture(model, ["0"], name="only1", repo=repo, record=modulelens.Recording(sync_timeout=2.0)) as cap:
        if rank == 1:
            model(inputs())
    result["only1"] = {"saved": _refs(cap.saved), "seconds": time.monotonic() - start}
    dist.barrier()

    # 2. Rank 1 fails inside capture at the second call while every rank records two calls.
    model = _sharded_linear(mesh)
    start = time.monotonic()
    cap = modulelens.capture(model, ["0"], name="fail1", repo=repo,
                             record=modulelens.Recording(ranks="all", max_calls=2, sync_timeout=30.0))
    if rank == 1:
        gather = cap.tracer._gather

        def failing(name: str, index: int, phase: str, *args: Any, **kwargs: Any) -> Any:
            if index == 1 and phase == "inputs":
                raise RuntimeError("injected failure on rank 1")
            return gather(name, index, phase, *args, **kwargs)

        cap.tracer._gather = failing  # type: ignore[method-assign]
    with cap:
        for _ in range(2):
            model(inputs())
    result["fail1"] = {"saved": _refs(cap.saved), "seconds": time.monotonic() - start}
    dist.barrier()

    # 3. Rank 1 calls the target twice, rank 0 once: the second call cannot be gathered.
    model = _sharded_linear(mesh)
    with modulelens.capture(model, ["0"], name="uneven", repo=repo,
                            record=modulelens.Recording(ranks="all", max_calls=2, sync_timeout=2.0)) as cap:
        for _ in range(1 + rank):
            model(inputs())
    result["uneven"] = {"saved": _refs(cap.saved)}
    return result


SCENARIOS: dict[str, Callable[[int, str, str], dict[str, Any]]] = {
    "ddp": scenario_ddp,
    "sharded": scenario_sharded,
    "nohang": scenario_nohang,
}


def main() -> None:
    scenario, repo, out = sys.argv[1:4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = SCENARIOS[scenario](rank, repo, out)
    result["rank"] = rank
    result["warnings"] = [str(w.message) for w in caught if issubclass(w.category, modulelens.CaptureWarning)]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump(result, handle)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
