"""Locks that never come back (issue 35, item 3): a second process holds a lock of the repo and never
lets go (stress/lock_holder.py), while a training job captures into it (stress/jobs.py ``api``).

Held: ``lock`` and ``lock-gate`` through a read-only descriptor, a name's folder (the index's lock),
``lock`` by a process stopped with SIGSTOP, and a writer stopped in the middle of a save (its shared
lock) while gc runs; also ``modulelens rm`` on a held name folder, and the lock of a payload's
partial download in a remote repo's cache, held by a stopped process while a load downloads it.

**survived**: the job finished every step and its capture block ended within the wait plus 10 s
(the default wait, 20 s, within 30 s), or the command exited with its one-line error in that time;
**lost**: captures that are neither in the repo nor brought into it by the command the warning
prints, run once the lock is free; **wrong**: a warning or error that is not one line naming the
holder's process, or an exit code other than 7 (``RepoBusyError``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest import mock

import torch

import modulelens
from modulelens.errors import RepoBusyError
from stress.lock_holder import LockHolder
from stress.table import Row

ROOT = Path(__file__).resolve().parent.parent
JOBS = Path(__file__).resolve().parent / "jobs.py"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def _job(repo: Path, tmp: Path, wait: float | None) -> tuple[dict, str]:
    env = _env(TMPDIR=str(tmp), **({"MODULELENS_LOCK_WAIT_S": str(wait)} if wait is not None else {}))
    try:
        ran = subprocess.run([sys.executable, str(JOBS), "api", str(repo)], capture_output=True, text=True,
                             timeout=(wait or 20) + 120, env=env)
    except subprocess.TimeoutExpired:
        return {}, "the job hung"
    lines = ran.stdout.strip().splitlines()
    if ran.returncode != 0 or not lines or not lines[0].startswith("STEPS 6"):
        return {}, f"exit {ran.returncode}: {(ran.stderr or ran.stdout)[-160:]}"
    return json.loads(lines[-1]), ""


def _prepare(root: Path) -> None:
    """A repo in use: its lock files and the job's name folders exist."""
    repo = modulelens.Repo(root)
    for name in ("job/0", "job/2"):
        module = torch.nn.Linear(2, 2)
        with modulelens.capture(module, targets="", repo=repo, name=name):
            module(torch.ones(1, 2))


def _job_case(row: Row, tmp: Path, label: str, held: str, wait: float | None, *, stop: bool = False) -> None:
    row.tried += 1
    folder = tmp / f"stuck-{label.replace(' ', '-')}"
    root = folder / "repo"
    _prepare(root)
    holder = LockHolder("flock", str(root / held), *(["--stop"] if stop else []))
    try:
        out, failure = _job(root, folder, wait)
    finally:
        holder.release()
    if failure:
        row.notes.append(f"{label}: {failure}")
        row.lost += 1
        return
    bound = 30.0 if wait is None else wait + 10
    warning = next((w for w in out["warnings"] if "cannot write captures" in w), "")
    if out["seconds"] <= bound:
        row.survived += 1
    else:
        row.notes.append(f"{label}: the capture block took {out['seconds']:.0f} s")
    if "\n" in warning or f"process {holder.pid} (" not in warning:
        row.wrong += 1
        row.notes.append(f"{label}: warning {warning[:160]!r}")
    command = warning.partition("copy them back with: ")[2]
    if command:
        pushed = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=300, env=_env())
        if pushed.returncode != 0:
            row.notes.append(f"{label}: the printed command failed: {pushed.stderr[-160:]}")
    versions = {name: modulelens.Repo(root).version_numbers(name) for name in ("job/0", "job/2")}
    if versions != {"job/0": [1, 2], "job/2": [1, 2]}:
        row.lost += 1
        row.notes.append(f"{label}: the repo holds {versions}")


def _stopped_writer_case(row: Row, tmp: Path) -> None:
    """A writer stopped mid-save (its shared lock held) while gc runs: saves still pass, and gc ends
    at its wait naming the stopped process."""
    row.tried += 1
    folder = tmp / "stuck-stopped-writer"
    root = folder / "repo"
    _prepare(root)
    holder = LockHolder("writer", str(root), "--stop")
    failures: list[BaseException] = []

    def collect() -> None:
        try:
            modulelens.Repo(root).gc(wait_s=20)
        except BaseException as error:
            failures.append(error)

    gc = threading.Thread(target=collect)
    try:
        with mock.patch.dict(os.environ, MODULELENS_LOCK_WAIT_S="4"):  # this gc holds the turnstile 2 s at a time
            gc.start()
            out, failure = _job(root, folder, 20.0)  # the default wait: a save passes between gc's turns
            gc.join(60)
    finally:
        holder.release()
    if failure or out.get("warnings") or out.get("seconds", 99) > 20:
        row.lost += bool(failure)
        row.notes.append(f"stopped writer: the job {failure or out.get('warnings') or out.get('seconds')}")
        return
    row.survived += 1
    error = failures[0] if failures else None
    if not isinstance(error, RepoBusyError) or "\n" in str(error) or f"process {holder.pid} (" not in str(error) \
            or "stopped" not in str(error):
        row.wrong += 1
        row.notes.append(f"stopped writer: gc ended with {error!r}"[:200])


def _cli_case(row: Row, tmp: Path) -> None:
    row.tried += 1
    folder = tmp / "stuck-cli"
    root = folder / "repo"
    _prepare(root)
    holder = LockHolder("flock", str(root / "names" / "job%2F0"))
    started = time.monotonic()
    try:
        ran = subprocess.run([sys.executable, "-m", "modulelens", "rm", "job/0:v1", "--yes", "--repo", str(root)],
                             capture_output=True, text=True, timeout=120, env=_env(MODULELENS_LOCK_WAIT_S="3"))
    except subprocess.TimeoutExpired:
        row.notes.append("rm on a held name folder hung")
        return
    finally:
        holder.release()
    lines = (ran.stderr + ran.stdout).strip().splitlines()
    row.survived += time.monotonic() - started < 60
    if ran.returncode != 7 or len(lines) != 1 or f"process {holder.pid} (" not in lines[0]:
        row.wrong += 1
        row.notes.append(f"rm: exit {ran.returncode}: {lines[-3:]}")
    if modulelens.Repo(root).version_numbers("job/0") != [1]:
        row.lost += 1


def _download_case(row: Row, tmp: Path) -> None:
    """A load from a remote repo (fsspec's memory://, the same code as s3://) whose payload's partial
    download in the cache is locked by a stopped process: the load ends with the one-line error."""
    from modulelens.repo.packs import referenced_blobs

    row.tried += 1
    url = f"memory://stuck-download-{os.getpid()}"
    outcome: list[BaseException | None] = []
    # (patch.dict puts the whole environment back, the changes made inside it included)
    with mock.patch.dict(os.environ, MODULELENS_CACHE=str(tmp / "stuck-download" / "saving-cache")):
        module = torch.nn.Linear(512, 512)  # a 1 MiB weight: a blob of its own
        with modulelens.capture(module, targets="", repo=url, name="big") as cap:
            module(torch.ones(1, 512))
        cap.wait()
        digest = max(referenced_blobs(modulelens.Repo(url).read_metadata("big", 1)).items(), key=lambda i: i[1])[0]
        os.environ.update(MODULELENS_CACHE=str(tmp / "stuck-download" / "cache"), MODULELENS_LOCK_WAIT_S="2")
        part = modulelens.Repo(url).store.cache.partial_path(digest)
        part.touch()
        holder = LockHolder("flock", str(part), "--stop")

        def load() -> None:
            try:
                modulelens.load("big:v1", repo=url).module  # noqa: B018
                outcome.append(None)
            except BaseException as error:
                outcome.append(error)

        loading = threading.Thread(target=load, daemon=True)
        try:
            loading.start()
            loading.join(60)
        finally:
            holder.release()
    if not outcome:
        row.notes.append("a load behind a stuck download lock hung")
        return
    row.survived += 1
    error = outcome[0]
    if not isinstance(error, RepoBusyError) or "\n" in str(error) or f"process {holder.pid} (" not in str(error):
        row.wrong += 1
        row.notes.append(f"stuck download: the load ended with {error!r}"[:200])


def stuck_locks_row(tmp: Path, quick: bool) -> Row:
    row = Row("stuck locks (held through a read-only descriptor, stopped holders) while a job captures")
    start = time.perf_counter()
    _job_case(row, tmp, "lock, default wait", "lock", None)
    _job_case(row, tmp, "lock-gate, holder stopped", "lock-gate", 3.0, stop=True)
    if not quick:  # (each job is a fresh process importing torch: ~10 s on 2 shared cores)
        _job_case(row, tmp, "a name folder", "names/job%2F0", 5.0)
        _job_case(row, tmp, "lock, holder stopped", "lock", 5.0, stop=True)
        _stopped_writer_case(row, tmp)
    _cli_case(row, tmp)
    _download_case(row, tmp)
    row.seconds = time.perf_counter() - start
    return row
