"""Running the kernel verifier's worker processes: their environment, timeouts, process groups.

Each worker runs in its own process group (``start_new_session``) so a timeout kills the worker and
everything it started (a candidate may spawn processes despite the static check); the group is
killed again after a normal exit, for anything left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict


def worker_env(device: str, *, candidate: bool) -> dict[str, str]:
    """The environment of a worker: this process's ``sys.path`` as ``PYTHONPATH`` (so the reference's
    modules import the same way), ``TRITON_INTERPRET=1`` off CUDA, and no ``$MODULELENS_REPO`` for a
    candidate (it must not find the recorded data).

    Example::

        env = worker_env("cpu", candidate=True)   # env["TRITON_INTERPRET"] == "1"
    """
    env = dict(os.environ)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    cwd = os.getcwd()
    if cwd not in paths:
        paths.insert(0, cwd)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("PYTHONUNBUFFERED", "1")
    if device.startswith("cuda"):
        env.pop("TRITON_INTERPRET", None)
    else:
        env["TRITON_INTERPRET"] = "1"
    if candidate:
        env.pop("MODULELENS_REPO", None)
    return env


class IsolatedRun(TypedDict):
    """What :func:`run_isolated` saw of a worker process."""

    returncode: int
    timed_out: bool
    seconds: float
    stdout_tail: str
    stderr_tail: str


def run_isolated(command: list[str], *, env: dict[str, str], cwd: Path, timeout: float, logs: Path,
                 poll: Callable[[], None] | None = None, poll_every: float = 0.5) -> IsolatedRun:
    """Run one worker in its own process group; kill the whole group on timeout (and afterwards).

    ``poll`` (e.g. a progress display reading the worker's progress file) is called every
    ``poll_every`` seconds while the worker runs.

    Returns:
        ``returncode``, ``timed_out``, ``seconds``, and the tails of stdout/stderr (kept in ``logs``).
    """
    logs.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    deadline = start + timeout
    timed_out = False
    with open(logs / "stdout.txt", "wb") as out, open(logs / "stderr.txt", "wb") as err:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                   start_new_session=True)
        while True:
            left = deadline - time.perf_counter()
            try:
                code = process.wait(timeout=max(min(left, poll_every) if poll is not None else left, 0.0))
                break
            except subprocess.TimeoutExpired:
                if time.perf_counter() < deadline and poll is not None:
                    poll()
                    continue
                timed_out = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                code = process.wait()
                break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # anything the candidate left behind
    return {"returncode": code, "timed_out": timed_out, "seconds": round(time.perf_counter() - start, 3),
            "stdout_tail": _tail(logs / "stdout.txt"), "stderr_tail": _tail(logs / "stderr.txt")}


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")
