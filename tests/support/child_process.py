"""Running code in a fresh Python process: the interpreter and an environment in which this
checkout, the test support modules (``tests/support``) and the distributed example's model
(``examples/distributed/shardnet.py``) are importable, exactly as in the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SUPPORT_DIR = Path(__file__).resolve().parent
TESTS_DIR = SUPPORT_DIR.parent
REPO_ROOT = TESTS_DIR.parent
# The distributed tests use the example's model (one home for it); captures record ``shardnet:Block``.
EXAMPLE_MODELS_DIR = REPO_ROOT / "examples" / "distributed"
PYTHON = sys.executable


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: this checkout, the test support modules and the example's
    model (``shardnet``) importable."""
    env = dict(os.environ)
    paths = [str(REPO_ROOT), str(SUPPORT_DIR), str(EXAMPLE_MODELS_DIR)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def replay_in_fresh_process(repo: Path, refs: dict[str, str], extra_path: list[str] | None = None) -> dict[str, Any]:
    """Replay ``refs`` (label -> ref) of ``repo`` in one fresh process (``fidelity_replay.py``), each
    label's result; ``extra_path`` goes first on the child's ``PYTHONPATH``."""
    manifest = repo.parent / "manifest.json"
    manifest.write_text(json.dumps(refs))
    env = subprocess_env()
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join([*extra_path, env["PYTHONPATH"]])
    result = subprocess.run([PYTHON, str(SUPPORT_DIR / "fidelity_replay.py"), str(repo), str(manifest)],
                            capture_output=True, text=True, env=env, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    results: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])["results"]
    return results


#: ``python -c FRESH_CLI <args>`` runs the ``modulelens`` command line as its console script does, in
#: this fresh process, and prints a last line of JSON: its exit code and every module it imported.
FRESH_CLI = """
import json, runpy, sys
sys.argv = ["modulelens", *sys.argv[1:]]
try:
    runpy.run_module("modulelens", run_name="__main__")
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def on_terminal(command: list[str], env: dict[str, str], columns: int = 80) -> tuple[bytes, bytes]:
    """Run ``command`` with its stdout on a pseudo-terminal of ``columns`` columns (``COLUMNS`` and
    ``LINES`` left out of ``env``, so the size is the terminal's): what it wrote there and on its
    stderr, once it exited 0."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    with subprocess.Popen(command, stdout=follower, stderr=subprocess.PIPE, env=env) as process:
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert process.wait(timeout=120) == 0
        errors = process.stderr.read() if process.stderr else b""
    os.close(leader)
    return b"".join(chunks), errors
