"""Locks that never come back (issue 35): a process holding a repo's lock (through a read-only
descriptor, or a writer stopped as in a debugger) ends every wait at its deadline with one line
naming it, and a capture job goes on, its captures saved where the warning's command copies them
back from. Every holder is a real second process (stress/lock_holder.py)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from child_process import PYTHON, SUPPORT_DIR, subprocess_env
from typer.testing import CliRunner

import modulelens
from modulelens.errors import RepoBusyError
from modulelens.interfaces.cli import app
from modulelens.repo.locks import holder
from modulelens.repo.packs import referenced_blobs
from stress.lock_holder import LockHolder


@pytest.fixture
def held() -> Iterator[list[LockHolder]]:
    holders: list[LockHolder] = []
    yield holders
    for one in holders:
        one.release()


def _save(repo: modulelens.Repo | Path, name: str = "lin", **options: object) -> list[modulelens.VersionInfo]:
    module = torch.nn.Linear(4, 4)
    with modulelens.capture(module, targets="", repo=repo, name=name, **options) as cap:
        module(torch.randn(2, 4))
    return cap.saved


def _job(repo: Path, tmp: Path, **env: str) -> dict:
    ran = subprocess.run([PYTHON, str(SUPPORT_DIR / "fail_open_job.py"), str(repo)], capture_output=True, text=True,
                         timeout=180, env=subprocess_env(TMPDIR=str(tmp), **env))
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("held_entry", "wait"), [("lock", None), ("lock-gate", "2"), ("names/job%2F0", "2")])
def test_a_stuck_lock_ends_the_save_at_its_deadline_and_the_job_goes_on(held_entry: str, wait: str | None,
                                                                         tmp_path: Path, held: list[LockHolder]) -> None:
    root = tmp_path / "repo"
    _save(root, "job/0")  # the lock files and the name's folder exist, as in a repo in use
    held.append(LockHolder("flock", str(root / held_entry)))
    out = _job(root, tmp_path, **({"MODULELENS_LOCK_WAIT_S": wait} if wait else {}))
    assert out["steps"] == 6
    # the default wait (20 s) ends a stuck lock well within 30 s; one wait, however many captures
    assert out["seconds"] < (30 if wait is None else 15)
    [warning] = [w for w in out["warnings"] if "cannot write captures" in w]
    assert "\n" not in warning
    assert f"{root}/{held_entry.split('/')[0] if held_entry.startswith('names') else held_entry}" in warning
    assert f"process {held[0].pid} (" in warning and "stress.lock_holder" in warning
    assert out["saved"] == ["job/0:v1", "job/2:v1"]  # in the fallback repo the warning names
    assert modulelens.Repo(root).version_numbers("job/0") == [1]
    held[0].release()
    command = warning.partition("copy them back with: ")[2]
    assert command.count("modulelens push") == 2
    pushed = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert pushed.returncode == 0, pushed.stderr
    repo = modulelens.Repo(root)
    assert [i.ref for i in repo.list()] == ["job/0:v1", "job/0:v2", "job/2:v1"]
    for ref in ("job/0:v2", "job/2:v1"):
        assert modulelens.load(ref, repo=repo, verify=True).replay().passed


def test_a_stuck_lock_in_strict_mode_raises_the_one_line_error(tmp_path: Path, held: list[LockHolder],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    _save(repo)
    held.append(LockHolder("flock", str(repo.root / "lock-gate")))
    monkeypatch.setenv("MODULELENS_LOCK_WAIT_S", "1")
    with pytest.raises(RepoBusyError, match=rf"lock-gate was still locked after 1 s, by process {held[0].pid} "):
        _save(repo, strict=True)


def test_a_writer_stopped_in_a_debugger_keeps_neither_gc_nor_saves_waiting(tmp_path: Path, held: list[LockHolder]) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    _save(repo)
    held.append(LockHolder("writer", str(repo.root), "--stop"))  # holds `lock` shared, stopped
    failure: list[BaseException] = []

    def collect() -> None:
        try:
            modulelens.Repo(repo.root).gc(wait_s=12)
        except BaseException as error:
            failure.append(error)

    gc = threading.Thread(target=collect)
    gc.start()
    try:
        # gc queues for `lock` behind the stopped writer, holding the turnstile only in turns: a save
        # meanwhile passes (before, it waited behind gc, which waited forever)
        saved = _save(repo, strict=True)
        assert [i.ref for i in saved] == ["lin:v2"]
    finally:
        gc.join(60)
    [error] = failure
    assert isinstance(error, RepoBusyError)
    message = str(error)
    assert "\n" not in message and f"{repo.root}/lock was still locked after 12 s" in message
    assert f"process {held[0].pid} (" in message and "stopped)" in message


def test_cli_writes_with_a_stuck_name_folder_exit_7_naming_the_holder(tmp_path: Path, held: list[LockHolder],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    _save(repo)
    _save(repo)
    held.append(LockHolder("flock", str(repo.root / "names" / "lin"), "--stop"))
    monkeypatch.setenv("MODULELENS_LOCK_WAIT_S", "1")
    runner = CliRunner()
    for args in (["alias", "lin:v1", "golden"], ["rm", "lin:v1", "--yes"]):
        result = runner.invoke(app, [*args, "--repo", str(repo.root)])
        assert result.exit_code == 7, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and f"process {held[0].pid} (" in lines[0] and "stopped" in lines[0], lines
    held[0].release()
    assert [i.ref for i in repo.list()] == ["lin:v1", "lin:v2"]  # nothing changed, and nothing is stuck after
    assert repo.fsck().clean


def test_the_holder_is_named_from_proc_locks(tmp_path: Path, held: list[LockHolder]) -> None:
    target = tmp_path / "a-lock"
    target.write_bytes(b"")
    held.append(LockHolder("flock", str(target)))
    fd = os.open(target, os.O_RDONLY)
    try:
        named = holder(fd)
    finally:
        os.close(fd)
    assert re.fullmatch(rf"process {held[0].pid} \(\S*python\S* -m stress\.lock_holder flock \S*\) on .+", named), named
    os.kill(held[0].pid, signal.SIGSTOP)
    while Path(f"/proc/{held[0].pid}/stat").read_text().rpartition(")")[2].split()[0] != "T":
        time.sleep(0.01)  # (the signal is delivered asynchronously)
    fd = os.open(target, os.O_RDONLY)
    try:
        assert holder(fd).endswith(f", stopped) on {os.uname().nodename}")
    finally:
        os.close(fd)


def _remote_with_a_weight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, int]:
    """A memory:// repo holding one capture whose 1 MiB weight is its own blob, and an empty cache
    to load it through: (url, the weight's digest, its size)."""
    monkeypatch.setenv("MODULELENS_CACHE", str(tmp_path / "saving-cache"))
    url = f"memory://download-lock-{tmp_path.name}"
    module = torch.nn.Linear(512, 512)
    with modulelens.capture(module, targets="", repo=url, name="big") as cap:
        module(torch.randn(2, 512))
    cap.wait()
    blobs = referenced_blobs(modulelens.Repo(url).read_metadata("big", 1))
    digest, nbytes = max(blobs.items(), key=lambda item: item[1])
    monkeypatch.setenv("MODULELENS_CACHE", str(tmp_path / "cache"))  # loads download from nothing
    return url, digest, nbytes


def test_a_stuck_download_lock_ends_the_load_with_a_one_line_error(tmp_path: Path, held: list[LockHolder],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, a process holding the lock of a payload's partial download (a fetcher stopped in a
    debugger, or any reader of the cache) hung every load of it with no message."""
    url, digest, _ = _remote_with_a_weight(tmp_path, monkeypatch)
    part = modulelens.Repo(url).store.cache.partial_path(digest)
    part.touch()
    held.append(LockHolder("flock", str(part), "--stop"))
    monkeypatch.setenv("MODULELENS_LOCK_WAIT_S", "1")
    started = time.monotonic()
    with pytest.raises(RepoBusyError) as raised:
        modulelens.load("big:v1", repo=url).module  # noqa: B018
    assert time.monotonic() - started < 15
    message = str(raised.value)
    assert "\n" not in message and "it stopped growing" in message and str(part) in message
    assert f"process {held[0].pid} (" in message and "stopped)" in message
    held[0].release()
    assert modulelens.load("big:v1", repo=url).replay().passed  # nothing left behind that blocks the next load


def test_a_download_that_grows_is_waited_for_past_the_lock_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another fetcher of the same payload holds its lock for as long as the download takes, longer
    than MODULELENS_LOCK_WAIT_S: the load waits while the file grows, then resumes from it."""
    url, digest, nbytes = _remote_with_a_weight(tmp_path, monkeypatch)
    store = modulelens.Repo(url).store
    payload = store.objects.read_range(store._blob_key(digest), 0, nbytes)
    part = store.cache.partial_path(digest)
    monkeypatch.setenv("MODULELENS_LOCK_WAIT_S", "1")
    holding = threading.Event()

    def slow_fetcher() -> None:  # its own open file, so its flock excludes the load's (as another process's)
        with open(part, "ab") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            holding.set()
            for step in range(6):  # 3 s in all, three times the wait, growing every 0.5 s
                handle.write(payload[step * nbytes // 8:(step + 1) * nbytes // 8])
                handle.flush()
                time.sleep(0.5)

    fetcher = threading.Thread(target=slow_fetcher)
    fetcher.start()
    holding.wait(30)
    started = time.monotonic()
    try:
        loaded = modulelens.load("big:v1", repo=url)
        assert time.monotonic() - started >= 2  # it waited for the holder rather than give up after 1 s
        assert loaded.replay().passed
    finally:
        fetcher.join(30)
