"""gc is not starved by saves running back to back (issue 12): the repo lock has a turnstile."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

import torch
from busy_saver import save_until
from torch import nn

import modulelens


def test_gc_finishes_while_processes_save_back_to_back(tmp_path: Path) -> None:
    # Four savers keep the shared lock held without a gap (measured: before the turnstile, gc was
    # still waiting after 100 s; with it, gc takes well under a second).
    root, stop = tmp_path / "repo", tmp_path / "stop"
    module = nn.Linear(1024, 1024)  # a 4 MiB weight: each save holds the lock while it writes it
    with modulelens.capture(module, targets="Linear", repo=root, name="template", strict=True) as cap:
        module(torch.randn(2, 1024))
    ready = [str(tmp_path / f"ready-{i}") for i in range(4)]
    context = multiprocessing.get_context("fork")  # torch is imported already: a saver starts at once
    savers = [context.Process(target=save_until, args=(str(root), f"n{i}", str(stop), cap.saved[0].ref, ready[i]))
              for i in range(4)]
    for saver in savers:
        saver.start()
    try:
        deadline = time.monotonic() + 60
        while not all(Path(r).exists() for r in ready) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        reports: list[modulelens.repo.GcReport] = []
        gc = threading.Thread(target=lambda: reports.append(modulelens.Repo(root).gc(tmp_age_s=0)))
        gc.start()
        gc.join(20)  # the bound; a starved gc finishes only once the savers stop
    finally:
        stop.touch()
        for saver in savers:
            saver.join(120)
    assert reports, "gc was still waiting after 20 s of back-to-back saves"
    gc.join()
    report = reports[0]
    counts = [int(Path(r + ".count").read_text()) for r in ready]
    assert all(count > 0 for count in counts)
    # gc in the middle of the saves lost none of them (plus the template), and freed nothing
    assert len(modulelens.Repo(root).list()) == sum(counts) + 1
    assert report.removed_blobs == 0
