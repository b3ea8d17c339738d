"""Per-name summaries: listing, resolving and gc read them instead of every capture file, and they
stay right under concurrent saves, removals and alias moves."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from urllib.parse import unquote

import torch
from child_process import PYTHON, subprocess_env
from torch import nn

import modulelens


def _save(repo: modulelens.Repo, name: str) -> None:
    module = nn.Linear(4, 4)
    with modulelens.capture(module, targets="Linear", repo=repo, name=name):
        module(torch.randn(2, 4))


def _full_scan(root: Path) -> list[tuple[str, int, str, tuple[str, ...], int]]:
    """What a listing must show, read from every capture file and alias file directly."""
    rows = []
    for name_dir in sorted((root / "names").iterdir()):
        aliases: dict[int, list[str]] = {}
        for alias in sorted((name_dir / "aliases").glob("*")) if (name_dir / "aliases").exists() else []:
            aliases.setdefault(int(alias.read_text()), []).append(alias.name)
        versions = sorted(int(p.name) for p in (name_dir / "versions").iterdir() if p.name.isdigit())
        for version in versions:
            meta = json.loads((name_dir / "versions" / str(version) / "capture.json").read_text())
            names = tuple(aliases.get(version, ()))
            rows.append((unquote(name_dir.name), version, meta["created"],
                         ("latest", *names) if version == versions[-1] else names, len(meta["calls"])))
    return rows


def _listed(repo: modulelens.Repo) -> list[tuple[str, int, str, tuple[str, ...], int]]:
    return [(i.name, i.version, i.created, i.aliases, i.calls) for i in repo.list()]


def test_list_equals_a_full_scan_after_concurrent_saves_removes_and_alias_moves(repo: modulelens.Repo) -> None:
    _save(repo, "shared/lin")
    procs = [subprocess.Popen([PYTHON, "-m", "save_worker", str(repo.root), "shared/lin", "4", str(seed)],
                              stdout=subprocess.PIPE, text=True, env=subprocess_env()) for seed in range(3)]
    removed = 0
    while any(p.poll() is None for p in procs):  # list, move aliases and remove while they save
        versions = repo.version_numbers("shared/lin")
        if len(versions) > 2 and removed < 3:
            repo.remove(f"shared/lin:v{versions[1]}")
            removed += 1
        repo.set_alias(f"shared/lin:v{versions[0]}", "golden")
        listed = [i.version for i in repo.list("shared/lin")]
        after = repo.version_numbers("shared/lin")  # savers only add (higher numbers) in between
        assert listed == after[:len(listed)]
        time.sleep(0.05)
    assert all(p.wait() == 0 for p in procs)
    assert _listed(repo) == _full_scan(repo.root)
    assert len(repo.list()) == 13 - removed
    fresh = modulelens.Repo(repo.root)  # no summaries in memory: read from the files
    assert _listed(fresh) == _full_scan(repo.root)


def test_listing_reads_the_summary_not_the_capture_files(repo: modulelens.Repo) -> None:
    for name in ("a", "b"):
        _save(repo, name)
        _save(repo, name)
    repo.set_alias("a:v1", "golden")
    past = time.time() - 10  # folders untouched for a while: their state can be trusted
    for name_dir in (repo.root / "names").iterdir():
        for folder in ("versions", "aliases"):
            if (name_dir / folder).exists():
                os.utime(name_dir / folder, (past, past))
    expected = _listed(modulelens.Repo(repo.root))  # builds and records the summaries
    capture = repo.root / "names" / "a" / "versions" / "2" / "capture.json"
    os.chmod(capture, 0o644)
    capture.write_text("{ damaged")  # a capture's content changes nothing a listing reads
    reader = modulelens.Repo(repo.root)
    assert _listed(reader) == expected
    assert reader.resolve("a:golden") == ("a", 1) and reader.resolve("a") == ("a", 2)
    assert reader.gc(dry_run=True).removed_blobs == 0
    # ...while any change of the folders is seen at once
    reader.remove("b:v1")
    _save(reader, "a")
    assert [i.ref for i in modulelens.Repo(repo.root).list()] == ["a:v1", "a:v2", "a:v3", "b:v2"]


def test_a_version_removed_between_its_publish_and_its_index_entry_stays_removed(repo: modulelens.Repo) -> None:
    """An ``rm`` sees a reserved version as soon as its folder is published and may remove it before
    the save records its entry; that entry must not bring it back (the stress suite's race row
    listed versions whose folders were gone, once waits for the index's lock polled)."""
    from modulelens.repo.index import version_entry
    from modulelens.repo.layout import capture_json, name_key, version_key

    _save(repo, "lin")
    meta = repo.read_metadata("lin", 1)
    prefix = name_key("lin")
    [number], unused = repo._summaries.reserve("lin", prefix)  # a save, up to its publish
    meta["version"] = number
    assert repo.store.publish(version_key("lin", number), {"capture.json": capture_json(meta)}, unused=unused)
    other = modulelens.Repo(repo.root)
    assert [i.version for i in other.list("lin")] == [1, 2]  # visible while reserved
    assert other.remove("lin:v2") == ["lin:v2"]
    repo._summaries.finish("lin", prefix, {number: version_entry(meta)})  # the save goes on
    fresh = modulelens.Repo(repo.root)
    assert [i.version for i in fresh.list("lin")] == [1] and fresh.resolve("lin") == ("lin", 1)
    assert fresh.fsck().clean
    _save(repo, "lin")
    assert [i.version for i in modulelens.Repo(repo.root).list("lin")] == [1, 3]
