"""A name's index that lies (issue 35, items 2 and 9), each case on a fresh copy of a small repo.

* **index lies, then gc**: the blob lists of a name's index made wrong while its JSON stays valid
  (one hex digit flipped, as bit rot does; lists emptied; an entry dropped; another version's list;
  on object storage the head's entries, its checksum made to match, as a received repo's can be),
  then ``gc``: **lost** counts versions that no longer load their stored values (``verify=True``),
  before and after ``fsck --repair``; **wrong** counts gc runs that freed anything a version uses.
* **forged index heads**: ``used = 10**30``, ``-5``, a bool, a float, a string, ``latest`` above
  ``used``, aliases, reservations and removals out of range, ``log_bytes``/``log`` out of range,
  a log line above ``used``, a version folder beyond the highest number; **wrong** counts listings
  that differ from the folders, a latest or alias resolved wrongly, a next save that is not the next
  number, an fsck that does not name the head, and errors other than modulelens's own.
"""

from __future__ import annotations

import json
import shutil
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import xxhash

import modulelens
from modulelens.errors import ModulelensError
from stress.table import Row

Lie = Callable[[Path, str], None]


def _save(repo: modulelens.Repo, name: str, width: int = 4) -> str:
    torch.manual_seed(0)
    module = torch.nn.Linear(width, 4)
    with modulelens.capture(module, targets="", repo=repo, name=name) as cap:
        module(torch.ones(2, width))
    return (cap.wait() if repo.is_remote else cap.saved)[0].ref


def _values(repo: modulelens.Repo | str, ref: str) -> dict[str, torch.Tensor]:
    cap = modulelens.load(ref, repo=repo, verify=True)
    return {tid: cap.fresh_tensor(tid) for tid, entry in cap.metadata["tensors"].items() if not entry.get("shape_only")}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def forge_head(raw: bytes, **changes: Any) -> bytes:
    """An index head with ``changes``, its checksum made to match (as a received repo's can be)."""
    data = json.loads(raw)
    data.pop("check")
    data.update(changes)
    body = json.dumps(data, separators=(",", ":")).encode()[1:]
    return b'{"check":"' + xxhash.xxh3_64_hexdigest(body).encode() + b'",' + body


def _flip(digest: str) -> str:
    hexdigest = digest.partition(":")[2]
    return "blake3:" + hexdigest[:10] + ("0" if hexdigest[10] != "0" else "1") + hexdigest[11:]


def _rewrite_log(folder: Path, edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> None:
    head = json.loads((folder / "summary.json").read_bytes())
    log = folder / f"summary-{head['log']}.log"
    lines = edit([json.loads(line) for line in log.read_bytes().splitlines()])
    data = b"".join(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines)
    log.write_bytes(data)
    (folder / "summary.json").write_bytes(forge_head((folder / "summary.json").read_bytes(), log_bytes=len(data),
                                                     count=len(lines)))


def _each_line(change: Callable[[dict[str, Any]], None]) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    def edit(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for line in lines:
            change(line)
        return lines
    return edit


def _flip_first_blob(line: dict[str, Any]) -> None:
    line["blobs"] = [_flip(line["blobs"][0]), *line["blobs"][1:]]


def _empty(line: dict[str, Any]) -> None:
    line["blobs"] = []


def _local_lie(edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> Lie:
    def lie(root: Path, name: str) -> None:
        _rewrite_log(root / "names" / name, edit)
    return lie


def _swapped_lists(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for line in lines:
        line["blobs"] = ["blake3:" + "0" * 64]
    return lines


LOCAL_LIES: dict[str, Lie] = {
    "a hex digit flipped in each entry": _local_lie(_each_line(_flip_first_blob)),
    "blob lists emptied": _local_lie(_each_line(_empty)),
    "the first entry dropped": _local_lie(lambda lines: lines[1:]),
    "every entry dropped": _local_lie(lambda lines: []),
    "blob lists naming another blob": _local_lie(_swapped_lists),
}


def _case_dir(tmp: Path, label: str) -> Path:
    return tmp / label.replace(" ", "-").replace("/", "-")


def _judge_gc(repo: modulelens.Repo | str, originals: dict[str, dict[str, torch.Tensor]], row: Row, label: str,
              repair: bool) -> None:
    """After a lie and gc: every version loads its stored values (else lost), before and after repair."""
    rounds = ["after gc", "after fsck --repair"] if repair else ["after gc"]
    for when in rounds:
        if when == "after fsck --repair":
            modulelens.Repo(repo).fsck(repair=True)
        for ref, original in originals.items():
            try:
                ok = _same(_values(repo, ref), original)
            except ModulelensError as error:
                ok = False
                row.notes.append(f"{label}: {ref} {when}: {type(error).__name__}: {str(error)[:100]}")
            if not ok:
                row.lost += 1
                return


def index_lies_row(tmp: Path) -> Row:
    row = Row("index lies (blob lists, entries, object-store heads), then gc: versions keep loading")
    start = time.perf_counter()
    warnings.simplefilter("ignore")
    template = tmp / "index-lies-template"
    repo = modulelens.Repo(template)
    refs = [_save(repo, "lin"), _save(repo, "lin"), _save(repo, "big", 512 * 1024)]  # a shared pack; a 2 MiB weight
    originals = {ref: _values(repo, ref) for ref in refs}
    freed = 0
    for label, lie in LOCAL_LIES.items():
        row.tried += 1
        folder = _case_dir(tmp, f"lie-{label}")
        shutil.copytree(template, folder)
        try:
            for name in ("lin", "big"):
                lie(folder, name)
            report = modulelens.Repo(folder).gc()
            freed += report.removed_blobs
            row.wrong += report.removed_blobs > 0
            _judge_gc(folder, originals, row, label, repair=True)
            row.survived += 1
        except Exception as error:
            row.notes.append(f"{label}: {type(error).__name__}: {str(error)[:120]}")
    for label, change in (("an object-store head's lists emptied", _empty),
                          ("a hex digit flipped in an object-store head", _flip_first_blob)):
        row.tried += 1
        try:
            url = f"memory://stress-index-lies-{time.monotonic_ns()}"
            remote = modulelens.Repo(url)
            remote_refs = [_save(remote, "lin"), _save(remote, "lin")]
            import fsspec

            memory = fsspec.filesystem("memory")
            key = f"/{url.removeprefix('memory://')}/names/lin/summary.json"
            head = json.loads(memory.cat_file(key))
            versions = head["versions"]
            for entry in versions.values():
                change(entry)
            memory.pipe_file(key, forge_head(memory.cat_file(key), versions=versions))
            report = modulelens.Repo(url).gc(grace_s=0)
            freed += report.removed_blobs
            row.wrong += report.removed_blobs > 0
            _judge_gc(url, {ref: originals["lin:v1"] for ref in remote_refs}, row, label, repair=False)
            row.survived += 1
        except Exception as error:
            row.notes.append(f"{label}: {type(error).__name__}: {str(error)[:120]}")
    row.notes.insert(0, f"{freed} blobs freed that a version uses")
    row.seconds = time.perf_counter() - start
    return row


# ------------------------------------------------------------------------------------ forged heads

FORGED: list[dict[str, Any]] = [
    {"used": 10**30}, {"used": -5}, {"used": True}, {"used": 1.5}, {"used": "7"}, {"used": None}, {"latest": 9},
    {"latest": -1}, {"aliases": {"golden": 10**30}}, {"aliases": {"golden": -4}}, {"aliases": []},
    {"removing": [0]}, {"removing": [10**30]}, {"reserved": {"99999999999": {"by": "x", "at": 0}}},
    {"reserved": {"-1": {}}}, {"log_bytes": 10**15}, {"log_bytes": -1}, {"log": -1}, {"log": 10**30},
    {"count": None}, {"dead": -3}, {"changing": {"golden": 5}},
]


def _forged_case(folder: Path, plant: Callable[[Path], None], label: str) -> str | None:
    """Plant a forged head in a repo of lin:v1, lin:v2 and alias golden -> v1; what went wrong."""
    repo = modulelens.Repo(folder)
    _save(repo, "lin")
    _save(repo, "lin")
    repo.set_alias("lin:v1", "golden")
    plant(folder / "names" / "lin")
    fresh = modulelens.Repo(folder)
    named = any(p.kind in ("summary", "foreign") for p in fresh.fsck().problems)
    listed = [i.ref for i in fresh.list()]
    if listed != ["lin:v1", "lin:v2"]:
        return f"listed {listed}"
    if fresh.resolve("lin") != ("lin", 2) or fresh.resolve("lin:golden") != ("lin", 1):
        return f"resolved latest {fresh.resolve('lin')}, golden {fresh.resolve('lin:golden')}"
    saved = _save(fresh, "lin")
    if saved != "lin:v3":
        return f"the next save is {saved[:60]}"
    # a save rewrites the head, not the log (a writer only appends): gc stores a rebuilt index
    modulelens.Repo(folder).gc()
    left = [p for p in modulelens.Repo(folder).fsck().problems if p.kind != "foreign"]  # (a folder 10**30 stays foreign)
    if left:
        return f"fsck after a save and gc: {left[0].detail[:80]}"
    return None if named else "fsck did not name the forged head"


def _head_plant(changes: dict[str, Any]) -> Callable[[Path], None]:
    def plant(name_folder: Path) -> None:
        head = name_folder / "summary.json"
        head.write_bytes(forge_head(head.read_bytes(), **changes))
    return plant


def _log_line_above_used(name_folder: Path) -> None:
    def edit(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        lines[-1]["v"] = 10**12
        return lines
    _rewrite_log(name_folder, edit)


def _folder_beyond(name_folder: Path) -> None:
    (name_folder / "versions" / str(10**30)).mkdir()
    (name_folder / "summary.json").unlink()  # listing and saving scan the folders


def forged_heads_row(tmp: Path) -> Row:
    row = Row("forged index heads (used 10**30 / -5, out-of-range fields, log lines, folders): rebuilt from the folders")
    start = time.perf_counter()
    warnings.simplefilter("ignore")
    cases = [(f"head {json.dumps(c)[:40]}", _head_plant(c)) for c in FORGED]
    cases += [("a log line above used", _log_line_above_used), ("a version folder 10**30", _folder_beyond)]
    for index, (label, plant) in enumerate(cases):
        row.tried += 1
        try:
            problem = _forged_case(tmp / f"forged-{index}", plant, label)
        except ModulelensError as error:
            problem = f"{type(error).__name__}: {str(error)[:100]}"
        except Exception as error:
            frame = traceback.extract_tb(error.__traceback__)[-1]
            row.notes.append(f"{label}: {type(error).__name__}: {str(error)[:80]} ({Path(frame.filename).name}:{frame.lineno})")
            row.wrong += 1
            continue
        row.survived += 1
        if problem is not None:
            row.wrong += 1
            row.notes.append(f"{label}: {problem}")
    row.seconds = time.perf_counter() - start
    return row
