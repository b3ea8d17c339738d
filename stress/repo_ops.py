"""kill -9 at random points of save/remove/alias/gc, and many processes racing on one repo.

Workers are forked from the suite's process (torch and modulelens already imported, so a worker
starts in milliseconds) and append one JSON line per completed operation to their log, written
with a single ``os.write`` so a kill never leaves half a line that counts. Afterwards a fresh
``Repo`` is checked: every listed version must load and verify (else ``wrong``: half-visible or
damaged), ``fsck`` must find no problem (what a crash leaves is only garbage for gc), and every save
that returned, unless a remove of it also returned, must still be there (else ``lost``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import torch

import modulelens
from modulelens.errors import ModulelensError
from modulelens.format.tensors import dtype_from_name, tensor_bytes
from stress.table import Row

_CTX = multiprocessing.get_context("fork")


def _log(handle: int, **record: Any) -> None:
    os.write(handle, (json.dumps(record) + "\n").encode())


_TEMPLATE: dict[str, Any] = {}


def make_template(tmp: Path, size: int = 32) -> None:
    """One real capture's metadata and payload bytes, made before forking: a worker's save is then
    ``Repo.save_version`` itself (``capture()`` in a fresh fork spends seconds describing the
    environment, which would leave kills no save to interrupt)."""
    repo = modulelens.Repo(tmp / "template-repo")
    model = torch.nn.Sequential(torch.nn.Linear(size, size))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with modulelens.capture(model, targets=["0"], repo=repo, name="template", strict=True) as cap:
            model(torch.randn(2, size))
    meta = repo.read_metadata(*repo.resolve(cap.saved[0].ref))
    reader = repo.payloads(meta)  # loose blobs and packs alike
    payloads = {tid: bytes(tensor_bytes(reader.open_tensor(e, dtype_from_name(e["dtype"]))))
                for tid, e in meta["tensors"].items() if e.get("payload")}
    meta.pop("packs", None)  # filled in again by each save
    for entry in meta["tensors"].values():
        entry.pop("pack", None)
    _TEMPLATE.update(meta=meta, payloads=payloads)


def _save(repo: modulelens.Repo, name: str, handle: int) -> None:
    tag = uuid.uuid4().hex
    meta = json.loads(json.dumps(_TEMPLATE["meta"]))
    meta["tags"] = [tag]
    payloads = {tid: memoryview(data) for tid, data in _TEMPLATE["payloads"].items()}
    info = repo.save_version(f"{name}/0", meta, payloads)
    _log(handle, op="saved", ref=info.ref, name=info.name, tag=tag)


def _remove(repo: modulelens.Repo, name: str, handle: int) -> None:
    refs = [info for info in repo.list() if info.name.startswith(name)]
    if not refs:
        return
    info = random.choice(refs)
    # Intent first: a kill between remove() returning and the log line must not count as a loss.
    _log(handle, op="removing", ref=info.ref, name=info.name, tag=(info.tags or ("",))[0])
    repo.remove(info.ref)
    _log(handle, op="removed", ref=info.ref, name=info.name, tag=(info.tags or ("",))[0])


def _alias(repo: modulelens.Repo, name: str, handle: int) -> None:
    infos = [info for info in repo.list() if info.name.startswith(name)]
    if infos:
        info = random.choice(infos)
        repo.set_alias(info.ref, "best")
        _log(handle, op="alias", ref=info.ref)


def _read(repo: modulelens.Repo, name: str, handle: int) -> None:
    infos = [info for info in repo.list() if info.name.startswith(name)]
    if infos:
        cap = modulelens.load(random.choice(infos).ref, repo=repo)
        _ = [c.output for c in cap.calls]
        _log(handle, op="read")


OPS = {"save": _save, "remove": _remove, "alias": _alias, "gc": lambda repo, name, handle: repo.gc(tmp_age_s=0),
       "read": _read}


def _worker(root: str, log: str, ops: list[str], count: int | None, name: str, seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    handle = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    repo = modulelens.Repo(root)
    done = 0
    while count is None or done < count:
        op = random.choice(ops)
        try:
            OPS[op](repo, name, handle)
        except ModulelensError as error:
            _log(handle, op="refused", what=op, error=f"{type(error).__name__}: {error}")
        except Exception as error:  # an error modulelens does not document: counted as wrong
            _log(handle, op="crash", what=op, error=f"{type(error).__name__}: {error}")
        done += op == "save" or count is None
    os._exit(0)


def _read_logs(paths: list[Path]) -> list[dict[str, Any]]:
    records = []
    for path in paths:
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
    return records


def check_repo(root: Path, records: list[dict[str, Any]]) -> tuple[int, int, list[str]]:
    """(lost, wrong, notes) of the repo at ``root`` against what the workers reported."""
    repo = modulelens.Repo(root)
    notes: list[str] = []
    wrong = 0
    present: set[tuple[str, str]] = set()
    for info in repo.list():
        try:
            cap = modulelens.load(info.ref, repo=repo, verify=True)
            _ = [c.output for c in cap.calls]
            present.update((info.name, tag) for tag in info.tags)
        except Exception as error:
            wrong += 1
            notes.append(f"{info.ref}: {type(error).__name__}: {error}")
    removed = {(r["name"], r["tag"]) for r in records if r["op"] in ("removed", "removing")}
    saved = {(r["name"], r["tag"]) for r in records if r["op"] == "saved"}
    lost = len(saved - removed - present)
    if lost:
        notes.append(f"{lost} reported saves missing")
    crashes = [f"{r['what']}: {r['error']}" for r in records if r["op"] == "crash"]
    wrong += len(crashes)
    notes.extend(crashes[:3])
    # What a crash leaves must be only garbage for gc (staging, unreferenced payloads), never damage.
    report = repo.fsck()
    wrong += len(report.problems)
    notes.extend(f"fsck: {p.kind} {p.path}: {p.detail}" for p in report.problems[:3])
    return lost, wrong, notes


def kill_row(tmp: Path, trials: int) -> Row:
    """kill -9 a worker doing save/remove/alias/gc at a random moment, ``trials`` times."""
    row = Row("kill -9 during save/remove/alias/gc, then verify and fsck")
    start = time.perf_counter()
    make_template(tmp)
    root = tmp / "kill-repo"
    modulelens.Repo(root)
    logs: list[Path] = []
    for trial in range(trials):
        log = tmp / f"kill-{trial}.log"
        logs.append(log)
        proc = _CTX.Process(target=_worker, args=(str(root), str(log), ["save", "save", "remove", "alias", "gc"],
                                                  None, f"k{trial % 3}", trial))
        proc.start()
        time.sleep(random.uniform(0.05, 1.0))  # several operations, the last one killed mid-way
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        row.tried += 1
        if trial % 10 == 9 or trial == trials - 1:  # half-visible versions stay visible: check every 10 kills
            lost, wrong, notes = check_repo(root, _read_logs(logs))
            row.lost, row.wrong = lost, wrong  # cumulative over the whole run (the logs accumulate)
            row.notes = notes
    row.survived = row.tried if not (row.lost or row.wrong) else row.tried - 1
    saves = sum(r["op"] == "saved" for r in _read_logs(logs))
    row.notes.insert(0, f"{saves} saves returned across the trials")
    row.seconds = time.perf_counter() - start
    return row


def race_row(tmp: Path, writers: int, saves: int) -> Row:
    """``writers`` processes x ``saves`` saves, with a remover, an alias mover, gc and a reader."""
    row = Row(f"{writers} writers x {saves} saves + concurrent rm/alias/gc/readers")
    start = time.perf_counter()
    make_template(tmp)
    root = tmp / "race-repo"
    modulelens.Repo(root)
    logs = [tmp / f"race-{i}.log" for i in range(writers + 4)]
    procs = [_CTX.Process(target=_worker, args=(str(root), str(logs[i]), ["save"], saves, f"w{i % 3}", i))
             for i in range(writers)]
    helpers = [_CTX.Process(target=_worker, args=(str(root), str(logs[writers + j]), [op], None, "w", 100 + j))
               for j, op in enumerate(["remove", "alias", "gc", "read"])]
    for p in (*procs, *helpers):
        p.start()
    for p in procs:
        p.join()
    for p in helpers:
        os.kill(p.pid, signal.SIGKILL)
        p.join()
    records = _read_logs(logs)
    lost, wrong, notes = check_repo(root, records)
    row.tried = writers * saves
    reported = sum(r["op"] == "saved" for r in records)
    refused = [r for r in records if r["op"] == "refused" and r["what"] == "save"]
    row.survived = reported
    row.lost, row.wrong = lost, wrong
    row.notes = [f"{reported} saves returned, {len(refused)} refused",
                 f"removes {sum(r['op'] == 'removed' for r in records)}, alias moves "
                 f"{sum(r['op'] == 'alias' for r in records)}, reads {sum(r['op'] == 'read' for r in records)}",
                 *notes, *(r["error"] for r in refused[:2])]
    row.seconds = time.perf_counter() - start
    return row


def _rm_race_saver(root: str, log: str, deadline: float, seed: int) -> None:
    """Save until ``deadline``; log each save that returned (its ref) and each that raised (its tag)."""
    random.seed(seed)
    handle = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    repo = modulelens.Repo(root)
    while time.time() < deadline:
        tag = uuid.uuid4().hex
        meta = json.loads(json.dumps(_TEMPLATE["meta"]))
        meta["tags"] = [tag]
        try:
            info = repo.save_version(f"r{random.randrange(2)}", meta,
                                     {tid: memoryview(data) for tid, data in _TEMPLATE["payloads"].items()})
            _log(handle, op="saved", ref=info.ref, tag=tag)
        except ModulelensError as error:
            _log(handle, op="save failed", tag=tag, error=f"{type(error).__name__}: {error}")
        except Exception as error:  # not a documented error: counted as wrong
            _log(handle, op="crash", what="save", error=f"{type(error).__name__}: {error}")
    os._exit(0)


def _rm_race_remover(root: str, log: str, deadline: float, seed: int) -> None:
    """``rm NAME`` (every version) or ``rm NAME:vN`` until ``deadline``; logs what each rm returned."""
    random.seed(seed)
    handle = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    repo = modulelens.Repo(root)
    while time.time() < deadline:
        name = f"r{random.randrange(2)}"
        try:
            if random.random() < 0.5:
                removed = repo.remove(name)
            else:
                versions = repo.version_numbers(name)
                removed = repo.remove(f"{name}:v{random.choice(versions)}") if versions else []
            _log(handle, op="removed", refs=removed)
        except ModulelensError:
            pass  # nothing to remove, or removed meanwhile by the other remover
        except Exception as error:
            _log(handle, op="crash", what="rm", error=f"{type(error).__name__}: {error}")
        time.sleep(random.uniform(0, 0.02))
    os._exit(0)


def rm_race_row(tmp: Path, seconds: float) -> Row:
    """3 processes saving into 2 names while 2 run ``rm NAME`` / ``rm NAME:vN``, for ``seconds``;
    then fsck. Versions are never reused, so a ref names one save: a ref whose save returned must
    be listed unless an ``rm`` returned it, and a save that raised must not have committed."""
    row = Row("rm NAME / rm NAME:vN racing saves, then fsck")
    start = time.perf_counter()
    make_template(tmp)
    root = tmp / "rm-race-repo"
    modulelens.Repo(root)
    deadline = time.time() + seconds
    logs = [tmp / f"rm-race-{i}.log" for i in range(5)]
    procs = [_CTX.Process(target=_rm_race_saver if i < 3 else _rm_race_remover,
                          args=(str(root), str(logs[i]), deadline, 200 + i)) for i in range(5)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(seconds + 120)
    records = _read_logs(logs)
    repo = modulelens.Repo(root)
    listed = repo.list()
    present = {info.ref for info in listed}
    present_tags = {tag for info in listed for tag in info.tags}
    saved = {r["ref"] for r in records if r["op"] == "saved"}
    removed = {ref for r in records if r["op"] == "removed" for ref in r["refs"]}
    failed = [r for r in records if r["op"] == "save failed"]
    crashes = [r for r in records if r["op"] == "crash"]
    row.tried = len(saved) + len(failed) + sum(r["what"] == "save" for r in crashes)
    row.lost = len(saved - removed - present)
    committed_failed = [r for r in failed if r["tag"] in present_tags]
    report = repo.fsck()
    row.wrong = len(crashes) + len(committed_failed) + sum(not p.repaired for p in report.problems)
    row.survived = row.tried - sum(r["what"] == "save" for r in crashes)
    row.notes = [f"{len(saved)} saves returned, {len(failed)} raised ({len(committed_failed)} of them committed), "
                 f"{len(removed)} versions removed by {sum(r['op'] == 'removed' for r in records)} rm calls; "
                 f"fsck: {len(report.problems)} problems",
                 *(f"lost: {ref}" for ref in sorted(saved - removed - present)[:2]),
                 *(f"{r['what']}: {r['error']}" for r in crashes[:2]), *(r["error"] for r in failed[:2]),
                 *(f"fsck: {p.kind} {p.path}: {p.detail}" for p in report.problems[:2])]
    row.seconds = time.perf_counter() - start
    return row
