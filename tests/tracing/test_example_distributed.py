"""The README's distributed example, run as written from the folder it names (issue 21, 8).

``cd examples/distributed``, ``train.py`` under torchrun, then ``python replay.py``: the capture
names ``shardnet:Block``'s feed-forward, whose module is in the current folder and on no
``PYTHONPATH``. It reloads because it is the user's own capture, signed at save
(docs/security.md, "Your own captures"). The commands run exactly as the README has them: torchrun's
``--standalone`` picks a free port, and the capture goes to the default repo, here a temporary
folder through ``MODULELENS_REPO``. ``PYTHONFAULTHANDLER``: should a rank die of a signal, its
Python stacks are in the output.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from child_process import REPO_ROOT


def readme_commands() -> list[str]:
    """The shell commands of the README's block that starts with ``cd examples/distributed``."""
    text = (REPO_ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "cd examples/distributed" in b)
    lines = (line.partition("   #")[0].strip() for line in block.replace("\\\n", " ").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_readme_distributed_example_runs_as_written(tmp_path: Path) -> None:
    commands = readme_commands()
    assert commands[0] == "cd examples/distributed" and commands[-1].startswith("python replay.py")
    assert all("--standalone" in line for line in commands if "torch.distributed.run" in line)
    script = "set -e\n" + "\n".join(commands)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               XDG_CONFIG_HOME=str(tmp_path / "config"), OMP_NUM_THREADS="1", MODULELENS_REPO=str(tmp_path / "repo"),
               PYTHONFAULTHANDLER="1")
    ran = subprocess.run(["bash", "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "rank 0: saved shardnet-fsdp/blocks.2.ff:v1" in ran.stdout
    assert "FeedForward" in ran.stdout and ": PASS" in ran.stdout, ran.stdout[-3000:]
