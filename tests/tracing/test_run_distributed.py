"""`modulelens run -- torchrun ...` on unmodified distributed scripts (gloo, 2 CPU ranks)."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from child_process import PYTHON, subprocess_env
from ports import free_port

import modulelens

SCRIPT = textwrap.dedent('''
    import sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from shardnet import ShardNet

    mode = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = ShardNet(features=8, dim=16, hidden=32, depth=2, classes=4)  # examples/distributed, test size
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.blocks:
            parallelize_module(block.ff, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        g = torch.Generator().manual_seed(step * 10 + (rank if mode == "ddp" else 0))
        x, y = torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    dist.barrier()
    print(f"rank {rank} END", flush=True)
    dist.destroy_process_group()
''')


def _run(tmp_path: Path, mode: str, *options: str) -> tuple[subprocess.CompletedProcess, dict]:
    script = tmp_path / "train_dist.py"
    script.write_text(SCRIPT)
    cmd = [PYTHON, "-m", "modulelens", "run", "--repo", str(tmp_path / "repo"), "--json", *options, "--",
           PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(script), mode]
    result = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=240, cwd=tmp_path)
    return result, json.loads(result.stdout)


def test_run_ddp_all_ranks(tmp_path: Path) -> None:
    result, out = _run(tmp_path, "ddp", "-t", "blocks.1", "--warmup", "1", "--ranks", "all", "--name", "job")
    assert result.returncode == 0, result.stderr
    assert "rank 0 END" in result.stderr and "rank 1 END" in result.stderr
    refs = sorted(s["ref"] for s in out["result"]["saved"])
    assert refs == ["job/rank0/blocks.1:v1", "job/rank1/blocks.1:v1"]
    for ref in refs:
        capture = modulelens.load(ref, repo=tmp_path / "repo")
        assert capture.environment["rank"] == int(ref.split("/")[1][4:])
        assert capture.environment["world_size"] == 2
        report = capture.replay()
        assert report.passed and report.mode == "bit-exact", report


@pytest.mark.parametrize("ranks", ["0", "all"])
def test_run_tensor_parallel_restores_a_full_module(tmp_path: Path, ranks: str) -> None:
    result, out = _run(tmp_path, "tp", "-t", "blocks.0.ff", "--ranks", ranks, "--name", "tp")
    assert result.returncode == 0, result.stderr
    assert "rank 0 END" in result.stderr and "rank 1 END" in result.stderr
    saved = [s["ref"] for s in out["result"]["saved"]]
    expected = ["tp/blocks.0.ff:v1"] if ranks == "0" else ["tp/rank0/blocks.0.ff:v1", "tp/rank1/blocks.0.ff:v1"]
    assert sorted(saved) == expected
    for ref in saved:
        module = modulelens.load(ref, repo=tmp_path / "repo").module
        # a plain full module: the column/row shards were gathered, nothing is a DTensor any more
        assert module.up.weight.shape == (32, 16) and module.down.weight.shape == (16, 32)
        assert not hasattr(module.up.weight, "placements")
        assert modulelens.load(ref, repo=tmp_path / "repo").replay().passed
