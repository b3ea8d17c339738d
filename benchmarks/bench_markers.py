"""What binding verification markers to a repo and user (issue 21) costs a load, in the same run.

    python benchmarks/bench_markers.py [--mib 64] [--repeat 200]

For one blob of ``--mib`` MiB (64 MiB and more have the largest marker: 1,024 chunk hashes) in a
fresh local repo, with the user's signing key present:

* ``key``: finding the marker key of a repo (reading the user's key, deriving the markers' secret,
  the repo's identity): once per repo opened;
* ``mac``: the HMAC of the marker's record, what a load now checks before trusting a marker;
* ``sampled check``: the whole check a load makes of a large blob with a trusted marker (read the
  marker, its MAC, parse it, hash 8 sampled chunks);
* ``full hash``: what the load does without a trusted marker (a received repo's blob, the first time).

The ratios say what share of the sampled check the MAC is, and how much a trusted marker saves.

Beside a job: the chunk hashes of a weight streamed to the repo are computed on a background thread
while the job runs (tracing/weights.py). A job's thread doing torch ops (``--ops`` matrix products
of a 64 x 768 batch through a 768 x 3,072 weight, one thread) is timed alone, beside a thread
computing the chunk hashes of a 28 MiB weight over and over as the repo does
(``chunk_digests``: it lets the GIL go every few chunks), and beside the same hashes in one plain
loop (python-xxhash holds the GIL while it hashes a 64 KiB chunk); rounds interleaved, ratios to
alone are medians of per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import torch
import xxhash

sys.path.insert(0, str(Path(__file__).parent))
from _common import interleaved, report, timed

from modulelens.format.hashing import hash_bytes
from modulelens.format.provenance import user_key
from modulelens.repo.files import hash_file
from modulelens.repo.markers import (
    MarkerKey,
    chunk_digests,
    chunk_size,
    marker_path,
    sampled_check,
    split_marker,
    write_marker,
)
from modulelens.repo.trust import repo_identity


def _plain_chunk_hashes(data: memoryview) -> list[bytes]:
    """The same chunk hashes as ``chunk_digests``, in one plain loop (the obvious way)."""
    chunk = chunk_size(len(data))
    return [xxhash.xxh3_64_digest(data[i:i + chunk]) for i in range(0, len(data), chunk)]


def beside_a_job(ops: int, rounds: int) -> dict[str, float]:
    """The job's ops alone and beside a thread hashing chunks (module docstring): median time of
    the ops alone, and the median per-round ratios of the others to it."""
    torch.set_num_threads(1)
    weight, batch = torch.randn(3072, 768), torch.randn(64, 768)
    data = memoryview(os.urandom(28 << 20))

    def job() -> None:
        for _ in range(ops):
            torch.mm(batch, weight.t())

    hashing: dict[str, Callable[[memoryview], object]] = {
        "beside chunk_digests": chunk_digests, "beside a plain loop of chunk hashes": _plain_chunk_hashes}
    running: list[Callable[[memoryview], object]] = []  # what the thread hashes with now, if anything
    wanted, idle, stop = threading.Event(), threading.Event(), threading.Event()

    def hash_beside() -> None:
        while not stop.is_set():
            if not wanted.is_set():
                idle.set()
                wanted.wait()
                continue
            idle.clear()
            running[0](data)

    def setup(label: str) -> None:
        if label in hashing:
            running[:] = [hashing[label]]
            idle.clear()
            wanted.set()
        else:
            wanted.clear()
            idle.wait()  # the job is timed alone only once the last hash has ended

    thread = threading.Thread(target=hash_beside, daemon=True)
    thread.start()
    try:
        job()  # warm up
        times = interleaved({"alone": job, **dict.fromkeys(hashing, job)}, rounds, setup)
    finally:
        stop.set()
        wanted.set()
        thread.join()
    result = {"alone_s": statistics.median(times["alone"])}
    for label in hashing:
        result[label] = statistics.median(t / a for t, a in zip(times[label], times["alone"], strict=True))
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--ops", type=int, default=200, help="torch ops of the job timed beside the chunk hashes")
    parser.add_argument("--rounds", type=int, default=9, help="rounds of the job beside the chunk hashes")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ml-bench-markers-"))
    config = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(work / "config")  # a key of this run's own
    try:
        user_key(create=True)
        root = work / "repo"
        root.mkdir()
        data = os.urandom(args.mib << 20)
        blob = root / hash_bytes(data).partition(":")[2]
        blob.write_bytes(data)
        del data

        def key() -> MarkerKey:
            return MarkerKey.derive(user_key(), repo_identity(root))

        marker_key = key()
        write_marker(blob, marker_key)
        record, _, digests = split_marker(marker_path(blob).read_bytes())
        info = os.stat(blob)
        assert sampled_check(blob, info, marker_key) is True
        rows = {
            "key (once per repo)": timed(key, args.repeat),
            "mac of the record": timed(lambda: marker_key.mac(blob.name, record, digests), args.repeat),
            "sampled check (with the mac)": timed(lambda: sampled_check(blob, info, marker_key), args.repeat),
            "full hash (no trusted marker)": timed(lambda: hash_file(blob), max(3, args.repeat // 40)),
        }
    finally:
        if config is None:
            os.environ.pop("XDG_CONFIG_HOME", None)
        else:
            os.environ["XDG_CONFIG_HOME"] = config
        shutil.rmtree(work, ignore_errors=True)
    beside = beside_a_job(args.ops, args.rounds)
    medians = {label: statistics.median(samples) for label, samples in rows.items()}
    ratios = {
        "mac_share_of_sampled_check": medians["mac of the record"] / medians["sampled check (with the mac)"],
        "full_hash_vs_sampled_check": medians["full hash (no trusted marker)"] / medians["sampled check (with the mac)"],
    }
    report("markers", f"verification marker of a {args.mib} MiB blob ({len(record)} byte record, {len(digests)} bytes of chunk hashes)",
           [{"step": label, "median_s": value, "best_s": min(rows[label])} for label, value in medians.items()],
           ["step", "median_s", "best_s"], {"blob_mib": args.mib, "record_bytes": len(record), "ratios": ratios,
                                            "beside_a_job": {"ops": args.ops, "rounds": args.rounds, **beside}})
    for name, value in beside.items():
        print(f"job {name}: {value:.3g}")
    for name, value in ratios.items():
        print(f"{name}: {value:.3g}")


if __name__ == "__main__":
    main()
