"""Fuzzed metadata and damaged payloads: only modulelens errors, no hang, no wrong tensor.

A forked child (address space capped with ``RLIMIT_AS``) loads each damaged capture under a
``SIGALRM`` timeout and touches what a user would: the module, every call's inputs and output,
every recorded tensor. ``wrong``: a load that succeeded but returned a tensor whose metadata entry
was not changed and whose value differs from the original, or one that differs from its own entry's
dtype and shape, or any value after its payload was damaged.
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import random
import resource
import shutil
import signal
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

import modulelens
from modulelens.errors import ModulelensError
from modulelens.repo.packs import referenced_blobs
from stress.table import Row

_CTX = multiprocessing.get_context("fork")
TIMEOUT_S = 10
MEMORY_BYTES = 6 << 30


class Block(torch.nn.Module):
    """A module with nested modules, tuple/dict/dtype arguments and keyword/view inputs."""

    def __init__(self, width: int, scale: tuple[float, float] = (1.0, 2.0), act: torch.nn.Module | None = None,
                 opts: dict[str, Any] | None = None, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width, dtype=dtype)
        self.norm = torch.nn.LayerNorm(width)
        self.act = act or torch.nn.GELU()
        self.scale = scale
        self.register_buffer("steps", torch.zeros(2, dtype=torch.int64))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, *, mask: torch.Tensor | None = None) -> Any:
        out = self.act(self.norm(self.lin(x))) * self.scale[0]
        if y is not None:
            out = out + y.sum()
        return {"out": out, "parts": (out.mean(), mask)}


def make_base(root: Path) -> tuple[modulelens.Repo, str]:
    repo = modulelens.Repo(root)
    with modulelens.track_init():
        model = torch.nn.Sequential(Block(8, act=torch.nn.SiLU(), opts={"k": [1, 2]}))
    base = torch.randn(40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with modulelens.capture(model, targets=["0"], repo=repo, name="fuzz", record=modulelens.Recording(max_calls=2)) as cap:
            for _ in range(2):
                model[0](torch.randn(3, 8), base[4:28].view(3, 8), mask=base[:6] > 0)
    return repo, cap.saved[0].ref


# ---------------------------------------------------------------------------------- mutations

_ODD = [None, True, False, 0, -1, 1, 2 ** 31, 2 ** 63, 2 ** 80, -2 ** 40, 1.5, float("1e308"), "", "x", "t0",
        "float32", "int8", "bool", "torch:relu", "os:system", [], [0], [-1], [2 ** 40] * 3, {}, {"$type": "tensor"},
        {"$type": "tensor", "id": "t0"}, {"$type": "module", "ref": "m0"}, {"$type": "nope"}]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found.extend(_paths(value, (*prefix, key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_paths(value, (*prefix, i)))
    return found


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        node = node[key]
    return node


def mutate(meta: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A damaged copy of ``meta``: one to three random edits, half of them in the tensor table."""
    meta = copy.deepcopy(meta)
    focus = rng.random()
    paths = _paths(meta["tensors"], ("tensors",)) if focus < 0.5 else _paths(meta)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        path = rng.choice(paths[1:])
        parent, key = _get(meta, path[:-1]), path[-1]
        value = parent[key]
        kind = rng.random()
        if kind < 0.35:
            parent[key] = rng.choice(_ODD)
        elif kind < 0.5 and isinstance(parent, dict):
            del parent[key]
        elif kind < 0.7 and isinstance(value, int) and not isinstance(value, bool):
            parent[key] = rng.choice((value + 1, value - 1, value * 2, value // 2, 0, -value, value + 2 ** 40))
        elif kind < 0.8 and isinstance(value, str):
            parent[key] = rng.choice((value[:-1], value + "0", value.upper(), "t" + str(rng.randrange(40)),
                                      rng.choice(("float16", "int64", "uint8", "complex64", "bfloat16"))))
        elif kind < 0.9 and isinstance(value, list) and value:
            rng.shuffle(value) if rng.random() < 0.5 else value.pop()
        else:
            parent[key] = json.loads("[" * 200 + "]" * 200) if rng.random() < 0.2 else [value, value]
        paths = _paths(meta)
        if not paths[1:]:
            break
    return meta


# ---------------------------------------------------------------------------------- probing

class _TimeoutError(Exception):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise _TimeoutError()


def _touch(repo: modulelens.Repo, ref: str) -> dict[str, torch.Tensor]:
    cap = modulelens.load(ref, repo=repo)
    _ = cap.module
    for call in cap.calls:
        _ = (call.args, call.kwargs, call.output)
    return {tid: cap.fresh_tensor(tid) for tid in cap.metadata["tensors"]
            if not cap.metadata["tensors"][tid].get("shape_only")}


def _judge(loaded: dict[str, torch.Tensor], meta: dict[str, Any], original: dict[str, torch.Tensor],
           touched: set[str], payload_damaged: bool) -> str | None:
    for tid, tensor in loaded.items():
        entry = meta["tensors"][tid]
        if str(tensor.dtype).removeprefix("torch.") != entry["dtype"] or list(tensor.shape) != entry["shape"]:
            return f"{tid}: loaded {tensor.dtype} {list(tensor.shape)} for an entry of {entry['dtype']} {entry['shape']}"
        if (payload_damaged or tid not in touched) and tid in original and not torch.equal(tensor, original[tid]):
            return f"{tid}: value differs from what was stored"
    return None


def _child(root: str, ref: str, cases: list[tuple[str, Any]], out: str, start: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    signal.signal(signal.SIGALRM, _alarm)
    warnings.simplefilter("ignore")
    repo = modulelens.Repo(root)
    name, version = repo.resolve(ref)
    meta_path = repo.version_path(name, version) / "capture.json"
    pristine = meta_path.read_bytes()
    original = _touch(repo, ref)
    meta0 = json.loads(pristine)
    handle = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for index in range(start, len(cases)):
        kind, payload = cases[index]
        os.write(handle, (json.dumps({"i": index, "status": "start"}) + "\n").encode())
        restore = _apply(repo, meta_path, kind, payload)
        signal.alarm(TIMEOUT_S)
        status, detail = "ok", ""
        try:
            loaded = _touch(repo, ref)
            meta = json.loads(meta_path.read_bytes())
            touched = {t for t in meta["tensors"] if meta["tensors"][t] != meta0["tensors"].get(t)}
            wrong = _judge(loaded, meta, original, touched, kind != "metadata")
            status, detail = ("wrong", wrong) if wrong else ("ok", "")
        except _TimeoutError:
            status = "hang"
        except ModulelensError as error:
            status, detail = "refused", type(error).__name__
        except Exception as error:
            frame = traceback.extract_tb(error.__traceback__)[-1]
            status, detail = "crash", (f"{type(error).__name__}: {str(error)[:120]} "
                                       f"({Path(frame.filename).name}:{frame.lineno})")
        finally:
            signal.alarm(0)
            restore()
        os.write(handle, (json.dumps({"i": index, "status": status, "detail": detail}) + "\n").encode())
    os._exit(0)


def _apply(repo: modulelens.Repo, meta_path: Path, kind: str, payload: Any) -> Any:
    """Damage the capture; returns a function that undoes it."""
    if kind == "metadata":
        pristine = meta_path.read_bytes()
        meta_path.write_bytes(payload)
        return lambda: meta_path.write_bytes(pristine)
    blob, other, offset = payload
    blob, other = Path(blob), Path(other)
    backup = blob.with_name(blob.name + ".bak")
    shutil.copy2(blob, backup)
    blob.chmod(0o644)
    info = blob.stat()
    if kind == "flip":
        with open(blob, "r+b") as handle:
            handle.seek(offset % max(info.st_size, 1))
            byte = handle.read(1) or b"\0"
            handle.seek(offset % max(info.st_size, 1))
            handle.write(bytes([byte[0] ^ (1 << (offset % 8))]))
        os.utime(blob, ns=(info.st_atime_ns, info.st_mtime_ns))  # bit rot keeps the mtime
    elif kind == "truncate":
        os.truncate(blob, offset % max(info.st_size, 1))
    elif kind == "missing":
        blob.unlink()
    elif kind == "swap":
        shutil.copyfile(other, blob)
    elif kind == "extend":
        with open(blob, "ab") as handle:
            handle.write(b"\0" * (1 + offset % 64))

    def restore() -> None:
        os.replace(backup, blob)
        marker = blob.with_name(blob.name + ".ok")
        marker.unlink(missing_ok=True)  # its next load re-hashes and re-marks the restored blob
    return restore


def _run_cases(root: Path, ref: str, cases: list[tuple[str, Any]], out: Path) -> list[dict[str, Any]]:
    start = 0
    results: dict[int, dict[str, Any]] = {}
    while start < len(cases):
        proc = _CTX.Process(target=_child, args=(str(root), ref, cases, str(out), start))
        proc.start()
        proc.join()
        records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
        for r in records:
            if r["status"] != "start":
                results[r["i"]] = r
        started = [r["i"] for r in records if r["status"] == "start"]
        last = max(started, default=start - 1)
        if proc.exitcode != 0 and last not in results:  # the child died on this case
            results[last] = {"i": last, "status": "crash", "detail": f"process died (exit {proc.exitcode})"}
        start = last + 1
    return [results[i] for i in sorted(results)]


def _row(name: str, results: list[dict[str, Any]], seconds: float) -> Row:
    row = Row(name, tried=len(results), seconds=seconds)
    counts: dict[str, int] = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    row.survived = counts.get("ok", 0) + counts.get("refused", 0) + counts.get("wrong", 0)
    row.wrong = counts.get("wrong", 0)
    row.notes.append(", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    details = [f"{r['status']}: {r['detail']}" for r in results if r["status"] in ("crash", "hang", "wrong")]
    row.notes.extend(sorted(set(details))[:4])
    return row


def fuzz_rows(tmp: Path, metadata_cases: int, payload_cases: int, seed: int = 0) -> list[Row]:
    rng = random.Random(seed)
    repo, ref = make_base(tmp / "fuzz-repo")
    name, version = repo.resolve(ref)
    meta = json.loads((repo.version_path(name, version) / "capture.json").read_text())
    text = json.dumps(meta).encode()
    cases: list[tuple[str, Any]] = []
    for i in range(metadata_cases):
        if i % 10 == 9:  # byte-level damage of the JSON text itself
            data = bytearray(text)
            if rng.random() < 0.5:
                data = data[: rng.randrange(len(data))]
            else:
                for _ in range(rng.randint(1, 4)):
                    data[rng.randrange(len(data))] = rng.randrange(256)
            cases.append(("metadata", bytes(data)))
        else:
            cases.append(("metadata", json.dumps(mutate(meta, rng)).encode()))
    start = time.perf_counter()
    rows = [_row("fuzzed metadata files", _run_cases(tmp / "fuzz-repo", ref, cases, tmp / "fuzz-meta.log"),
                 time.perf_counter() - start)]
    blobs = sorted({repo.blob_path(digest) for digest in referenced_blobs(meta)},  # loose payloads and packs
                   key=lambda p: p.stat().st_size)
    big_repo, big_ref = _big_capture(tmp / "fuzz-big")
    big_meta = big_repo.read_metadata(*big_repo.resolve(big_ref))
    big_blobs = [big_repo.blob_path(e["payload"]) for e in big_meta["tensors"].values()
                 if e["nbytes"] >= 1 << 20 and "pack" not in e]
    small, large = [], []
    for _ in range(payload_cases):
        kind = rng.choice(("flip", "flip", "truncate", "missing", "swap", "extend"))
        pool, target = (big_blobs, large) if rng.random() < 0.3 else (blobs, small)
        blob = rng.choice(pool)
        # swap within the same kind of payload when there is another one (a repo with packs may
        # have a single small blob, its pack), else with any other blob
        other = rng.choice([b for b in (*blobs, *big_blobs) if b != blob and (b in pool) == (pool is blobs)]
                           or [b for b in (*blobs, *big_blobs) if b != blob])
        target.append((kind, (str(blob), str(other), rng.randrange(1 << 30))))
    start = time.perf_counter()
    results = _run_cases(tmp / "fuzz-repo", ref, small, tmp / "fuzz-payload.log")
    results += _run_cases(tmp / "fuzz-big", big_ref, large, tmp / "fuzz-payload-big.log")
    rows.append(_row("damaged payloads (flipped with mtime kept, truncated, missing, swapped, extended)", results,
                     time.perf_counter() - start))
    rows[-1].notes.append(f"{len(large)} of them in payloads of 2-4 MiB (marked: a write, mtime kept, changes the ctime a marker records)")
    return rows


def _big_capture(root: Path) -> tuple[modulelens.Repo, str]:
    repo = modulelens.Repo(root)
    with modulelens.track_init():
        model = torch.nn.Sequential(torch.nn.Linear(1024, 768))  # 3 MiB of weights: marked payloads
    with modulelens.capture(model, targets=["0"], repo=repo, name="big") as cap:
        model(torch.randn(2, 1024))
    return repo, cap.saved[0].ref
