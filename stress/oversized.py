"""Denial of service from one capture, on the repo and load side (issue 35, items 6 and 8).

* **oversized metadata and pack headers**: a ``capture.json``, a name's index head and log, an
  alias, the layout marker and a report grown to hundreds of MiB (sparse files: nothing is written),
  and a pack whose header lists a million members; every consumer (load and use each version, list,
  fsck, gc, reports) runs in a forked child with 512 MiB of address space over what it starts with
  and 20 s:
  **survived** means it refused what is too large in one line, at no cost but a ``stat``, and kept
  serving the rest; **wrong** counts errors that are not modulelens's own or not one line, and
  versions that stopped loading their stored values.
* **junk name folders**: 100,000 (``--quick``: 20,000) folders planted under ``names/`` of a local
  repo and of a ``memory://`` one; **survived**: the listing shows the one real version within
  1 s + 50 us per folder (it read and scanned each: 25 s local, 27 s on memory:// for 10,000).
* **gigantic shape-only tensors**: a shape-only input recorded with shapes of up to 2**49 elements,
  loaded with ``synthesize=True`` in a forked child (512 MiB of address space over its start):
  **survived**: a one-line ``RestoreError`` naming the tensor, and a replay that reports instead of
  crashing; **wrong**: torch's raw allocator error, a ``MemoryError`` or a killed process.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import shutil
import signal
import struct
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

import modulelens
from modulelens.errors import ModulelensError, RestoreError
from modulelens.format.hashing import hash_bytes
from stress.table import Row

_CTX = multiprocessing.get_context("fork")
_BUDGET = 512 << 20  # bytes of address space a case may add
_CASE_S = 20


def _vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _forked(work: Callable[[], list[str]]) -> tuple[str, list[str]]:
    """Run ``work`` in a forked child under the memory budget and the time limit: ``("ok", issues)``,
    or ``("crash"/"hang", [why])``."""
    reader, writer = os.pipe()

    def child() -> None:
        os.close(reader)
        status, issues = "ok", []
        try:
            limit = _vm_size() + _BUDGET
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            signal.alarm(_CASE_S)
            warnings.simplefilter("ignore")
            issues = work()
        except BaseException as error:  # (SystemExit from the alarm's default action cannot be caught)
            frame = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
            where = f" ({Path(frame.filename).name}:{frame.lineno})" if frame else ""
            status, issues = "crash", [f"{type(error).__name__}: {str(error)[:120]}{where}"]
        os.write(writer, json.dumps([status, issues]).encode())
        os._exit(0)

    process = _CTX.Process(target=child)
    process.start()
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        data = pipe.read()
    process.join()
    if not data:
        return ("hang" if process.exitcode == -signal.SIGALRM else "crash"), [f"the child ended with {process.exitcode}"]
    status, issues = json.loads(data)
    return status, issues


def _one_line(error: BaseException) -> str | None:
    """Why ``error`` is not an acceptable refusal: not modulelens's own, or not one line."""
    if not isinstance(error, ModulelensError):
        return f"{type(error).__name__}: {str(error)[:100]}"
    if "\n" in str(error):
        return f"a refusal of several lines: {str(error)[:100]}"
    return None


def _grow(path: Path, size: int) -> None:
    os.chmod(path, 0o644)
    with open(path, "r+b") as handle:
        handle.truncate(size)


# ------------------------------------------------------------------------------------ oversized files


def _million_member_pack(members: int) -> bytes:
    """A well-formed pack whose header lists ``members`` one-byte members (an old modulelens could
    write one: 64 MiB of 1-byte tensors)."""
    start = (8 + 100 * members + 63) // 64 * 64
    header = json.dumps({"format": "modulelens.pack", "version": 1,
                         "members": {f"{i:064x}": [start + 64 * i, 1] for i in range(members)}},
                        separators=(",", ":")).encode()
    assert len(header) <= start - 8
    body = bytearray(start + 64 * members)
    body[:8] = struct.pack("<Q", start - 8)
    body[8:start] = header.ljust(start - 8)
    return bytes(body)


def _consumers(root: Path, originals: dict[str, dict[str, torch.Tensor]]) -> list[str]:
    """Every consumer on the repo at ``root``: what went wrong (refusals of what is too large are fine)."""
    issues = []
    for ref, original in originals.items():
        try:
            cap = modulelens.load(ref, repo=root, verify=True)
            values = {tid: cap.fresh_tensor(tid) for tid, e in cap.metadata["tensors"].items() if not e.get("shape_only")}
            if values.keys() != original.keys() or not all(torch.equal(values[k], original[k]) for k in values):
                issues.append(f"{ref}: loads other values")
        except Exception as error:
            problem = _one_line(error)
            if problem:
                issues.append(f"load {ref}: {problem}")
    for label, run in (("list", lambda: modulelens.Repo(root).list()), ("fsck", lambda: modulelens.Repo(root).fsck()),
                       ("gc", lambda: modulelens.Repo(root).gc(dry_run=True)),
                       ("reports", lambda: modulelens.Repo(root).reports("lin:v1"))):
        try:
            run()
        except Exception as error:
            problem = _one_line(error)
            if problem:
                issues.append(f"{label}: {problem}")
    return issues


def _oversized_cases(template: Path) -> dict[str, Callable[[Path], None]]:
    def pack(root: Path) -> None:
        data = _million_member_pack(1_000_000)
        digest = hash_bytes(data)
        modulelens.Repo(root).write_blob(digest, data)
        path = root / "names/lin/versions/2/capture.json"
        meta = json.loads(path.read_bytes())
        meta["packs"][0] = {"payload": digest, "nbytes": len(data)}
        _grow(path, 0)
        path.write_text(json.dumps(meta))

    def head_log(root: Path) -> None:
        folder = root / "names/lin"
        head = json.loads((folder / "summary.json").read_bytes())
        _grow(folder / f"summary-{head['log']}.log", 600 << 20)

    return {
        "capture.json of 600 MiB": lambda root: _grow(root / "names/lin/versions/2/capture.json", 600 << 20),
        "an index head of 600 MiB": lambda root: _grow(root / "names/lin/summary.json", 600 << 20),
        "an index log of 600 MiB": head_log,
        "an alias of 1 GiB": lambda root: _grow(root / "names/lin/aliases/golden", 1 << 30),
        "the layout marker of 1 GiB": lambda root: _grow(root / "modulelens-repo.json", 1 << 30),
        "a report of 1 GiB": lambda root: _grow(root / "names/lin/versions/1/reports/verify-big.json", 1 << 30),
        "a pack header of a million members": pack,
    }


def oversized_row(tmp: Path) -> Row:
    row = Row("oversized metadata (capture.json, index, alias, marker, report) and a million-member pack header")
    start = time.perf_counter()
    warnings.simplefilter("ignore")
    template = tmp / "oversized-template"
    repo = modulelens.Repo(template)
    for _ in range(2):
        module = torch.nn.Linear(4, 4)
        torch.manual_seed(0)
        with modulelens.capture(module, targets="", repo=repo, name="lin"):
            module(torch.ones(2, 4))
    repo.set_alias("lin:v1", "golden")
    report = Path(repo.add_report("lin:v1", "profile", {"ok": True}))
    report.with_name("verify-big.json").write_bytes(b"{}")
    originals = {}
    for ref in ("lin:v1", "lin:v2"):
        cap = modulelens.load(ref, repo=template)
        originals[ref] = {tid: cap.fresh_tensor(tid) for tid in cap.metadata["tensors"]}
    for label, plant in _oversized_cases(template).items():
        row.tried += 1
        folder = tmp / f"oversized-{label.replace(' ', '-')}"
        shutil.copytree(template, folder)
        plant(folder)
        damaged = {"lin:v2"} if "capture.json" in label or "pack" in label else set()
        intact = {ref: values for ref, values in originals.items() if ref not in damaged}
        status, issues = _forked(lambda folder=folder, intact=intact, damaged=damaged: _consumers(folder, intact)
                                 + _refused(folder, damaged))
        row.survived += status == "ok"
        row.wrong += bool(issues) and status == "ok"
        row.notes.extend(f"{label}: {status}: {issue}" for issue in issues[:1])
        shutil.rmtree(folder, ignore_errors=True)
    row.seconds = time.perf_counter() - start
    return row


def _refused(root: Path, damaged: set[str]) -> list[str]:
    """A damaged version is refused in one line (never loaded, never a crash)."""
    issues = []
    for ref in damaged:
        try:
            cap = modulelens.load(ref, repo=root)
            cap.state_dict(0)
            issues.append(f"{ref} loaded")
        except Exception as error:
            problem = _one_line(error)
            if problem:
                issues.append(f"load {ref}: {problem}")
    return issues


# ------------------------------------------------------------------------------------ junk names


def junk_names_row(tmp: Path, count: int) -> Row:
    row = Row(f"{count:,} junk folders under names/ (local and memory://): ls lists the real names")
    start = time.perf_counter()
    warnings.simplefilter("ignore")
    bound = 1.0 + 50e-6 * count
    local = modulelens.Repo(tmp / "junk-local")
    url = f"memory://stress-junk-{time.monotonic_ns()}"
    for repo in (local, url):
        module = torch.nn.Linear(2, 2)
        with modulelens.capture(module, targets="", repo=repo, name="real") as cap:
            module(torch.ones(1, 2))
        cap.wait()
    for index in range(count):
        (local.root / "names" / f"junk{index}").mkdir()
    import fsspec

    fsspec.filesystem("memory").pipe({f"/{url.removeprefix('memory://')}/names/junk{i}/x": b"" for i in range(count)})
    for label, location in (("local", str(local.root)), ("memory://", url)):
        row.tried += 1
        began = time.perf_counter()
        try:
            listed = [i.ref for i in modulelens.Repo(location).list()]
        except Exception as error:
            row.notes.append(f"{label}: {type(error).__name__}: {str(error)[:100]}")
            continue
        took = time.perf_counter() - began
        row.survived += took <= bound
        row.wrong += listed != ["real:v1"]
        row.notes.append(f"{label} {took:.2f} s (bound {bound:.1f} s)" + ("" if listed == ["real:v1"] else f": {listed[:3]}"))
    row.seconds = time.perf_counter() - start  # (the folders stay: removing them costs ~5 ms each here)
    return row


# ------------------------------------------------------------------------------------ gigantic shapes

SHAPES: list[tuple[str, list[int]]] = [
    ("float32", [1 << 40, 4]), ("float16", [1 << 45]), ("int64", [1 << 41]), ("bool", [1 << 47]),
    ("complex64", [1 << 40]), ("bfloat16", [1 << 30, 1 << 14]), ("float64", [1 << 49]),
]


def _gigantic_case(root: Path, dtype: str, shape: list[int]) -> list[str]:
    path = root / "names/lin/versions/1/capture.json"
    meta = json.loads(path.read_bytes())
    tid = meta["calls"][0]["inputs"]["leaves"][0]["id"]
    meta["tensors"][tid].update(dtype=dtype, shape=shape, stride=[*([1] * (len(shape) - 1)), 1])
    meta["tensors"][tid]["stats"] = {"min": 0, "max": 1, "mean": 0.0, "std": 1.0, "fraction_true": 0.5}
    _grow(path, 0)
    path.write_text(json.dumps(meta))
    cap = modulelens.load("lin", repo=root, synthesize=True)
    try:
        cap.calls[0].args  # noqa: B018 - draws the synthetic input
    except RestoreError as error:
        if "\n" in str(error) or "lin:v1/t" not in str(error):
            return [f"{dtype}{shape}: {str(error)[:100]}"]
    except Exception as error:
        return [f"{dtype}{shape}: {type(error).__name__}: {str(error)[:100]}"]
    else:
        return [f"{dtype}{shape}: drawn"]
    try:
        cap.replay()
    except ModulelensError:
        pass
    except Exception as error:
        return [f"{dtype}{shape}: replay: {type(error).__name__}: {str(error)[:100]}"]
    return []


def gigantic_shapes_row(tmp: Path) -> Row:
    row = Row("gigantic shape-only tensors loaded with synthesize=True (up to 2**49 elements)")
    start = time.perf_counter()
    warnings.simplefilter("ignore")
    template = tmp / "gigantic-template"
    module = torch.nn.Linear(4, 4)
    with modulelens.capture(module, targets="", repo=template, name="lin",
                            payload=modulelens.PayloadPolicy(shape_only_over=0)):
        module(torch.randn(2, 4))
    for index, (dtype, shape) in enumerate(SHAPES):
        row.tried += 1
        folder = tmp / f"gigantic-{index}"
        shutil.copytree(template, folder)
        status, issues = _forked(lambda folder=folder, dtype=dtype, shape=shape: _gigantic_case(folder, dtype, shape))
        row.survived += status == "ok"
        row.wrong += bool(issues) and status == "ok"
        row.notes.extend(f"{status}: {issue}" for issue in issues[:1])
        shutil.rmtree(folder, ignore_errors=True)
    row.seconds = time.perf_counter() - start
    return row
