"""Running code in a fresh Python process: the interpreter and an environment in which this
checkout, the test support modules (``tests/support``) and the distributed example's model
(``examples/distributed/shardnet.py``) are importable, exactly as in the tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
