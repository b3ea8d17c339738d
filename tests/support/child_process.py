"""Running code in a fresh Python process: the interpreter and an environment in which this
checkout and the test support modules (``tests/support``) are importable, exactly as in the tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SUPPORT_DIR = Path(__file__).resolve().parent
TESTS_DIR = SUPPORT_DIR.parent
REPO_ROOT = TESTS_DIR.parent
PYTHON = sys.executable


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: this checkout and the test support modules importable."""
    env = dict(os.environ)
    paths = [str(REPO_ROOT), str(SUPPORT_DIR)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env
