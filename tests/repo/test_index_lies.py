"""A name's index that lies (issue 35): gc never deletes a blob a live version uses because of what
the index says, and a forged head (``used = 10**30``, ``-5``...) is rebuilt from the folders, never
turned into version ``v1000...001`` or "no alias 'v-4'"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash

import modulelens
from modulelens.errors import CaptureNotFoundError
from modulelens.repo.packs import referenced_blobs


def _save(repo: modulelens.Repo, name: str = "lin", *, weight: int = 4) -> modulelens.VersionInfo:
    torch.manual_seed(0)
    module = torch.nn.Linear(weight, 4)
    with modulelens.capture(module, targets="", repo=repo, name=name) as cap:
        module(torch.ones(2, weight))
    [info] = cap.wait() if repo.is_remote else cap.saved  # (a remote repo's: once uploaded)
    return info


def forge_head(path: Path, **changes: Any) -> None:
    """Rewrite a name's index head with ``changes``, its checksum made to match (as a received
    repo's index can be: the checksum catches torn writes and bit rot, not a forger)."""
    data = json.loads(path.read_bytes())
    data.pop("check")
    data.update(changes)
    body = json.dumps(data, separators=(",", ":")).encode()[1:]
    path.write_bytes(b'{"check":"' + xxhash.xxh3_64_hexdigest(body).encode() + b'",' + body)


def _flip(hexdigest: str) -> str:
    return hexdigest[:10] + ("0" if hexdigest[10] != "0" else "1") + hexdigest[11:]


def _lie_in_log(root: Path, name: str, how: str, pack: str) -> None:
    """Make ``name``'s log lie about the blobs of its versions, keeping it valid JSON."""
    folder = root / "names" / name
    head = json.loads((folder / "summary.json").read_bytes())
    log = folder / f"summary-{head['log']}.log"
    lines = [json.loads(line) for line in log.read_bytes().splitlines()]
    for line in lines:
        if how == "a hex digit flipped":  # bit rot that keeps the JSON valid
            line["blobs"] = [f"blake3:{_flip(b.partition(':')[2])}" if b == pack else b for b in line["blobs"]]
        elif how == "blob lists emptied":
            line["blobs"] = []
    if how == "an entry dropped":
        lines = lines[1:]
    data = b"".join(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines)
    log.write_bytes(data)
    forge_head(folder / "summary.json", log_bytes=len(data), count=len(lines))


@pytest.mark.parametrize("how", ["a hex digit flipped", "blob lists emptied", "an entry dropped"])
def test_gc_keeps_every_blob_a_version_uses_when_the_log_lies(how: str, tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    first, second = _save(repo), _save(repo)  # the same values: both versions use one pack
    loose = _save(repo, "big", weight=512 * 1024)  # a 8 MiB weight: a blob of its own (and a marker)
    pack = repo.read_metadata("lin", 1)["packs"][0]["payload"]
    assert repo.read_metadata("lin", 2)["packs"][0]["payload"] == pack
    _lie_in_log(repo.root, "lin", how, pack)
    _lie_in_log(repo.root, "big", how, pack)
    assert {p.kind for p in modulelens.Repo(repo.root).fsck().problems} == {"summary"}  # fsck saw it before
    report = modulelens.Repo(repo.root).gc()
    assert report.removed_blobs == 0 and report.kept_unindexed >= 1
    for info in (first, second, loose):
        cap = modulelens.load(info.ref, repo=repo.root, verify=True)
        assert cap.replay().passed
    repaired = modulelens.Repo(repo.root).fsck(repair=True)
    assert repaired.clean and repaired.quarantine is None  # the index rebuilt; no version moved aside
    assert modulelens.Repo(repo.root).fsck().clean
    assert [i.ref for i in modulelens.Repo(repo.root).list()] == ["big:v1", "lin:v1", "lin:v2"]


def test_gc_keeps_what_a_forged_object_store_head_leaves_out(tmp_path: Path) -> None:
    url = f"memory://index-lies-{tmp_path.name}"
    repo = modulelens.Repo(url)
    first, second = _save(repo), _save(repo)
    import fsspec

    fs = fsspec.filesystem("memory")
    key = f"/{url.removeprefix('memory://')}/names/lin/summary.json"
    head = json.loads(fs.cat_file(key))
    head.pop("check")
    for entry in head["versions"].values():
        entry["blobs"] = []
    body = json.dumps(head, separators=(",", ":")).encode()[1:]
    fs.pipe_file(key, b'{"check":"' + xxhash.xxh3_64_hexdigest(body).encode() + b'",' + body)
    report = modulelens.Repo(url).gc(grace_s=0)
    assert report.removed_blobs == 0 and report.kept_unindexed == 1
    for info in (first, second):
        assert modulelens.load(info.ref, repo=url, verify=True).replay().passed


def test_gc_still_frees_what_no_version_uses(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    _save(repo)
    _save(repo, "big", weight=512 * 1024)
    big = referenced_blobs(repo.read_metadata("big", 1))  # its weight, its input, its pack
    repo.remove("big")
    report = repo.gc()
    assert report.removed_blobs == len(big) == 3 and report.kept_unindexed == 0 and report.kept_blobs == 1
    dry = modulelens.Repo(repo.root)
    dry.remove("lin")
    assert dry.gc(dry_run=True).removed_blobs == 1


@pytest.mark.parametrize("forged", [
    {"used": 10**30}, {"used": -5}, {"used": True}, {"used": 1.5}, {"used": "7"}, {"latest": 9},
    {"aliases": {"golden": 10**30}}, {"aliases": {"golden": -4}}, {"removing": [0]},
    {"reserved": {"99999999999": {"by": "x", "at": 0}}}, {"log_bytes": 10**15}, {"log": -1}, {"count": None},
])
def test_a_forged_index_head_is_rebuilt_from_the_folders(forged: dict[str, Any], tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    _save(repo)
    _save(repo)
    repo.set_alias("lin:v1", "golden")
    forge_head(repo.root / "names" / "lin" / "summary.json", **forged)
    fresh = modulelens.Repo(repo.root)
    [problem] = fresh.fsck().problems
    assert problem.kind == "summary" and problem.path == "names/lin/summary.json" and "not used" in problem.detail
    assert [i.ref for i in fresh.list()] == ["lin:v1", "lin:v2"]
    assert fresh.resolve("lin") == ("lin", 2) and fresh.resolve("lin:golden") == ("lin", 1)
    with pytest.raises(CaptureNotFoundError, match="has no version v3"):
        fresh.resolve("lin:v3")
    assert _save(fresh).ref == "lin:v3"  # the next number, never used + 1 of a forged used
    assert modulelens.Repo(repo.root).fsck().clean  # the save stored the rebuilt index


def test_a_log_entry_above_the_heads_used_makes_the_index_be_rebuilt(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    _save(repo)
    folder = repo.root / "names" / "lin"
    head = json.loads((folder / "summary.json").read_bytes())
    log = folder / f"summary-{head['log']}.log"
    line = json.loads(log.read_bytes())
    line["v"] = 10**12
    data = json.dumps(line).encode() + b"\n"
    log.write_bytes(data)
    forge_head(folder / "summary.json", log_bytes=len(data))
    fresh = modulelens.Repo(repo.root)
    assert [i.ref for i in fresh.list()] == ["lin:v1"]
    assert "summary" in {p.kind for p in fresh.fsck().problems}
    assert _save(fresh).ref == "lin:v2"


def test_a_version_folder_beyond_the_highest_number_is_not_a_version(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    _save(repo)
    (repo.root / "names" / "lin" / "versions" / str(10**30)).mkdir()
    (repo.root / "names" / "lin" / "versions" / "007").mkdir()
    (repo.root / "names" / "lin" / "summary.json").unlink()  # listing and saving scan the folders
    fresh = modulelens.Repo(repo.root)
    assert [i.ref for i in fresh.list()] == ["lin:v1"]
    found = {(p.kind, p.path) for p in fresh.fsck().problems}
    assert found == {("foreign", f"names/lin/versions/{10**30}"), ("foreign", "names/lin/versions/007")}
    assert _save(fresh).ref == "lin:v2"
