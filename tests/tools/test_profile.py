"""modulelens profile: latency, FLOPs/bytes, memory, top ops, batch sweeps, plots, stored reports."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest
import tools_models as tm
import torch
from typer.testing import CliRunner

import modulelens
from modulelens.tools.sweep import synthetic_inputs
from modulelens.tools.timing import TimingConfig

M, K, N = 64, 256, 192
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("profile-repo")
    torch.manual_seed(0)
    tm.capture(lambda: torch.nn.Linear(K, N), [(torch.randn(M, K),)], root, "lin")
    tm.capture(lambda: tm.MLP(8, 16), [(torch.randn(5, 8),), (torch.randn(5, 8),)], root, "mlp")
    tm.capture(lambda: tm.Tagger(50, 6), [(torch.randint(3, 40, (4, 7)), torch.randn(4, 6))], root, "tagger")
    return root


def test_linear_flops_latency_memory(repo: Path) -> None:
    cap = modulelens.load("lin/inner", repo=repo)
    report = modulelens.profile(cap, timing=TimingConfig(warmup=3, iters=30))
    assert report.flops["total"] == 2 * M * N * K
    assert report.flops["per_op"] == {"aten.addmm": 2 * M * N * K}
    assert report.flops["uncounted_compute_ops"] == []
    lat = report.latency
    assert 0 < lat["p10_ms"] <= lat["median_ms"] <= lat["p90_ms"]
    assert lat["iterations"] == 30 and lat["warmup"] == 3
    # bytes: at least x, W, bias read and the output written once
    assert report.bytes_moved["total"] >= 4 * (M * K + K * N + N + M * N)
    assert report.arithmetic_intensity == pytest.approx(report.flops["total"] / report.bytes_moved["total"])
    assert report.achieved_flops_per_s == pytest.approx(report.flops["total"] / (lat["median_ms"] / 1e3))
    assert report.memory["peak_bytes"] >= 4 * M * N  # the output is allocated during the call
    assert "torch.profiler" in report.memory["method"]
    assert any(op["name"] == "aten::addmm" for op in report.top_ops)
    assert report.batch_size == M and report.mode == "forward (no_grad)"
    # stable across two runs (loose: the CPU is shared)
    again = modulelens.profile(cap, timing=TimingConfig(warmup=3, iters=30))
    ratio = again.latency["median_ms"] / lat["median_ms"]
    assert 1 / 3 < ratio < 3, ratio
    stored = modulelens.Repo(repo).reports(cap.ref, "profile")
    assert len(stored) >= 2 and stored[-1]["flops"]["total"] == 2 * M * N * K
    assert report.report_path is not None and Path(report.report_path).exists()


def test_backward_counts_three_matmuls(repo: Path) -> None:
    report = modulelens.profile(modulelens.load("lin/inner", repo=repo), backward=True, timing=TimingConfig(iters=10), store=False)
    # forward x@W^T, backward grad_x = g@W and grad_W = g^T@x
    assert report.flops["total"] == 3 * 2 * M * N * K
    assert report.mode == "forward+backward"
    assert report.latency["median_ms"] > 0


def test_ops_without_flop_formula_are_listed(repo: Path) -> None:
    report = modulelens.profile(modulelens.load("mlp/inner", repo=repo), timing=TimingConfig(iters=10), store=False, call=1)
    assert report.flops["total"] == 2 * 5 * (8 * 16 + 16 * 4)
    assert "aten.relu.default" in report.flops["uncounted_compute_ops"]
    categories = {u["op"]: u["category"] for u in report.flops["uncounted_ops"]}
    assert categories["aten.relu.default"] == "pointwise"
    assert all(categories[op] == "view" for op in categories if op.startswith("aten.t."))
    assert any("lower bound" in note for note in report.notes)
    assert report.call_index == 1


def test_batch_sweep_plot_and_trace(repo: Path, tmp_path: Path) -> None:
    plot = tmp_path / "sweep.png"
    trace = tmp_path / "trace.json"
    report = modulelens.profile(modulelens.load("lin/inner", repo=repo),
        timing=TimingConfig(iters=5), batch_sizes=[1, 4, 16], plot=plot, trace=trace, store=False)
    rows = report.batch_sweep
    assert [r["batch_size"] for r in rows] == [1, 4, 16]
    assert [r["flops"] for r in rows] == [2 * b * N * K for b in (1, 4, 16)]
    assert all(r["median_ms"] > 0 and r["throughput_per_s"] > 0 for r in rows)
    assert plot.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(str(plot))
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    events = json.loads(trace.read_text())["traceEvents"]
    assert any("addmm" in str(e.get("name", "")) for e in events)


def test_synthetic_inputs_follow_recorded_shapes_and_ranges(repo: Path) -> None:
    cap = modulelens.load("tagger/inner", repo=repo)
    ids, features = cap.calls[0].args
    mask = torch.ones(3)  # not batch-carrying (dim 0 != 4): kept as recorded
    (new_ids, new_features, new_mask), _ = synthetic_inputs((ids, features, mask), {}, 32,
                                                            generator=torch.Generator().manual_seed(1))
    assert new_ids.shape == (32, 7) and new_ids.dtype == ids.dtype
    assert int(new_ids.min()) >= int(ids.min()) and int(new_ids.max()) <= int(ids.max())
    assert new_features.shape == (32, 6) and new_features.dtype == torch.float32
    assert new_mask is mask
    report = modulelens.profile(cap, timing=TimingConfig(iters=5), batch_sizes=[2, 8], store=False)
    assert all("error" not in r for r in report.batch_sweep), report.batch_sweep


# torch.compile may start multiprocessing's resource tracker (a process) in the first test that compiles
@pytest.mark.subprocess
def test_compile_path(repo: Path) -> None:
    report = modulelens.profile(modulelens.load("mlp/inner", repo=repo), compile="aot_eager", timing=TimingConfig(iters=5), store=False)
    assert report.compiled == "aot_eager" and report.compile_seconds is not None
    assert report.flops["total"] == 2 * 5 * (8 * 16 + 16 * 4)
    assert report.latency["median_ms"] > 0


def test_errors_are_one_line(repo: Path) -> None:
    cap = modulelens.load("lin/inner", repo=repo)
    with pytest.raises(modulelens.ModulelensError, match="no call 5"):
        modulelens.profile(cap, call=5)
    with pytest.raises(modulelens.ModulelensError, match="batch sizes"):
        modulelens.profile(cap, plot="x.png")


def test_cli_profile_json(repo: Path, tmp_path: Path) -> None:
    from modulelens.interfaces.cli import app

    plot = tmp_path / "cli.png"
    result = CliRunner().invoke(app, ["profile", "lin/inner", "--repo", str(repo), "--iters", "5",
                                      "--batch-sizes", "1,8", "--plot", str(plot), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout[result.stdout.index("{"):])
    assert payload["ok"] and payload["result"]["flops"]["total"] == 2 * M * N * K
    assert plot.read_bytes()[:8] == PNG_SIGNATURE
    human = CliRunner().invoke(app, ["profile", "lin/inner", "--repo", str(repo), "--iters", "5", "--no-store"])
    assert human.exit_code == 0 and "latency" in human.stdout and "aten::addmm" in human.stdout
    bad = CliRunner().invoke(app, ["profile", "lin/inner", "--repo", str(repo), "--batch-sizes", "1,x"])
    assert bad.exit_code != 0


def test_profile_names_each_step_and_keeps_the_profilers_chatter_off_stderr(repo: Path, tmp_path: Path) -> None:
    """Issue 23: `profile` printed torch's `USDT: ... profiler_start` lines; a sweep ran ~40 s silently."""
    import subprocess

    from child_process import PYTHON, subprocess_env

    steps: list[str] = []
    modulelens.profile(modulelens.load("mlp/inner", repo=repo), timing=TimingConfig(iters=3), batch_sizes=[1, 4],
                       store=False, progress=steps.append)
    assert steps[0].startswith("timing call 0") and "counting FLOPs and bytes moved" in steps
    assert steps[-2:] == ["batch sweep: batch size 1 (1 of 2)", "batch sweep: batch size 4 (2 of 2)"]
    done = subprocess.run([PYTHON, "-m", "modulelens", "profile", "mlp/inner", "--repo", str(repo), "--iters", "3",
                           "--batch-sizes", "1,4", "--no-store"], capture_output=True, text=True, env=subprocess_env(),
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "USDT:" not in done.stderr + done.stdout and "STAGE:" not in done.stderr
    assert done.stderr == ""  # not a terminal: no status line either
