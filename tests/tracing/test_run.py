"""`modulelens run` on unmodified programs."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

from child_process import PYTHON, subprocess_env

import modulelens

SCRIPT = textwrap.dedent('''
    import sys
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, dim, hidden=32):
            super().__init__()
            self.up = nn.Linear(dim, hidden)
            self.down = nn.Linear(hidden, dim)
        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(Block(8), Block(8, hidden=16))
            self.head = nn.Linear(8, 1)
        def forward(self, x):
            return self.head(self.blocks(x))

    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(6):
        loss = net(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        print("step", step, flush=True)
    print("END", flush=True)
''')


def _run(tmp_path: Path, *options: str, command: list[str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    repo = tmp_path / "repo"
    cmd = [PYTHON, "-m", "modulelens", "run", "--repo", str(repo), "--json", *options, "--",
           *(command or [PYTHON, str(script)])]
    result = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=300, cwd=tmp_path)
    return result, json.loads(result.stdout)


def test_run_captures_targets_of_an_unmodified_script(tmp_path: Path) -> None:
    result, out = _run(tmp_path, "-t", "blocks.1", "-t", "head", "--warmup", "1", "--max-calls", "2", "--name", "job")
    assert result.returncode == 0, result.stderr
    assert out["ok"] and sorted(s["ref"] for s in out["result"]["saved"]) == ["job/blocks.1:v1", "job/head:v1"]
    assert "END" in result.stderr  # the job's own output went to stderr under --json, and it ran to the end
    # Block is defined in the script (__main__), so reload it in the same way the script ran:
    capture = modulelens.load("job/head", repo=tmp_path / "repo")
    assert [c.index for c in capture.calls] == [1, 2]
    assert capture.replay().passed
    meta = capture.repo.read_metadata("job/blocks.1", 1)
    construction = meta["constructions"][meta["module"]["construction"]]
    assert construction["class"] == "__main__:Block"
    assert construction["args"] == [8] and construction["kwargs"] == {"hidden": 16}


def test_exit_after_capture_ends_the_job_cleanly(tmp_path: Path) -> None:
    result, out = _run(tmp_path, "-t", "Net", "--exit-after-capture")
    assert result.returncode == 0, result.stderr
    assert out["result"]["saved"][0]["ref"] == "Net:v1"
    # the root's very first call is recorded, so the job ends inside it, before "step 0" is printed
    assert "step 0" not in result.stderr and "\nEND" not in result.stderr


def test_run_with_python_dash_m(tmp_path: Path) -> None:
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(SCRIPT)
    result, out = _run(tmp_path, "-t", "head", command=[PYTHON, "-m", "mypkg"])
    assert result.returncode == 0, result.stderr
    assert out["result"]["saved"][0]["ref"] == "Net/head:v1"
    assert modulelens.load("Net/head", repo=tmp_path / "repo").replay().passed


def test_nothing_captured_is_an_error_naming_the_closest_modules(tmp_path: Path) -> None:
    result, out = _run(tmp_path, "-t", "blocks.0.dwn")
    assert result.returncode == 6 and out["ok"] is False
    assert out["error"]["type"] == "NothingCapturedError" and out["error"]["exit_code"] == 6
    assert "'blocks.0.dwn' matched no module; closest: blocks.0.down (Linear)" in out["error"]["message"]


def test_list_modules_prints_the_tree_and_ends_the_job(tmp_path: Path) -> None:
    result, out = _run(tmp_path, "--list-modules")
    assert result.returncode == 0 and out["ok"]
    [root] = out["result"]["roots"]
    assert root["class"] == "__main__:Net"
    assert ["blocks.1.up", "torch.nn.modules.linear:Linear"] in root["modules"]
    assert ["blocks.0", "__main__:Block"] in root["modules"]
    assert "step 0" not in result.stderr  # stopped at the first forward


def test_run_options_backward_shape_only_and_tags(tmp_path: Path) -> None:
    result, out = _run(tmp_path, "-t", "head", "--backward", "--shape-only-over", "0", "--tag", "nightly")
    assert result.returncode == 0, result.stderr
    [saved] = out["result"]["saved"]
    assert saved["tags"] == ["nightly"]
    capture = modulelens.load(saved["ref"], repo=tmp_path / "repo")
    assert capture.calls[0].has_backward
    assert capture.calls[0].shape_only_in("inputs")


def test_the_jobs_own_failure_code_is_passed_through(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("import sys; sys.exit(7)")
    result, _ = _run(tmp_path, "-t", "head", command=[PYTHON, str(script)])
    assert result.returncode == 7
