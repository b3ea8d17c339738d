"""The local repo: versions, aliases, dedup, removal, gc, concurrent writers."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from child_process import PYTHON, subprocess_env
from torch import nn

import modulelens
from modulelens.repo.names import parse_ref


def _save(repo: modulelens.Repo, module: nn.Module, name: str, x: torch.Tensor | None = None, **kw: object) -> modulelens.VersionInfo:
    with modulelens.capture(module, targets=type(module).__name__, repo=repo, name=name, **kw) as cap:
        module(x if x is not None else torch.randn(2, module.in_features))
    return cap.saved[0]


def test_each_save_is_a_new_version_and_latest_follows(repo: modulelens.Repo) -> None:
    module = nn.Linear(4, 4)
    refs = [_save(repo, module, "lin").ref for _ in range(3)]
    assert refs == ["lin:v1", "lin:v2", "lin:v3"]
    assert repo.resolve("lin") == ("lin", 3)
    assert repo.resolve("lin:latest") == ("lin", 3)
    assert repo.resolve("lin:v2") == ("lin", 2)
    assert "latest" in repo.info("lin", 3).aliases


def test_aliases_are_movable_and_validated(repo: modulelens.Repo) -> None:
    module = nn.Linear(4, 4)
    _save(repo, module, "lin")
    _save(repo, module, "lin")
    repo.set_alias("lin:v1", "golden")
    assert repo.resolve("lin:golden") == ("lin", 1)
    repo.set_alias("lin:v2", "golden")
    assert repo.resolve("lin:golden") == ("lin", 2)
    with pytest.raises(modulelens.InvalidNameError):
        repo.set_alias("lin:v1", "latest")
    with pytest.raises(modulelens.InvalidNameError):
        repo.set_alias("lin:v1", "v7")
    with pytest.raises(modulelens.InvalidNameError):
        repo.set_alias("lin:v1", "../x")
    repo.remove_alias("lin", "golden")
    with pytest.raises(modulelens.CaptureNotFoundError):
        repo.resolve("lin:golden")


def test_tags_and_metadata_are_stored(repo: modulelens.Repo) -> None:
    info = _save(repo, nn.Linear(4, 4), "lin", tags=["nightly"], metadata={"run": "abc"})
    assert info.tags == ("nightly",)
    assert repo.read_metadata("lin", 1)["metadata"] == {"run": "abc"}


def test_a_listed_version_is_a_snapshot_equal_to_one_built_by_hand(repo: modulelens.Repo) -> None:
    """A listing keeps each version's index entry and reads its fields when asked (bench_scale): the
    result must still read like a plain record, compare by value and not change with the repo."""
    _save(repo, nn.Linear(4, 4), "lin", tags=["nightly"])
    _save(repo, nn.Linear(4, 4), "lin")
    first, second = repo.list("lin")
    assert first.tags == ("nightly",) and isinstance(first.tags, tuple) and second.tags == ()
    assert second.aliases == ("latest",) and first.aliases == ()
    assert first.folder == str(repo.root / "names" / "lin" / "versions" / "1") and first.path.is_dir()
    assert first.module_class == "torch.nn.modules.linear:Linear" and first.calls == 1 and first.nbytes > 0
    assert first.problem is None
    by_hand = modulelens.VersionInfo(first.name, 1, first.folder, first.created, ("nightly",), (), first.nbytes,
                                     first.module_class, first.calls)
    assert by_hand == first and by_hand != second and by_hand.to_dict() == first.to_dict()
    assert repr(by_hand) == repr(first) and repr(first).startswith("VersionInfo(name='lin', version=1, ")
    with pytest.raises(TypeError):
        hash(first)
    repo.set_alias("lin:v1", "golden")
    repo.remove("lin:v2")
    assert first.aliases == () and second.aliases == ("latest",)  # what was listed stays as it was
    assert [info.aliases for info in repo.list("lin")] == [("latest", "golden")]


def test_committing_over_a_damaged_payload_names_the_damage_not_only_absence(repo: modulelens.Repo) -> None:
    _save(repo, nn.Linear(4, 4), "lin")
    metadata = repo.read_metadata("lin", 1)
    blob = next(path for path in (repo.root / "blobs").glob("*/*") if not path.name.endswith(".ok"))
    blob.chmod(0o644)
    blob.write_bytes(bytes(len(blob.read_bytes())))  # same size, other bytes
    with pytest.raises(modulelens.CorruptCaptureError, match=r"missing from .*, or stored there with bytes that do not hash to it"):
        repo.commit_version("copy", metadata)
    assert [info.ref for info in repo.list()] == ["lin:v1"]


def test_payloads_are_stored_once_across_versions_and_captures(repo: modulelens.Repo) -> None:
    module = nn.Linear(256, 256)
    x = torch.randn(2, 256)
    _save(repo, module, "a", x)
    blobs_after_first = len(list((repo.root / "blobs").glob("*/*[!k]")))
    _save(repo, module, "a", x)
    _save(repo, module, "b", x)
    assert len(list((repo.root / "blobs").glob("*/*[!k]"))) == blobs_after_first


def test_remove_and_gc(repo: modulelens.Repo) -> None:
    module = nn.Linear(8, 8)
    _save(repo, module, "keep")
    with torch.no_grad():
        module.weight.add_(1)
    _save(repo, module, "drop")
    repo.set_alias("drop:v1", "golden")
    assert repo.remove("drop") == ["drop:v1"]
    assert "drop" not in repo.names()
    assert repo.gc(dry_run=True).removed_blobs > 0
    report = repo.gc()
    assert report.removed_blobs > 0 and report.freed_bytes > 0
    assert repo.gc().removed_blobs == 0
    assert modulelens.load("keep", repo=repo).replay().passed


def test_a_listing_reads_removals_and_incomplete_log_lines_from_the_log(repo: modulelens.Repo) -> None:
    """The log's fast path (only entries) and its slow one (an ``rm`` line; a line without its
    blobs, which the listing then reads from ``capture.json``) list the same versions."""
    module = nn.Linear(4, 4)
    infos = [_save(repo, module, "lin") for _ in range(3)]
    assert [i.version for i in repo.list("lin")] == [1, 2, 3]
    repo.remove("lin:v2")
    listed = repo.list("lin")
    assert [i.version for i in listed] == [1, 3] and listed[1] == infos[2]  # still the latest
    assert all(i.nbytes == infos[0].nbytes and i.module_class.endswith("Linear") for i in listed)
    garbage = repo.gc(dry_run=True).removed  # v2's own payloads
    log = next((repo.root / "names" / "lin").glob("summary-*.log"))
    lines = log.read_bytes().splitlines(keepends=True)
    entry = json.loads(lines[0])
    del entry["blobs"]  # a log line left incomplete (by hand): the listing reads the version's capture.json
    log.write_bytes(json.dumps(entry, separators=(",", ":")).encode().ljust(len(lines[0]) - 1) + b"\n"
                    + b"".join(lines[1:]))
    again = repo.list("lin")
    assert [i.version for i in again] == [1, 3] and again[0].nbytes == infos[0].nbytes
    assert garbage and repo.gc(dry_run=True).removed == garbage  # v1's payloads are still referenced
    assert modulelens.load("lin:v1", repo=repo).replay().passed
    # concurrent writers append out of order: the listing is still in version order
    v1, v2, v3, rm_v2 = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(v3 + v1 + v2 + rm_v2)
    assert [i.version for i in repo.list("lin")] == [1, 3] and [i.version for i in repo.list()] == [1, 3]


def test_metadata_is_plain_json_and_payloads_are_raw_bytes(repo: modulelens.Repo) -> None:
    module = nn.Linear(3, 2)
    info = _save(repo, module, "lin")
    meta = json.loads((info.path / "capture.json").read_text())
    # a capture is written in the oldest format that holds it (format 3 only for what needs it: a
    # method target, calls under vmap; tracing/encode.py), so older readers keep reading plain ones
    assert meta["format"] == "modulelens.capture" and meta["format_version"] == 2 < modulelens.FORMAT_VERSION
    weight = meta["tensors"][meta["states"][0]["parameters"]["weight"]["tensor"]]
    raw = repo.payloads(meta).read_bytes(weight)
    assert raw == module.weight.detach().numpy().tobytes()


def test_concurrent_writers_both_land_with_distinct_versions(repo: modulelens.Repo) -> None:
    procs = [subprocess.Popen([PYTHON, "-m", "save_worker", str(repo.root), "shared/lin", "4", str(seed)],
                              stdout=subprocess.PIPE, text=True, env=subprocess_env()) for seed in (1, 2)]
    outputs = [p.communicate(timeout=300)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    refs = outputs[0] + outputs[1]
    assert len(refs) == 8 and len(set(refs)) == 8
    assert repo.version_numbers("shared/lin") == list(range(1, 9))
    for version in range(1, 9):
        assert modulelens.load(f"shared/lin:v{version}", repo=repo).replay().passed
    assert not list((repo.root / "tmp").iterdir())


def test_ref_parsing() -> None:
    assert parse_ref("a/b").selector is None
    assert parse_ref("a/b:v12").version == 12
    assert parse_ref("a/b:golden").selector == "golden"
    with pytest.raises(modulelens.InvalidNameError):
        parse_ref("a/b:v0")
