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
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import report, timed

from modulelens.format.hashing import hash_bytes
from modulelens.format.provenance import user_key
from modulelens.repo.files import hash_file
from modulelens.repo.markers import MarkerKey, marker_path, sampled_check, split_marker, write_marker
from modulelens.repo.trust import repo_identity


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=200)
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
    medians = {label: statistics.median(samples) for label, samples in rows.items()}
    ratios = {
        "mac_share_of_sampled_check": medians["mac of the record"] / medians["sampled check (with the mac)"],
        "full_hash_vs_sampled_check": medians["full hash (no trusted marker)"] / medians["sampled check (with the mac)"],
    }
    report("markers", f"verification marker of a {args.mib} MiB blob ({len(record)} byte record, {len(digests)} bytes of chunk hashes)",
           [{"step": label, "median_s": value, "best_s": min(rows[label])} for label, value in medians.items()],
           ["step", "median_s", "best_s"], {"blob_mib": args.mib, "record_bytes": len(record), "ratios": ratios})
    for name, value in ratios.items():
        print(f"{name}: {value:.3g}")


if __name__ == "__main__":
    main()
