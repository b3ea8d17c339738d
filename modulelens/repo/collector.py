"""Pausing Python's cyclic garbage collector around work that makes many objects and no cycles.

A listing of thousands of versions or the encoding of a capture of thousands of tensors makes a
few container objects per item, alive until the work ends: with the collector on, that set off
young collections and, in a process that imported torch, full collections of everything the job
holds (a quarter of a 5,000-tensor save, a third of listing 1,000 versions: benchmarks/bench_repo.py,
benchmarks/bench_scale.py). Nothing such work makes forms a cycle, so pausing collects nothing later
that it would have collected now; what dies is freed by reference counting as usual.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Within the block the cyclic collector does not run (one the caller disabled stays so)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
