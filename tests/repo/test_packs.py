"""Packed payloads: small payloads of a save share one pack blob; large ones keep their own blob."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from pathlib import Path

import pytest
import torch
from bit_rot import rot
from torch import nn

import modulelens
from modulelens.errors import CorruptCaptureError
from modulelens.format.hashing import hash_bytes
from modulelens.repo.layout import LAYOUT_VERSION
from modulelens.repo.markers import MARK_MIN_BYTES, MARK_MIN_PACK_BYTES, marker_path, split_marker
from modulelens.repo.packs import PACK_BELOW, referenced_blobs

GOLDEN = Path(__file__).resolve().parents[1] / "format" / "golden_v1" / "repo"


class Mixed(nn.Module):
    """Small layers (packed) next to one 2 MiB weight (a blob of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.small = nn.ModuleList(nn.Linear(8, 8) for _ in range(20))
        self.big = nn.Linear(1024, 512, bias=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for layer in self.small:
            x = layer(x)
        return x, self.big(y)


def _save(repo: modulelens.Repo, module: nn.Module, name: str = "mixed") -> modulelens.VersionInfo:
    with modulelens.capture(module, targets="Mixed", repo=repo, name=name) as cap:
        module(torch.randn(2, 8), torch.randn(2, 1024))
    return cap.saved[0]


def _blob_files(repo: modulelens.Repo) -> set[str]:
    return {p.name for p in (repo.root / "blobs").glob("*/*") if not p.name.endswith(".ok")}


def test_small_payloads_share_one_pack_and_round_trip(repo: modulelens.Repo) -> None:
    module = Mixed()
    info = _save(repo, module)
    meta = repo.read_metadata("mixed", info.version)
    packed = [e for e in meta["tensors"].values() if "pack" in e]
    loose = [e for e in meta["tensors"].values() if e.get("payload") and "pack" not in e]
    assert len(meta["packs"]) == 1 and len(packed) >= 40
    assert all(e["nbytes"] < PACK_BELOW for e in packed) and [e["nbytes"] for e in loose] == [2 << 20]
    assert _blob_files(repo) == {d.partition(":")[2] for d in referenced_blobs(meta)}  # one pack + one weight
    cap = modulelens.load(info.ref, repo=repo)
    for key, value in module.state_dict().items():
        assert torch.equal(cap.state_dict(0)[key], value), key
    assert cap.replay().passed
    assert modulelens.load(info.ref, repo=repo, verify=True).replay().passed
    # tensors handed out are independent of each other and of the pack file
    first = cap.tensor(cap.metadata["states"][0]["parameters"]["small.0.weight"]["tensor"])
    first.add_(1)
    assert torch.equal(cap.module.small[0].weight, module.small[0].weight)
    assert modulelens.load(info.ref, repo=repo).replay().passed


def test_dedup_across_versions_for_large_payloads_and_correct_small_ones(repo: modulelens.Repo) -> None:
    module = Mixed()
    _save(repo, module)
    before = module.small[3].bias.detach().clone()
    with torch.no_grad():
        module.small[3].bias.add_(1)  # a small change: a new pack, the big weight is shared
    _save(repo, module)
    first, second = (repo.read_metadata("mixed", v) for v in (1, 2))
    big = [d for d in referenced_blobs(first) if d in referenced_blobs(second)]
    assert len(big) == 1 and first["packs"] != second["packs"]
    assert len(_blob_files(repo)) == 3
    for version, bias in ((1, before), (2, module.small[3].bias.detach())):
        cap = modulelens.load(f"mixed:v{version}", repo=repo)
        assert torch.equal(cap.module.small[3].bias, bias)
        assert cap.replay().passed


def test_an_identical_save_reuses_its_pack(repo: modulelens.Repo) -> None:
    module = Mixed()
    x, y = torch.randn(2, 8), torch.randn(2, 1024)
    for _ in range(2):
        with modulelens.capture(module, targets="Mixed", repo=repo, name="same"):
            module(x, y)
    assert repo.read_metadata("same", 1)["packs"] == repo.read_metadata("same", 2)["packs"]
    assert len(_blob_files(repo)) == 2


def test_gc_frees_the_packs_of_removed_versions_only(repo: modulelens.Repo) -> None:
    module = Mixed()
    _save(repo, module)
    with torch.no_grad():
        module.small[0].weight.mul_(2)
    _save(repo, module)
    old_pack = repo.read_metadata("mixed", 1)["packs"][0]["payload"].partition(":")[2]
    kept = {d.partition(":")[2] for d in referenced_blobs(repo.read_metadata("mixed", 2))}
    repo.remove("mixed:v1")
    report = repo.gc()
    assert report.removed == [old_pack]
    assert _blob_files(repo) == kept
    assert modulelens.load("mixed:v2", repo=repo, verify=True).replay().passed


def test_a_damaged_pack_member_is_a_corrupt_capture_error(repo: modulelens.Repo) -> None:
    info = _save(repo, Mixed())
    meta = repo.read_metadata("mixed", info.version)
    pack = repo.blob_path(meta["packs"][0]["payload"])
    os.chmod(pack, 0o644)
    with open(pack, "r+b") as handle:  # a byte inside the last member
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x7f")
    with pytest.raises(modulelens.CorruptCaptureError, match="corrupted"):
        modulelens.load(info.ref, repo=repo).module  # noqa: B018
    # a pack whose header lies about a member is caught too
    entry = next(e for e in meta["tensors"].values() if "pack" in e)
    meta["tensors"]["t_extra"] = {**entry, "payload": "blake3:" + "0" * 64}
    with pytest.raises(modulelens.CorruptCaptureError):
        repo.payloads(meta).check(meta["tensors"]["t_extra"])


class Wide(nn.Module):
    """Twenty 64 x 64 layers: one pack of ~330 KiB, past the size from which a pack is marked."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(20))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_pack_checked_in_full_is_marked_and_sampled_after(repo: modulelens.Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pack of 64 KiB or more is hashed with its members once, then marked: later loads compare
    a sample of its chunk hashes instead of hashing it and each member again, and bit rot under
    the marker is still found. A smaller pack is hashed on every load and never marked."""
    module = Wide()
    with modulelens.capture(module, targets="Wide", repo=repo, name="wide") as cap:
        module(torch.randn(2, 64))
    meta = repo.read_metadata("wide", cap.saved[0].version)
    [pack_entry] = meta["packs"]
    pack = repo.blob_path(pack_entry["payload"])
    assert MARK_MIN_PACK_BYTES <= pack_entry["nbytes"] < MARK_MIN_BYTES
    assert modulelens.load("wide", repo=repo).replay().passed  # hashed in full with its members, then marked
    record = json.loads(split_marker(marker_path(pack).read_bytes())[0])
    assert record["pack"] is True

    def no_full_check(path: Path) -> None:
        raise AssertionError(f"{path} was checked in full despite its marker")

    monkeypatch.setattr("modulelens.repo.local.check_members", no_full_check)
    monkeypatch.setattr("modulelens.repo.local.hash_file", no_full_check)
    assert modulelens.load("wide", repo=repo).replay().passed
    monkeypatch.undo()

    rot(repo, pack, list(range(3, pack_entry["nbytes"], 64 << 10)), pack=True)  # every chunk; size, times kept
    with pytest.raises(modulelens.CorruptCaptureError, match="sampled chunk"):
        modulelens.load("wide", repo=repo).module  # noqa: B018

    small = _save(repo, Mixed())  # a pack of a few KiB
    small_pack = repo.blob_path(repo.read_metadata("mixed", small.version)["packs"][0]["payload"])
    assert modulelens.load("mixed", repo=repo).replay().passed
    assert os.path.getsize(small_pack) < MARK_MIN_PACK_BYTES and not marker_path(small_pack).exists()


def test_layout_1_repo_loads_unchanged_and_upgrades_on_first_save(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    shutil.copytree(GOLDEN, root)
    repo = modulelens.Repo(root)
    assert modulelens.load("golden:stable", repo=repo).replay().passed
    assert [i.ref for i in repo.list()] == ["golden:v1"]
    assert json.loads((root / "modulelens-repo.json").read_text())["layout_version"] == 1  # reading wrote nothing
    _save(repo, Mixed(), "new")
    assert json.loads((root / "modulelens-repo.json").read_text())["layout_version"] == LAYOUT_VERSION
    assert modulelens.load("golden:stable", repo=repo).replay().passed
    assert modulelens.load("new", repo=repo).replay().passed
    assert repo.gc().removed_blobs == 0


def _pack_bytes(members: object, *, data: bytes = b"\0" * 64) -> bytes:
    """A pack of ``data`` whose header lists ``members`` as given (true or not)."""
    header = json.dumps({"format": "modulelens.pack", "version": 1, "members": members}).encode()
    return struct.pack("<Q", len(header)) + header + data


def test_a_pack_header_is_checked_member_by_member_and_read_whole() -> None:
    from modulelens.repo.packs import build_pack, plan_packs, read_header

    payloads = [i.to_bytes(2, "little") * (i + 1) for i in range(300)]
    digests = [hash_bytes(p) for p in payloads]
    [plan] = plan_packs(list(zip(digests, map(memoryview, payloads), strict=True)))
    buffer, offsets = build_pack(plan)
    members = read_header(bytes(buffer), "pack")
    assert members == {d.partition(":")[2]: (offsets[d.partition(":")[2]], len(p)) for d, p in zip(digests, payloads, strict=True)}
    assert all(isinstance(place, tuple) for place in members.values())

    start = 8 + len(json.dumps({"format": "modulelens.pack", "version": 1, "members": {"a" * 64: [1000, 1]}}))
    good = "a" * 64
    for members, problem in [
        ({"A" * 64: [start, 1]}, "not named by a payload hash: 'AAAA"),
        ({good: [start, 1], "a" * 63: [start, 1]}, "not named by a payload hash: 'aaa"),
        ({good[:-1] + "g": [start, 1]}, "not named by a payload hash"),
        ({good: [start]}, "place is not [offset, length]: [" + str(start)),
        ({good: {"offset": 1}}, "place is not [offset, length]: {'offset': 1}"),
        ({good: [start, True]}, f"place is not [offset, length]: [{start}, True]"),
        ({good: [start, -1]}, f"place is not [offset, length]: [{start}, -1]"),
        ({good: [float(start), 1]}, "place is not [offset, length]"),
        ({good: [start, "1"]}, "place is not [offset, length]"),
        ({good: [0, 1]}, f"member {good} lies outside the pack"),  # inside the header
        ({good: [start, 10_000]}, f"member {good} lies outside the pack"),  # past the end
        ([good], "its members are not a table"),
    ]:
        with pytest.raises(CorruptCaptureError, match=re.escape(problem)):
            read_header(_pack_bytes(members), "pack")
    assert read_header(_pack_bytes({}), "pack") == {}
