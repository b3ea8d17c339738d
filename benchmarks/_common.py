"""Shared helpers for the benchmark scripts: timing, tables, JSON results."""

from __future__ import annotations

import copy
import gc
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

import modulelens
from modulelens.format.human import human_number
from modulelens.repo.collector import collector_paused
from modulelens.repo.layout import SUMMARY_FILE, summary_log

# benchmarks/results, or where run_all.py --quick asks (so a check of the runner keeps the real results)
RESULTS = Path(os.environ.get("MODULELENS_BENCH_RESULTS") or Path(__file__).parent / "results")


class Big(nn.Module):
    """The large-weights model of the save/load and remote benchmarks: ``depth`` x ``Linear(width, width)``
    (importable as ``_common:Big``, so its captures restore without trusting stored source)."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    @staticmethod
    def depth_for(gib: float, width: int) -> int:
        """The depth that gives about ``gib`` GiB of fp32 weights at this width (at least 1)."""
        return max(1, round(gib * (1 << 30) / (4 * (width * width + width))))


def many_versions_repo(root: Path, versions: int, names: int) -> modulelens.Repo:
    """A repo of ``versions`` versions of a small Linear under ``names`` names
    (``team/model<i>/block``), saved through the repo's own save path (hash, pack, commit,
    summary) minus tracing: one real capture is taken, then saved again with new tags."""
    repo = modulelens.Repo(root)
    module = nn.Linear(4, 4)
    with modulelens.capture(module, targets="Linear", repo=repo, name="seed"):
        module(torch.randn(2, 4))
    seed = repo.read_metadata("seed", 1)
    loaded = modulelens.load("seed", repo=repo)
    payloads = {tid: memoryview(loaded.tensor(tid).contiguous().numpy().tobytes())
                for tid, entry in seed["tensors"].items() if entry.get("payload")}
    repo.remove("seed")
    for i in range(versions):
        meta = copy.deepcopy(seed)
        meta["tags"] = [f"run{i}"]
        for entry in meta["tensors"].values():
            entry.pop("pack", None)
        meta.pop("packs", None)
        repo.save_version(f"team/model{i % names}/block", meta, dict(payloads))
    repo.gc()
    return repo


def read_index(root: Path, *, keep: bool = True) -> list[list[dict[str, Any]]]:
    """The floor of listing a repo: read and parse what it stores for a listing (each name's index
    head and its log of entries; docs/repo-layout.md) and hand the entries to the caller, as a
    listing hands its versions. They are kept, as a caller keeps what it read: Python's collector
    then looks at them once when it next runs, as it looks at a listing's (a floor that dropped them
    before returning left that cost to the listing alone: 60-70 ms of ~400 at 100,000 versions).
    The cyclic collector is paused while parsing, as the listing pauses it. ``keep=False``: the floor
    of gc, which keeps nothing of what it read (each name's entries dropped as soon as parsed)."""
    entries = []
    with collector_paused(), os.scandir(root / "names") as names:
        for entry in names:
            head = json.loads(Path(entry.path, SUMMARY_FILE).read_bytes())
            if not head["log"]:
                continue
            log = Path(entry.path, summary_log(head["log"])).read_bytes()[:head["log_bytes"]]
            parsed = json.loads(b"[" + log.rstrip(b"\n").replace(b"\n", b",") + b"]")
            if keep:
                entries.append(parsed)
            del parsed
    return entries


def interleaved(contenders: dict[str, Callable[[], Any]], rounds: int,
                setup: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """Time each contender once per round, rotating the order every round. Garbage left by what ran
    before is collected first (untimed): otherwise whichever contender allocates enough to trigger
    the collector pays for the previous section's garbage (the many-small-tensors capture's)."""
    names = list(contenders)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for label in names[r % len(names):] + names[:r % len(names)]:
            if setup is not None:
                setup(label)
            gc.collect()
            start = time.perf_counter()
            contenders[label]()
            times[label].append(time.perf_counter() - start)
    return times


def fresh_process_env(**extra: str) -> dict[str, str]:
    """The environment of a command timed in a new process: this one's, with Python's bytecode
    cache allowed (and ``extra`` set). pip compiles what it installs, so a user's ``modulelens``
    starts from ``.pyc`` files; this machine sets PYTHONDONTWRITEBYTECODE, under which the editable
    install here compiled modulelens's sources on every run (about 50 ms of an ``ls``). Run each
    command once untimed first: that run writes the cache."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    return {**env, **extra}


def timed(func: Callable[[], Any], repeat: int, setup: Callable[[], Any] | None = None) -> list[float]:
    samples = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        start = time.perf_counter()
        func()
        samples.append(time.perf_counter() - start)
    return samples


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "load_average": list(os.getloadavg()),
            "machine": platform.machine(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def report(name: str, title: str, rows: list[dict[str, Any]], columns: list[str], extra: dict[str, Any]) -> Path:
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*[_fmt(row.get(c)) for c in columns])
    Console().print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), "rows": rows, **extra}, indent=1))
    print(f"wrote {path}")
    return path


def _fmt(value: Any) -> str:
    """Floats through the package's formatter (as the CLI prints them); counts and text as they are."""
    if isinstance(value, float):
        return human_number(value)
    return "" if value is None else str(value)


def median(samples: list[float]) -> float:
    return statistics.median(samples)
