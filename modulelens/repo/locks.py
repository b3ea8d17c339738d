"""``flock`` with a deadline, and who holds a lock: every lock of a local repo is waited for this way.

``flock`` needs only an open file, so any process that can read a repo can hold its locks: one that
held ``LOCK_EX`` on ``lock`` through a read-only descriptor, or a writer stopped in a debugger while
it held one, made every save wait forever with no message (issue 35). So no wait is without end: a
lock that is not granted by its deadline ends in a one-line :class:`~modulelens.errors.RepoBusyError`
naming its holder as ``/proc/locks`` shows it (process id, command line, whether it is stopped, this
host), and a capture, which must never stop the job, saves elsewhere (tracing/save.py).

The wait polls (``LOCK_NB``) with a growing pause, 1 ms to 50 ms: a blocking ``flock`` cannot be
given a timeout from Python but by a signal, which only the main thread may set. A lock that is
free costs one call, as before.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from modulelens.errors import RepoBusyError

_LOCK_WAIT_S = 20.0
_FIRST_PAUSE_S = 0.001
_LONGEST_PAUSE_S = 0.05
_PROC_LOCKS = Path("/proc/locks")


def lock_wait_s() -> float:
    """How long a writer (a save, an alias move, an rm) waits for a lock of a local repo before it
    gives up: ``MODULELENS_LOCK_WAIT_S`` seconds (default 20; a capture then saves elsewhere, so a
    stuck lock costs a job at most this long)."""
    try:
        return max(0.0, float(os.environ.get("MODULELENS_LOCK_WAIT_S", _LOCK_WAIT_S)))
    except ValueError:
        return _LOCK_WAIT_S


def wait_for(fd: int, *, exclusive: bool, deadline: float) -> bool:
    """Take ``flock`` on ``fd`` (shared, or ``exclusive``) before ``deadline`` (``time.monotonic()``);
    ``False`` when it was still held by another then."""
    operation = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
    pause = _FIRST_PAUSE_S
    while True:
        try:
            fcntl.flock(fd, operation)
            return True
        except BlockingIOError:
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, _LONGEST_PAUSE_S)


def busy(path: str, fd: int, waited_s: float, doing: str) -> RepoBusyError:
    """The one-line error of a wait for the lock ``path`` (open as ``fd``) that ran out."""
    return RepoBusyError(f"{doing}: {path} was still locked after {waited_s:.0f} s, by {holder(fd)}; "
                         "stop that process if it is stuck (MODULELENS_LOCK_WAIT_S sets the wait)")


def holder(fd: int) -> str:
    """Who holds a lock on the file open as ``fd``, as ``/proc/locks`` shows it: the process id,
    its command line, whether it is stopped, and this host; or why that cannot be told."""
    info = os.fstat(fd)
    try:
        lines = _PROC_LOCKS.read_text().splitlines()
    except OSError:
        return "another process (/proc/locks cannot be read here)"
    pids: list[int] = []
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 2412 00:1a:1234 0 EOF"; "1: -> FLOCK ..." is a process waiting
        if len(fields) < 6 or fields[1] == "->":
            continue
        major, minor, inode = [*fields[5].split(":"), "", "", ""][:3]
        if inode == str(info.st_ino) and fields[4].isdigit():
            # the same device first (an overlay filesystem may show its lower one)
            if (major, minor) == (f"{os.major(info.st_dev):02x}", f"{os.minor(info.st_dev):02x}"):
                pids.insert(0, int(fields[4]))
            else:
                pids.append(int(fields[4]))
    if not pids:
        return ("a process this host cannot see (on another machine sharing the folder, or in another "
                "container)")
    pid = pids[0]
    more = f" and {len(pids) - 1} other(s)" if len(pids) > 1 else ""
    return f"process {pid}{_described(pid)} on {_printable(socket.gethostname())}{more}"


def _described(pid: int) -> str:
    """`` (command line, stopped)`` of a process, as much of it as can be read."""
    if pid == 0:
        return " (in another process namespace)"
    if pid == os.getpid():
        return " (this process)"
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").strip().decode(errors="replace")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    state = stat.rpartition(")")[2].split()[:1]
    stopped = {"T": ", stopped", "t": ", stopped by a debugger"}.get(state[0] if state else "", "")
    return f" ({_printable(command)[:160] or '?'}{stopped})"


def _printable(text: str) -> str:
    """``text`` on one line, without control characters (a command line is anyone's to choose)."""
    return "".join(c if c.isprintable() else "?" for c in text)
