"""What a listing pays for edited tags (repo/notes.py): ``Repo.list()`` reads one notes file per
name, in one batch, to show the tags people edited after capture.

    python benchmarks/bench_notes.py [--rounds 7] [--versions 2000] [--names 10,200,1000]

For each size, a local repo of --versions versions spread over N names, half the names with a
notes file (a description and an edited tag on each of their versions), the other half without
(a failed open each); and the same repo copied into an object store (fsspec ``memory://``, the
code path of ``s3://``; no network, so it counts the work, not the latency). Contenders, interleaved:
``Repo.list()`` as it is, and ``Repo.list()`` without the notes overlay (the listing before notes
existed), and the floor: reading every name's notes file alone. Results in results/notes.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import interleaved, many_versions_repo, median, report

import modulelens
from modulelens.repo.layout import notes_key


def _noted(repo: modulelens.Repo, names: list[str]) -> None:
    for name in names[::2]:
        for number in repo.version_numbers(name):
            repo.describe(f"{name}:v{number}", "a reviewer's words")
            repo.tag(f"{name}:v{number}", "reviewed")


def _rows(repo: modulelens.Repo, label: str, names: int, versions: int, rounds: int) -> list[dict[str, object]]:
    keys = [notes_key(name) for name in repo.names()]
    plain = type(repo)._with_notes

    def without_notes() -> object:
        type(repo)._with_notes = lambda self, infos: infos  # type: ignore[method-assign]
        try:
            return repo.list()
        finally:
            type(repo)._with_notes = plain  # type: ignore[method-assign]

    contenders = {"list() with notes": repo.list, "list() without the notes overlay": without_notes,
                  "read the notes files alone": lambda: repo.store.read_many(keys)}
    times = interleaved(contenders, rounds)
    base = median(times["list() without the notes overlay"])
    assert sum("reviewed" in info.tags for info in repo.list()) > 0
    return [{"store": label, "names": names, "versions": versions, "contender": name, "median_s": median(samples),
             "best_s": min(samples), "vs_without": median(samples) / base} for name, samples in times.items()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--versions", type=int, default=2000)
    parser.add_argument("--names", default="10,200,1000")
    args = parser.parse_args()
    rows: list[dict[str, object]] = []
    work = Path(tempfile.mkdtemp(prefix="modulelens-bench-notes-"))
    os.environ["MODULELENS_CACHE"] = str(work / "cache")
    try:
        for count in (int(n) for n in args.names.split(",")):
            local = many_versions_repo(work / f"local-{count}", args.versions, count)
            names = local.names()
            _noted(local, names)
            rows += _rows(local, "local", count, args.versions, args.rounds)
            remote = modulelens.Repo(f"memory://bench-notes-{count}/repo")
            for name in names:
                local.push(name, remote)
            rows += _rows(modulelens.Repo(remote.location), "memory://", count, args.versions, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report("notes", "Repo.list() with and without the notes overlay (edited tags)", rows,
           ["store", "names", "versions", "contender", "median_s", "best_s", "vs_without"],
           {"rounds": args.rounds, "load": os.getloadavg()})


if __name__ == "__main__":
    main()
