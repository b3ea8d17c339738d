"""A process that holds a lock of a repo and never lets go (issue 35), for the stuck-lock row and
tests/repo/test_locks.py::

    python -m stress.lock_holder flock PATH          # LOCK_EX on a file or folder, opened read-only
    python -m stress.lock_holder flock PATH --stop   # the same, then stopped (SIGSTOP), as in a debugger
    python -m stress.lock_holder writer REPO --stop  # a writer of REPO (its shared lock), then stopped

It prints ``held <pid>`` once it holds the lock, then sleeps (or stops) until it is killed.
:class:`LockHolder` starts one and waits until it holds the lock.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class LockHolder:
    """A process of this module holding a lock: ``pid`` holds it until :meth:`release`."""

    def __init__(self, *args: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen([sys.executable, "-m", "stress.lock_holder", *args], stdout=subprocess.PIPE,
                                        text=True, env=env)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("held "):
            self.release()
            raise RuntimeError(f"the lock holder did not start: {line!r}")
        self.pid = int(line.split()[1])

    def release(self) -> None:
        self.process.kill()  # a stopped process dies on SIGKILL too
        self.process.wait(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()


def main(argv: list[str]) -> None:
    kind, target, stop = argv[0], argv[1], "--stop" in argv
    if kind == "flock":
        # read-only: anyone who can read a repo can do this (flock needs no write access)
        fd = os.open(target, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(target) else 0))
        fcntl.flock(fd, fcntl.LOCK_EX)
        _hold(stop)
    import modulelens

    with modulelens.Repo(target).writing():
        _hold(stop)


def _hold(stop: bool) -> None:
    print(f"held {os.getpid()}", flush=True)
    if stop:
        os.kill(os.getpid(), signal.SIGSTOP)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1:])
