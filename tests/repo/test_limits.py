"""Every file a load or a listing parses has a size limit, checked before it is read (issue 35: a
pack header listing a million members cost 1.3 GiB and 13 s before its refusal; 100,000 junk folders
made a listing read each). A file over its limit is a one-line CorruptCaptureError naming it."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import fsspec
import pytest
import torch

import modulelens
from modulelens.errors import CorruptCaptureError
from modulelens.format.hashing import hash_bytes
from modulelens.repo.packs import PACK_HEADER_MAX_BYTES, PACK_MAX_MEMBERS, plan_packs


def _save(repo: modulelens.Repo | str, name: str = "lin") -> modulelens.VersionInfo:
    module = torch.nn.Linear(4, 4)
    with modulelens.capture(module, targets="", repo=repo, name=name) as cap:
        module(torch.ones(2, 4))
    return (cap.wait() if isinstance(repo, str) else cap.saved)[0]


def _grow(path: Path, size: int) -> None:
    """Make ``path`` ``size`` bytes long without writing them (a sparse file: the test costs no disk)."""
    os.chmod(path, 0o644)
    with open(path, "r+b") as handle:
        handle.truncate(size)


def test_a_capture_file_over_the_limit_is_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    _save(repo)
    _save(repo)
    monkeypatch.setenv("MODULELENS_MAX_METADATA_MIB", "1")
    _grow(repo.root / "names/lin/versions/2/capture.json", 2 << 20)
    with pytest.raises(CorruptCaptureError) as refused:
        modulelens.load("lin:v2", repo=repo.root)
    message = str(refused.value)
    assert "\n" not in message and "versions/2/capture.json is 2,097,152 bytes, more than the 1,048,576" in message
    assert "MODULELENS_MAX_METADATA_MIB" in message
    fresh = modulelens.Repo(repo.root)
    assert [i.ref for i in fresh.list()] == ["lin:v1", "lin:v2"]  # the index lists it; loading names why not
    [problem] = fresh.fsck().problems
    assert problem.kind == "metadata" and problem.path == "names/lin/versions/2/capture.json"
    assert fresh.gc().removed_blobs == 0
    assert modulelens.load("lin:v1", repo=repo.root, verify=True).replay().passed
    monkeypatch.setenv("MODULELENS_MAX_METADATA_MIB", "4")  # the limit can be raised: the file is read
    with pytest.raises(CorruptCaptureError, match="not valid JSON"):
        modulelens.load("lin:v2", repo=repo.root)


def test_small_files_have_small_limits(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    _save(repo)
    repo.set_alias("lin:v1", "golden")
    _grow(repo.root / "names/lin/aliases/golden", 1 << 30)  # a 1 GiB alias file
    fresh = modulelens.Repo(repo.root)
    assert fresh.resolve("lin:golden") == ("lin", 1)  # the index head knows it; the file is not read
    assert {(p.kind, p.path) for p in fresh.fsck().problems} == {("alias", "names/lin/aliases/golden")}
    _grow(repo.root / "modulelens-repo.json", 1 << 30)
    marked = modulelens.Repo(repo.root)
    assert marked.layout_problem is not None and "modulelens-repo.json is 1,073,741,824 bytes" in marked.layout_problem
    assert [i.ref for i in marked.list()] == ["lin:v1"]


def test_a_report_over_its_limit_is_left_out(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    _save(repo)
    path = Path(repo.add_report("lin:v1", "profile", {"ok": True}))
    big = path.with_name("verify-big.json")
    big.write_bytes(b"{}")
    _grow(big, (64 << 20) + 1)
    assert [r["kind"] for r in repo.reports("lin:v1")] == ["profile"]


def _pack_with_members(count: int) -> bytes:
    """A well-formed pack of ``count`` one-byte members, as an old modulelens could write (before
    packs held at most PACK_MAX_MEMBERS)."""
    data = [bytes([i % 256]) + i.to_bytes(4, "little") for i in range(count)]
    members, offset = {}, 0
    for payload in data:
        members[hash_bytes(payload, threads=False).partition(":")[2]] = [offset, len(payload)]
        offset += 64
    probe = json.dumps({"format": "modulelens.pack", "version": 1, "members": members}, separators=(",", ":"))
    start = (8 + len(probe) + 24 * count + 64 + 63) // 64 * 64
    header = json.dumps({"format": "modulelens.pack", "version": 1,
                         "members": {h: [start + o, n] for h, (o, n) in members.items()}}, separators=(",", ":")).encode()
    body = bytearray(start + offset)
    body[:8] = struct.pack("<Q", start - 8)
    body[8:start] = header.ljust(start - 8)
    for index, payload in enumerate(data):
        body[start + 64 * index:start + 64 * index + len(payload)] = payload
    return bytes(body)


def test_a_pack_header_over_its_limit_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    info = _save(repo)
    pack = _pack_with_members(200_000)  # a header of ~19 MiB
    digest = hash_bytes(pack)
    repo.write_blob(digest, pack)
    meta = json.loads((info.path / "capture.json").read_bytes())
    meta["packs"][0] = {"payload": digest, "nbytes": len(pack)}
    path = info.path / "capture.json"
    os.chmod(path, 0o644)
    path.write_text(json.dumps(meta))
    with pytest.raises(CorruptCaptureError) as refused:
        modulelens.load("lin", repo=repo.root).state_dict(0)
    assert f"more than the {PACK_HEADER_MAX_BYTES:,} of a pack of at most {PACK_MAX_MEMBERS:,} members" in str(refused.value)
    assert any(p.kind == "corrupt-payload" for p in modulelens.Repo(repo.root).fsck().problems)


def test_a_save_packs_at_most_the_member_limit_together() -> None:
    payloads = [(f"blake3:{i:064x}", memoryview(b"x")) for i in range(PACK_MAX_MEMBERS + 10)]
    plans = plan_packs(payloads)
    assert [len(p.members) for p in plans] == [PACK_MAX_MEMBERS, 10]


def test_junk_folders_cost_a_listing_nothing_per_folder(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    _save(repo, "real")
    for i in range(500):
        (repo.root / "names" / f"junk{i}").mkdir()
    (repo.root / "names" / "junk0" / "aliases").mkdir()
    fresh = modulelens.Repo(repo.root)
    assert fresh.store.names() == ["real"]  # left out by two lstat each: never read or scanned
    assert [i.ref for i in fresh.list()] == ["real:v1"] and fresh.names() == ["real"]
    url = f"memory://junk-{tmp_path.name}"
    _save(url, "real")
    memory = fsspec.filesystem("memory")
    memory.pipe({f"/{url.removeprefix('memory://')}/names/junk{i}/x": b"" for i in range(500)})
    remote = modulelens.Repo(url)
    assert remote.store.names() == ["real"]
    assert [i.ref for i in remote.list()] == ["real:v1"] and remote.names() == ["real"]
