"""gc is not starved by saves running back to back (issue 12): the repo lock has a turnstile."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from child_process import PYTHON, SUPPORT_DIR, subprocess_env

import modulelens


def test_gc_finishes_while_processes_save_back_to_back(tmp_path: Path) -> None:
    # Four savers keep the shared lock held without a gap (measured: before the turnstile, gc was
    # still waiting after 100 s; with it, gc takes well under a second).
    root = tmp_path / "repo"
    stop = tmp_path / "stop"
    modulelens.Repo(root)
    savers = [subprocess.Popen([PYTHON, str(SUPPORT_DIR / "busy_saver.py"), str(root), f"n{i}", str(stop)],
                               stdout=subprocess.PIPE, text=True, env=subprocess_env()) for i in range(4)]
    try:
        for saver in savers:
            assert saver.stdout.readline().strip() == "saving"
        time.sleep(1.0)
        start = time.perf_counter()
        report = modulelens.Repo(root).gc(tmp_age_s=0)
        took = time.perf_counter() - start
    finally:
        stop.touch()
        counts = [int(saver.communicate(timeout=120)[0].strip() or 0) for saver in savers]
    assert took < 20, f"gc waited {took:.1f} s for back-to-back saves"
    assert report.kept_blobs > 0 and all(count > 0 for count in counts)
    # gc in the middle of the saves lost none of them (plus each saver's first capture), and freed nothing
    assert len(modulelens.Repo(root).list()) == sum(counts) + len(savers)
    assert report.removed_blobs == 0
