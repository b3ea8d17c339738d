"""`modulelens run` on unmodified programs."""

from __future__ import annotations

import json
import subprocess
import textwrap
import uuid
from pathlib import Path

from child_process import PYTHON, subprocess_env
from seaweed import SeaweedServer

import modulelens
from modulelens.tracing.runner import within_depth

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
    assert ("'blocks.0.dwn' matched no module of the models the job called (Net); closest: blocks.0.down (Linear)"
            in out["error"]["message"])


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


def test_a_target_typo_is_named_when_the_job_ends_and_the_job_goes_on(tmp_path: Path) -> None:
    """Issue 34: named once the job ended without capturing it (a later model may hold it), not at
    the first model's first call."""
    result, out = _run(tmp_path, "-t", "blocks.0.dwn", "-t", "head")
    assert result.returncode == 0 and out["ok"] is True and [s["name"] for s in out["result"]["saved"]] == ["Net/head"]
    assert out["result"]["missing_targets"] == ["blocks.0.dwn"]
    assert out["result"]["suggestions"]["blocks.0.dwn"][0] == ["blocks.0.down", "torch.nn.modules.linear:Linear"]
    assert "matches no module" not in result.stderr  # nothing said during the job


def test_strict_stops_the_job_at_a_target_typo(tmp_path: Path) -> None:
    result, out = _run(tmp_path, "-t", "blocks.0.dwn", "-t", "head", "--strict")
    assert result.returncode == 2 and out["ok"] is False
    assert out["error"]["type"] == "UsageError" and out["error"]["exit_code"] == 2
    assert "closest: blocks.0.down (Linear)" in out["error"]["message"]
    assert "stopped (--strict)" in out["error"]["message"]
    assert "step 0" not in result.stderr  # stopped inside the first forward


def test_star_crosses_dots_and_depth_keeps_one_level(tmp_path: Path) -> None:
    result, out = _run(tmp_path, "-t", "blocks.*", "--name", "all")
    assert result.returncode == 0, result.stderr
    assert sorted(s["name"] for s in out["result"]["saved"]) == [
        "all/blocks.0", "all/blocks.0.down", "all/blocks.0.up", "all/blocks.1", "all/blocks.1.down", "all/blocks.1.up"]
    result, out = _run(tmp_path, "-t", "blocks.*", "--depth", "1", "--name", "one")
    assert result.returncode == 0, result.stderr
    assert sorted(s["name"] for s in out["result"]["saved"]) == ["one/blocks.0", "one/blocks.1"]
    assert out["result"]["missing_targets"] == []


def test_within_depth() -> None:
    assert within_depth("layer1.*", "layer1.0", 1) and not within_depth("layer1.*", "layer1.0.conv1", 1)
    assert within_depth("layer1.*", "layer1.0.conv1", 2) and within_depth("layer1.*", "layer1.0.conv1", None)
    assert within_depth("*", "encoder", 1) and not within_depth("*", "encoder.layers", 1)
    assert within_depth("blocks.*.attn", "blocks.3.attn", 2) and not within_depth("blocks.*.attn", "blocks.3.x.attn", 2)
    assert within_depth("LlamaMLP", "model.layers.0.mlp", 1)  # a class name is not limited


def test_exit_after_capture_into_s3_reports_the_uploaded_versions(tmp_path: Path) -> None:
    """Issue 23: `--exit-after-capture --repo s3://...` exited 6 ("no target was captured:") although
    the upload happened; against a real S3 server (SeaweedFS on loopback)."""
    server = SeaweedServer(tmp_path / "weed").start()
    try:
        url = f"s3://modulelens-test/{uuid.uuid4().hex[:12]}"
        script = tmp_path / "train.py"
        script.write_text(SCRIPT)
        env = subprocess_env(**server.env, MODULELENS_CACHE=str(tmp_path / "cache"))
        result = subprocess.run([PYTHON, "-m", "modulelens", "run", "--repo", url, "--json", "-t", "head",
                                 "--exit-after-capture", "--", PYTHON, str(script)],
                                capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
        out = json.loads(result.stdout)
        assert result.returncode == 0, result.stderr
        assert out["ok"] and [s["ref"] for s in out["result"]["saved"]] == ["Net/head:v1"]
        assert out["result"]["repo"] == url and "step 0" not in result.stderr
        listed = subprocess.run([PYTHON, "-m", "modulelens", "ls", "--repo", url, "--json"], capture_output=True,
                                text=True, env=env, timeout=120)
        assert [row["ref"] for row in json.loads(listed.stdout)["result"]] == ["Net/head:v1"]
    finally:
        server.stop()
