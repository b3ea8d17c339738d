"""Push and pull of a capture to a local S3 server (SeaweedFS on loopback) against s3fs put/get of one
file of the same size (what `aws s3 cp` does), and load of a cached remote capture against the same
capture in a local repo, all in the same run.

    python benchmarks/bench_remote.py [--gib 0.25] [--repeat 3]

* push:   Repo(local).push(ref, "s3://...")  (hash check of every blob + upload, 8 in parallel)
  vs      s3fs.put_file(one file of the same size)
* pull:   Repo(fresh local).pull("s3://...", ref) on a cold cache (download, hash check, copy in)
  vs      s3fs.get_file(that file)
* load:   modulelens.load(ref, repo="s3://...").module with every blob already cached
  vs      modulelens.load(ref, repo=local).module            (target: within 1.2x)

The issue asks for 1 GiB; the default is 0.25 GiB to keep a run short on shared machines.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "support"))
from _common import Big, median, report, timed
from seaweed import SeaweedServer

import modulelens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=0.25)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    width = 4096
    depth = Big.depth_for(args.gib, width)
    work = Path(tempfile.mkdtemp(prefix="ml-bench-remote-"))
    server = SeaweedServer(work / "weed").start()
    os.environ.update(server.env)
    os.environ["MODULELENS_CACHE"] = str(work / "cache")
    try:
        import s3fs

        modulelens.track_init()
        model = Big(width, depth)
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        local = modulelens.Repo(work / "local")
        with modulelens.capture(model, targets="Big", repo=local, name="big"):
            model(torch.randn(2, width))
        del model
        fs = s3fs.S3FileSystem()
        fs.mkdir("bench")
        blob = work / "one-file"
        with open(blob, "wb") as handle:
            handle.truncate(nbytes)  # the same size as the capture's payloads

        def push() -> None:
            local.push("big", f"s3://bench/{uuid.uuid4().hex[:8]}")

        def put() -> None:
            fs.put_file(str(blob), f"bench/{uuid.uuid4().hex[:8]}")

        push_s, put_s = timed(push, args.repeat), timed(put, args.repeat)
        url = "s3://bench/pulled"
        local.push("big", url)
        fs.put_file(str(blob), "bench/one-file")

        def fresh_cache() -> None:
            shutil.rmtree(work / "cache", ignore_errors=True)
            shutil.rmtree(work / "pulled", ignore_errors=True)
            (work / "got").unlink(missing_ok=True)

        pull_s = timed(lambda: modulelens.Repo(work / "pulled").pull(url, "big"), args.repeat, setup=fresh_cache)
        get_s = timed(lambda: fs.get_file("bench/one-file", str(work / "got")), args.repeat, setup=fresh_cache)

        remote = modulelens.Repo(url)
        modulelens.load("big", repo=remote).module  # noqa: B018 - fills the cache
        load_remote = timed(lambda: modulelens.load("big", repo=remote).module, args.repeat)
        load_remote_v1 = timed(lambda: modulelens.load("big:v1", repo=remote).module, args.repeat)
        load_local = timed(lambda: modulelens.load("big", repo=local).module, args.repeat)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = [
        {"operation": "push (Repo.push)", "modulelens_s": median(push_s), "baseline": "s3fs put_file",
         "baseline_s": median(put_s), "ratio": median(push_s) / median(put_s)},
        {"operation": "pull, cold cache (Repo.pull)", "modulelens_s": median(pull_s), "baseline": "s3fs get_file",
         "baseline_s": median(get_s), "ratio": median(pull_s) / median(get_s)},
        {"operation": "load 'big' (latest: one LIST), cached remote", "modulelens_s": median(load_remote),
         "baseline": "load, local repo", "baseline_s": median(load_local), "ratio": median(load_remote) / median(load_local)},
        {"operation": "load 'big:v1', cached remote", "modulelens_s": median(load_remote_v1),
         "baseline": "load, local repo", "baseline_s": median(load_local),
         "ratio": median(load_remote_v1) / median(load_local)},
    ]
    report("remote", f"remote repo on SeaweedFS (loopback), {nbytes / 2**30:.2f} GiB of fp32 weights ({depth}x Linear({width}))",
           rows, ["operation", "modulelens_s", "baseline", "baseline_s", "ratio"],
           {"weight_bytes": nbytes, "repeat": args.repeat})


if __name__ == "__main__":
    main()
