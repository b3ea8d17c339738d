"""Disk full, read-only and permission-denied repos while a job captures (Python API and
``modulelens run``): the job must finish every step, and captures must be saved somewhere a
warning names, or reported as kept in memory.

Disk full and read-only use a small tmpfs (``mount -t tmpfs``, remounted read-only) when this
process may mount; otherwise ``RLIMIT_FSIZE`` (disk full) and ``chmod`` (read-only). Permission
denied is ``chmod 555``, with root's permission-override capabilities dropped (``setpriv``).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from stress.table import Row

JOBS = Path(__file__).resolve().parent / "jobs.py"
ROOT = Path(__file__).resolve().parent.parent
NO_OVERRIDE = ["setpriv", "--inh-caps=-dac_override,-dac_read_search,-fowner",
               "--bounding-set=-dac_override,-dac_read_search,-fowner"]


def _can_mount(folder: Path) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["umount", str(folder)], check=False)
    return ok


@contextmanager
def _condition(kind: str, folder: Path, mount: bool) -> Iterator[tuple[list[str], int | None]]:
    """Sets up ``folder`` for ``kind``; yields (command prefix, file size limit)."""
    folder.mkdir(parents=True, exist_ok=True)
    prefix = NO_OVERRIDE if os.geteuid() == 0 else []
    try:
        if kind == "disk full" and mount:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(folder)], check=True)
            yield [], None
        elif kind == "disk full":
            yield [], 400_000
        elif kind == "read-only" and mount:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], check=True)
            (folder / "repo").mkdir()
            subprocess.run([sys.executable, "-c", f"import modulelens; modulelens.Repo({str(folder / 'repo')!r})"],
                           check=True, env=_env())
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
            yield [], None
        else:  # permission denied (and read-only without mount): nothing here may be written
            (folder / "repo").mkdir(exist_ok=True)
            folder.chmod(0o555)
            (folder / "repo").chmod(0o555)
            yield prefix, None
    finally:
        if mount and kind != "permission denied":
            subprocess.run(["umount", str(folder)], check=False)
        else:
            for path in (folder / "repo", folder):
                if path.exists():
                    path.chmod(0o755)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run(command: list[str], limit: int | None, tmpdir: Path) -> subprocess.CompletedProcess[str]:
    def preexec() -> None:
        if limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = _env()
    env["TMPDIR"] = str(tmpdir)
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, preexec_fn=preexec)


def storage_row(tmp: Path, kinds: tuple[str, ...] = ("disk full", "read-only", "permission denied"),
                entries: tuple[str, ...] = ("api", "run")) -> Row:
    mount = _can_mount(tmp / "probe")
    row = Row("disk full / read-only / permission denied during capture (API and `modulelens run`)")
    row.notes.append("tmpfs mounts" if mount else "RLIMIT_FSIZE and chmod (no mount here)")
    start = time.perf_counter()
    for kind in kinds:
        for entry in entries:
            folder = tmp / f"storage-{kind.replace(' ', '-')}-{entry}"
            tmpdir = tmp / f"tmpdir-{kind.replace(' ', '-')}-{entry}"
            tmpdir.mkdir(parents=True, exist_ok=True)
            with _condition(kind, folder, mount) as (prefix, limit):
                repo = str(folder / "repo")
                if entry == "api":
                    command = [*prefix, sys.executable, str(JOBS), "api", repo]
                else:
                    command = [*prefix, sys.executable, "-m", "modulelens", "run", "-t", "0", "--repo", repo, "--",
                               sys.executable, str(JOBS), "plain"]
                ran = _run(command, limit, tmpdir)
            row.tried += 1
            finished = f"STEPS {6}" in ran.stdout and ran.returncode in (0, 3)
            row.survived += finished
            told = "instead" in ran.stderr + ran.stdout or "kept in memory" in ran.stderr + ran.stdout \
                or "captures go to" in ran.stderr + ran.stdout
            row.lost += not told
            if not finished or not told:
                row.notes.append(f"{kind}/{entry}: exit {ran.returncode}: {(ran.stderr or ran.stdout)[-200:]}")
    row.seconds = time.perf_counter() - start
    return row
