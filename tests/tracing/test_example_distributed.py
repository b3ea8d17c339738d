"""The README's distributed example, run as written from the folder it names (issue 21, 8).

``cd examples/distributed``, ``train.py`` under torchrun, then ``python replay.py``: the capture
names ``shardnet:Block``'s feed-forward, whose module is in the current folder and on no
``PYTHONPATH``. It reloads because it is the user's own capture, signed at save
(docs/security.md, "Your own captures"). Only the repo path (a temporary folder) and the port (a
free one: other jobs may hold 29500) differ from the README's text.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from child_process import REPO_ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def readme_commands() -> list[str]:
    """The shell commands of the README's block that starts with ``cd examples/distributed``."""
    text = (REPO_ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "cd examples/distributed" in b)
    lines = (line.partition("   #")[0].strip() for line in block.replace("\\\n", " ").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_readme_distributed_example_runs_as_written(tmp_path: Path) -> None:
    commands = readme_commands()
    assert commands[0] == "cd examples/distributed" and commands[-1].startswith("python replay.py")
    script = "set -e\n" + "\n".join(commands).replace("/tmp/modulelens-example", str(tmp_path / "repo")).replace(
        "--master-port 29500", f"--master-port {_free_port()}")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MODULELENS_REPO")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               XDG_CONFIG_HOME=str(tmp_path / "config"), OMP_NUM_THREADS="1")
    ran = subprocess.run(["bash", "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "rank 0: saved shardnet-fsdp/blocks.2.ff:v1" in ran.stdout
    assert "FeedForward" in ran.stdout and ": PASS" in ran.stdout, ran.stdout[-3000:]
