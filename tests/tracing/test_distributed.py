"""Capture inside distributed jobs (docs/distributed.md): real torchrun, gloo on CPU, loopback only.

Three jobs of two ranks run once per module (tests/support/dist_worker.py): DDP, sharded (tensor parallel
and FSDP2) and "no hang" (targets reached by some ranks only, a rank failing inside capture).
Their captures are then restored and replayed in fresh single processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from ports import free_port

from modulelens.errors import ModulelensError
from modulelens.tracing.distributed import normalise_ranks, original_class, recording_ranks, several_recorders

TESTS = Path(__file__).resolve().parent.parent / "support"
ROOT = TESTS.parent.parent
JOB_TIMEOUT_S = 150
LOAD_TIMEOUT_S = 90

pytestmark = pytest.mark.timeout(400)

needs_gloo = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="torch.distributed with gloo is not available",
)


# ----------------------------------------------------------------------------------------- helpers


def _env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT), str(TESTS), str(ROOT / "examples" / "distributed"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(paths).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    env.pop("MODULELENS_REPO", None)
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"  # keep gloo on the loopback interface
    return env


def _run(command: list[str], timeout: float) -> tuple[int, str, float]:
    """Run a command in its own process group; on timeout kill that group and fail the test."""
    start = time.monotonic()
    proc = subprocess.Popen(command, env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{' '.join(command[:6])}... did not finish within {timeout}s (hang?)\n{output[-4000:]}")
    return proc.returncode, output, time.monotonic() - start


def _torchrun(scenario: str, base: Path, nproc: int = 2) -> dict[str, Any]:
    repo, out = base / "repo", base / "out"
    out.mkdir(parents=True)
    for _attempt in range(3):
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                   "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                   str(TESTS / "dist_worker.py"), scenario, str(repo), str(out)]
        code, output, seconds = _run(command, JOB_TIMEOUT_S)
        if code == 0 or "address already in use" not in output.lower():
            break
    assert code == 0, f"torchrun {scenario} failed ({code}):\n{output[-6000:]}"
    ranks = {int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    assert sorted(ranks) == list(range(nproc)), output[-4000:]
    return {"repo": repo, "out": out, "ranks": ranks, "seconds": seconds, "output": output}


def _fresh(code: str, *args: str) -> Any:
    """Run ``code`` in a new single, non-distributed process; it prints one JSON line last."""
    env_free = ["env", "-u", "RANK", "-u", "WORLD_SIZE", "-u", "LOCAL_RANK", "-u", "MASTER_ADDR", "-u", "MASTER_PORT"]
    command = [*env_free, sys.executable, "-c", textwrap.dedent(code), *args]
    rc, output, _ = _run(command, LOAD_TIMEOUT_S)
    assert rc == 0, output[-6000:]
    return json.loads(output.strip().splitlines()[-1])


_REPLAY = """
    import json, sys
    import modulelens
    repo = sys.argv[1]
    result = {}
    for ref in sys.argv[2:]:
        cap = modulelens.load(ref, repo=repo)
        report = cap.replay()
        result[ref] = {"passed": report.passed, "mode": report.mode, "class": cap.module_class,
                       "calls": len(cap.calls), "meta": cap.metadata.get("distributed"),
                       "complete": cap.metadata["capture"]["complete"], "report": str(report)}
    print(json.dumps(result))
"""


# ------------------------------------------------------------------------------------------ jobs


@pytest.fixture(scope="module")
def ddp_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _torchrun("ddp", tmp_path_factory.mktemp("ddp"))


@pytest.fixture(scope="module")
def sharded_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _torchrun("sharded", tmp_path_factory.mktemp("sharded"))


@pytest.fixture(scope="module")
def nohang_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _torchrun("nohang", tmp_path_factory.mktemp("nohang"))


# ------------------------------------------------------------------------------------------- DDP


@needs_gloo
def test_ddp_submodule_replays_bit_exact_in_fresh_process(ddp_job: dict[str, Any]) -> None:
    ranks = ddp_job["ranks"]
    assert ranks[0]["default"] == ["ddp/blocks.1:v1"]  # DDP's "module." prefix is not in the name
    assert ranks[1]["default"] == []  # only rank 0 records by default
    result = _fresh(_REPLAY, str(ddp_job["repo"]), "ddp/blocks.1")["ddp/blocks.1"]
    assert result["passed"] and result["mode"] == "bit-exact", result["report"]
    assert result["class"] == "shardnet:Block"
    meta = result["meta"]
    assert (meta["rank"], meta["world_size"], meta["backend"], meta["recording_ranks"]) == (0, 2, "gloo", [0])
    assert meta["sharded"] is False and meta["incomplete"] == []


@needs_gloo
def test_all_ranks_record_one_capture_each(ddp_job: dict[str, Any]) -> None:
    ranks = ddp_job["ranks"]
    assert ranks[0]["all"] == ["ddpall/rank0/head:v1"]
    assert ranks[1]["all"] == ["ddpall/rank1/head:v1"]
    result = _fresh(_REPLAY, str(ddp_job["repo"]), "ddpall/rank0/head", "ddpall/rank1/head")
    for rank in (0, 1):
        entry = result[f"ddpall/rank{rank}/head"]
        assert entry["passed"] and entry["mode"] == "bit-exact", entry["report"]
        assert entry["meta"]["rank"] == rank and entry["meta"]["world_size"] == 2
        assert entry["meta"]["recording_ranks"] == [0, 1] and entry["meta"]["ranks"] == "all"


@needs_gloo
def test_two_ranks_saving_into_one_repo_at_once_both_land(ddp_job: dict[str, Any]) -> None:
    from modulelens.repo import Repo

    ranks = ddp_job["ranks"]
    versions = ranks[0]["race_versions"] + ranks[1]["race_versions"]
    assert sorted(versions) == list(range(1, 11))  # ten saves of one name, none lost or doubled
    repo = Repo(ddp_job["repo"], create=False)
    writers = sorted(repo.read_metadata("race/same", v)["metadata"]["rank"] for v in range(1, 11))
    assert writers == [0] * 5 + [1] * 5
    for version in range(1, 11):
        meta = repo.read_metadata("race/same", version)
        for entry in meta["tensors"].values():
            repo.payloads(meta).check(entry, full=True)
    assert not list((repo.root / "tmp").iterdir())  # no staging leftovers


# --------------------------------------------------------------------------------------- sharded


@needs_gloo
def test_tensor_parallel_module_restores_full_and_replays(sharded_job: dict[str, Any]) -> None:
    ranks = sharded_job["ranks"]
    assert ranks[0]["tp"] == ["tp/blocks.0.ff:v1", "tp/blocks.0.ff.down:v1"] and ranks[1]["tp"] == []
    check = """
    import json, sys
    import numpy as np, torch
    import modulelens
    repo, reference = sys.argv[1], sys.argv[2]
    ref = np.load(reference, allow_pickle=False)
    result = {}
    for name in ("tp/blocks.0.ff", "tp/blocks.0.ff.down"):
        cap = modulelens.load(name, repo=repo)
        module = cap.module
        report = cap.replay()
        prefix = "" if name.endswith("ff") else "down."
        result[name] = {
            "passed": report.passed, "mode": report.mode, "report": str(report), "class": cap.module_class,
            "plain": all(type(p) is torch.nn.Parameter for p in module.parameters()),
            "equal_gathered": all(torch.equal(p, torch.from_numpy(ref["tp_full." + prefix + n]))
                                  for n, p in module.named_parameters()),
            "max_diff_unsharded": max((p - torch.from_numpy(ref["tp_twin." + prefix + n])).abs().max().item()
                                      for n, p in module.named_parameters()),
            "shapes": {n: list(p.shape) for n, p in module.named_parameters()},
            "meta": cap.metadata["distributed"],
        }
    print(json.dumps(result))
    """
    result = _fresh(check, str(sharded_job["repo"]), str(sharded_job["out"] / "reference.npz"))
    mlp, down = result["tp/blocks.0.ff"], result["tp/blocks.0.ff.down"]
    assert mlp["class"] == "shardnet:FeedForward"
    assert mlp["shapes"]["up.weight"] == [32, 16] and mlp["shapes"]["down.weight"] == [16, 32]  # full, not shards
    for entry in (mlp, down):
        assert entry["plain"] and entry["equal_gathered"], entry
        assert entry["max_diff_unsharded"] < 1e-5, entry  # same as the never-sharded twin model
        assert entry["passed"] and entry["mode"] == "tolerance", entry["report"]
    meta = mlp["meta"]
    assert meta["sharded"] and meta["meshes"] == [{"device_type": "cpu", "shape": [2], "dim_names": [],
                                                   "ranks": [0, 1]}]
    assert meta["parameters"]["up.weight"]["placements"] == ["Shard(dim=0)"]
    assert meta["parameters"]["up.weight"]["local_shape"] == [16, 16]
    assert meta["parameters"]["down.weight"]["placements"] == ["Shard(dim=1)"]
    # The rowwise layer got a sharded DTensor input and returned a pending-sum (Partial) output,
    # both stored gathered.
    down_meta = down["meta"]
    assert [e["placements"] for e in down_meta["inputs"].values()] == [["Shard(dim=1)"]]
    assert [e["placements"] for e in down_meta["outputs"].values()] == [["Partial(sum)"]]


@needs_gloo
def test_fsdp2_module_restores_as_its_own_class(sharded_job: dict[str, Any]) -> None:
    ranks = sharded_job["ranks"]
    assert ranks[0]["fsdp_class"] == "FSDPBlock"
    assert ranks[0]["fsdp"] == ["fsdp:v1", "fsdp/blocks.1:v1"] and ranks[1]["fsdp"] == []
    check = """
    import json, sys
    import numpy as np, torch
    import modulelens
    repo, reference = sys.argv[1], sys.argv[2]
    ref = np.load(reference, allow_pickle=False)
    result = {}
    for name, prefix in (("fsdp", ""), ("fsdp/blocks.1", "blocks.1.")):
        cap = modulelens.load(name, repo=repo)
        report = cap.replay()
        result[name] = {
            "passed": report.passed, "report": str(report), "class": cap.module_class,
            "type": type(cap.module).__name__,
            "equal": all(torch.equal(p, torch.from_numpy(ref["fsdp_full." + prefix + n]))
                         for n, p in cap.module.named_parameters()),
            "meta": cap.metadata["distributed"],
        }
    print(json.dumps(result))
    """
    result = _fresh(check, str(sharded_job["repo"]), str(sharded_job["out"] / "reference.npz"))
    net, block = result["fsdp"], result["fsdp/blocks.1"]
    assert (net["class"], net["type"]) == ("shardnet:ShardNet", "ShardNet")
    assert (block["class"], block["type"]) == ("shardnet:Block", "Block")
    for entry in (net, block):
        assert entry["equal"] and entry["passed"], entry["report"]
    assert net["meta"]["wrapper_class"] == "FSDPShardNet" and block["meta"]["wrapper_class"] == "FSDPBlock"
    # The root was entered with its children's parameters still sharded: gathered for the capture.
    assert net["meta"]["parameters"]["blocks.0.ff.up.weight"]["placements"] == ["Shard(dim=0)"]


@needs_gloo
def test_capture_attached_before_tensor_parallel_still_records_full_tensors(sharded_job: dict[str, Any]) -> None:
    assert sharded_job["ranks"][0]["tpearly"] == ["tpearly/blocks.0.ff.down:v1"]
    check = """
    import json, sys
    import modulelens
    cap = modulelens.load("tpearly/blocks.0.ff.down", repo=sys.argv[1])
    report = cap.replay()
    print(json.dumps({"passed": report.passed, "report": str(report), "index": cap.calls[0].index,
                      "input": list(cap.calls[0].args[0].shape), "output": list(cap.calls[0].output.shape)}))
    """
    result = _fresh(check, str(sharded_job["repo"]))
    assert result["index"] == 1  # call 0 met tensor parallel's hook out of order and was skipped
    assert (result["input"], result["output"]) == ([6, 32], [6, 16])  # full, not the local shard
    assert result["passed"], result["report"]


# --------------------------------------------------------------------------------------- no hang


@needs_gloo
def test_target_called_on_one_rank_only_does_not_hang(nohang_job: dict[str, Any]) -> None:
    ranks = nohang_job["ranks"]
    assert nohang_job["seconds"] < JOB_TIMEOUT_S  # the job finished (rc 0 checked by the fixture)
    assert ranks[0]["only1"]["saved"] == [] and ranks[1]["only1"]["saved"] == []
    assert ranks[1]["only1"]["seconds"] < 20  # waited sync_timeout=2s, not forever
    assert any("did not reach this call within 2s" in w for w in ranks[1]["warnings"]), ranks[1]["warnings"]
    assert any("never called" in w for w in ranks[0]["warnings"])


@needs_gloo
def test_rank_failing_inside_capture_leaves_job_running_and_capture_incomplete(nohang_job: dict[str, Any]) -> None:
    ranks = nohang_job["ranks"]
    assert ranks[0]["fail1"]["saved"] == ["fail1/rank0/0:v1"]
    assert ranks[0]["fail1"]["seconds"] < 20  # told by rank 1, not waiting out the 30 s timeout
    result = _fresh(_REPLAY, str(nohang_job["repo"]), "fail1/rank0/0", "fail1/rank1/0", "uneven/rank1/0")
    rank0 = result["fail1/rank0/0"]
    assert rank0["calls"] == 1 and rank0["complete"] is False
    assert any("injected failure on rank 1" in why for why in rank0["meta"]["incomplete"]), rank0["meta"]
    assert rank0["passed"], rank0["report"]  # the call that was gathered is whole
    assert result["fail1/rank1/0"]["complete"] is False and result["fail1/rank1/0"]["meta"]["incomplete"]
    uneven = result["uneven/rank1/0"]
    assert uneven["calls"] == 1 and uneven["complete"] is False and uneven["passed"], uneven["report"]
    assert any("did not reach" in why for why in uneven["meta"]["incomplete"])


# ---------------------------------------------------------------------------------------- example


@needs_gloo
def test_example_trains_under_torchrun_and_replays_in_one_process(tmp_path: Path) -> None:
    example = ROOT / "examples" / "distributed"
    repo = tmp_path / "repo"
    for _attempt in range(3):
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                   "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                   str(example / "train.py"), "--repo", str(repo), "--steps", "5"]
        code, output, _ = _run(command, JOB_TIMEOUT_S)
        if code == 0 or "address already in use" not in output.lower():
            break
    assert code == 0 and "rank 0: saved shardnet-fsdp/blocks.2.ff:v1" in output, output[-4000:]
    code, output, _ = _run(["env", "-u", "RANK", "-u", "WORLD_SIZE", sys.executable, str(example / "replay.py"),
                            "--repo", str(repo)], LOAD_TIMEOUT_S)
    assert code == 0 and "PASS" in output and "stored full [256, 64]" in output, output


# ---------------------------------------------------------------------------- single-process units


def test_ranks_setting_is_validated() -> None:
    assert normalise_ranks((0,)) == [0]
    assert normalise_ranks(3) == [3]
    assert normalise_ranks([2, 0]) == [0, 2]
    assert normalise_ranks("all") == "all"
    assert normalise_ranks("0, 3") == [0, 3]  # as `modulelens run --ranks` passes it
    for bad in ("some", "", "1,,2", [], [-1], [1, 1], ["x"], "1,1"):
        with pytest.raises(ModulelensError):
            normalise_ranks(bad)  # type: ignore[arg-type]
    assert recording_ranks("all", 4) == frozenset(range(4))
    assert recording_ranks([0, 5], 4) == frozenset({0})
    assert several_recorders("all", 2) and not several_recorders([1], 4) and not several_recorders("all", 1)


def test_original_class_sees_through_composable_wrappers() -> None:
    from shardnet import Block

    if torch.distributed.is_available():
        from torch.distributed.fsdp import FSDPModule

        wrapped = type("FSDPBlock", (FSDPModule, Block), {})
        assert original_class(wrapped) is Block
    assert original_class(Block) is Block
    assert original_class(torch.nn.Linear) is torch.nn.Linear


def test_single_process_capture_has_no_distributed_block(tmp_path: Path) -> None:
    import modulelens

    modulelens.track_init()
    model = torch.nn.Sequential(torch.nn.Linear(3, 3))
    with modulelens.capture(model, ["0"], name="single", repo=tmp_path, record=modulelens.Recording(ranks=[1])) as cap:
        model(torch.randn(2, 3))  # one process: it records whatever ranks says
    assert [v.ref for v in cap.saved] == ["single/0:v1"]
    assert "distributed" not in modulelens.load("single/0", repo=tmp_path).metadata
