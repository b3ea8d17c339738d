"""A process that holds a lock of a repo and never lets go (issue 35), for the stuck-lock row and
tests/repo/test_locks.py::

    python -m stress.lock_holder flock PATH          # LOCK_EX on a file or folder, opened read-only
    python -m stress.lock_holder flock PATH --stop   # the same, then stopped (SIGSTOP), as in a debugger
    python -m stress.lock_holder writer REPO --stop  # a writer of REPO (its shared lock), then stopped

It prints ``held <pid>`` once it holds the lock, then sleeps (or stops) until it is killed.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import time


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
