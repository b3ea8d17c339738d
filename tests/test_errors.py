"""Damaged data and unsupported values give clear errors, never silent substitutes."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import warnings
from pathlib import Path
from unittest import mock

import pytest
import torch
from bit_rot import rot
from child_process import PYTHON, subprocess_env
from modules_for_tests import Opaque, TakesOpaque
from torch import nn

import modulelens
from modulelens.format.provenance import user_key
from modulelens.repo.markers import SAMPLED_CHUNKS, MarkerKey, sampled_check, split_marker
from modulelens.repo.trust import repo_identity
from modulelens.tracing.init_tracking import stop_tracking, track_init


def _capture_linear(repo: modulelens.Repo, name: str = "lin") -> modulelens.VersionInfo:
    module = nn.Linear(64, 32)
    with modulelens.capture(module, targets="Linear", repo=repo, name=name) as cap:
        module(torch.randn(4, 64))
    return cap.saved[0]


def test_corrupted_payload_is_detected(repo: modulelens.Repo) -> None:
    info = _capture_linear(repo)
    meta = repo.read_metadata("lin", 1)
    weight = meta["tensors"][meta["states"][0]["parameters"]["weight"]["tensor"]]
    path = repo.blob_path(meta["packs"][weight["pack"]]["payload"])  # an 8 KiB weight is packed
    os.chmod(path, 0o644)
    with open(path, "r+b") as handle:  # the last member's last bytes
        handle.seek(-4, os.SEEK_END)
        handle.write(b"\xff\xff\xff\xff")
    with pytest.raises(modulelens.CorruptCaptureError, match="corrupted"):
        modulelens.load(info.ref, repo=repo).module  # noqa: B018
    result = subprocess.run([PYTHON, "-m", "modulelens", "replay", info.ref, "--repo", str(repo.root)],
                            capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert result.returncode == modulelens.CorruptCaptureError.exit_code
    assert "corrupted" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2


def test_corrupted_large_payload_is_detected_through_its_changed_mtime(repo: modulelens.Repo) -> None:
    module = nn.Linear(1024, 512)  # a 2 MiB weight: verified once, then trusted by size and mtime
    with modulelens.capture(module, targets="Linear", repo=repo, name="big"):
        module(torch.randn(2, 1024))
    meta = repo.read_metadata("big", 1)
    weight = meta["tensors"][meta["states"][0]["parameters"]["weight"]["tensor"]]
    path = repo.blob_path(weight["payload"])
    assert path.with_name(path.name + ".ok").exists()
    assert modulelens.load("big", repo=repo).replay().passed  # trusted: no re-hash needed
    os.chmod(path, 0o644)
    with open(path, "r+b") as handle:  # same size, new content, written right away
        handle.seek(1 << 20)
        handle.write(b"\x00\x01\x02\x03")
    with pytest.raises(modulelens.CorruptCaptureError, match="corrupted"):
        modulelens.load("big", repo=repo).module  # noqa: B018


def _weight_blob(repo: modulelens.Repo, name: str, module: nn.Module, x: torch.Tensor) -> Path:
    with modulelens.capture(module, targets=type(module).__name__, repo=repo, name=name):
        module(x)
    meta = repo.read_metadata(name, 1)
    weight = meta["tensors"][meta["states"][0]["parameters"]["weight"]["tensor"]]
    return repo.blob_path(weight["payload"])


def test_a_marked_payload_of_a_few_mib_is_sampled_like_a_large_one(repo: modulelens.Repo) -> None:
    """A model in many 4 MiB weight files loads in time flat in their number (repo/markers.py): two
    chunks of each are checked, not all of them; damage in every chunk is seen by any sample."""
    path = _weight_blob(repo, "rot", nn.Linear(1024, 1024), torch.randn(2, 1024))  # 4 MiB: 64 chunks of 64 KiB
    assert modulelens.load("rot", repo=repo).replay().passed
    read: list[int] = []
    real_preadv = os.preadv

    def counted(fd: int, buffers: list[bytearray], offset: int) -> int:
        read.append(offset)
        return real_preadv(fd, buffers, offset)

    with mock.patch.object(os, "preadv", counted):
        modulelens.load("rot", repo=repo).module  # noqa: B018
    assert len(read) == SAMPLED_CHUNKS
    rot(repo, path, list(range(1000, path.stat().st_size, 64 << 10)))  # damage in every chunk
    with pytest.raises(modulelens.CorruptCaptureError, match="sampled chunk"):
        modulelens.load("rot", repo=repo).module  # noqa: B018


def test_a_load_asks_the_disk_for_every_sampled_chunk_first_and_then_checks_those(repo: modulelens.Repo) -> None:
    """Cold, a load waited for each weight file's marker and chunk in turn; it now asks for all of
    them at once (POSIX_FADV_WILLNEED) and the checks then read exactly the chunks it asked for."""
    with modulelens.track_init():
        model = nn.Sequential(*[nn.Linear(1024, 1024, bias=False) for _ in range(3)])  # 3 weights of 4 MiB
    with modulelens.capture(model, targets=".", repo=repo, name="three"):
        model(torch.randn(2, 1024))
    modulelens.load("three", repo=repo).module  # noqa: B018  (marks them)
    events: list[tuple[str, str, int]] = []
    real_fadvise, real_preadv = os.posix_fadvise, os.preadv

    def fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        events.append(("ahead", os.readlink(f"/proc/self/fd/{fd}"), offset))
        real_fadvise(fd, offset, length, advice)

    def preadv(fd: int, buffers: list[bytearray], offset: int) -> int:
        events.append(("read", os.readlink(f"/proc/self/fd/{fd}"), offset))
        return real_preadv(fd, buffers, offset)

    with mock.patch.object(os, "posix_fadvise", fadvise), mock.patch.object(os, "preadv", preadv):
        loaded = modulelens.load("three", repo=repo)  # asks, while the rest of the load goes on
        loaded.module  # noqa: B018  (checks)
    assert loaded.replay().passed
    kinds = [kind for kind, _, _ in events]
    assert kinds.index("read") > len(kinds) - kinds[::-1].index("ahead") - 1  # every hint before any check
    asked = {(path, offset) for kind, path, offset in events if kind == "ahead" and not path.endswith(".ok")}
    read = [(path, offset) for kind, path, offset in events if kind == "read"]
    assert len(read) == 3 * SAMPLED_CHUNKS
    assert set(read) == asked  # each check reads the chunks it asked for
    assert sum(path.endswith(".ok") for kind, path, _ in events if kind == "ahead") == 3


def test_bit_rot_in_a_large_payload_is_caught_by_the_sampled_chunks(repo: modulelens.Repo) -> None:
    path = _weight_blob(repo, "rot", nn.Linear(2048, 2048), torch.randn(2, 2048))  # 16 MiB: 256 chunks of 64 KiB
    record, _, digests = split_marker(path.with_name(path.name + ".ok").read_bytes())
    assert (json.loads(record)["chunk"], len(digests)) == (64 << 10, 256 * 8)
    rot(repo, path, list(range(1000, path.stat().st_size, 64 << 10)))  # damage in every chunk: any sample sees it
    with pytest.raises(modulelens.CorruptCaptureError, match="sampled chunk"):
        modulelens.load("rot", repo=repo).module  # noqa: B018
    with pytest.raises(modulelens.CorruptCaptureError, match="hashes to"):
        modulelens.load("rot", repo=repo, verify=True).module  # noqa: B018


def test_a_marker_of_the_older_layout_is_replaced_after_a_full_check(repo: modulelens.Repo) -> None:
    path = _weight_blob(repo, "old", nn.Linear(1024, 512), torch.randn(2, 1024))
    marker_path = path.with_name(path.name + ".ok")
    marker = json.loads(split_marker(marker_path.read_bytes())[0])
    marker.update(chunk=1 << 20, chunks=["0" * 16, "0" * 16])  # 1 MiB chunks as a list, no MAC: what earlier versions wrote
    os.unlink(marker_path)
    marker_path.write_text(json.dumps(marker))
    assert modulelens.load("old", repo=repo).replay().passed  # not this repo's marker: full hash, then a new marker
    assert json.loads(split_marker(marker_path.read_bytes())[0])["chunk"] == 64 << 10


def test_a_marker_of_version_2_is_hashed_in_full_once_and_marked_anew(repo: modulelens.Repo) -> None:
    """Version 2 kept the chunk hashes as hex inside the MAC'd JSON; a repo marked by it loads with
    one full hash per large blob (no error, no trust in a layout this code does not read), then
    samples again."""
    path = _weight_blob(repo, "v2", nn.Linear(1024, 512), torch.randn(2, 1024))
    marker_path = path.with_name(path.name + ".ok")
    record, _, digests = split_marker(marker_path.read_bytes())
    old = {**json.loads(record), "marker": 2, "chunks": digests.hex()}
    old_record = json.dumps(old).encode()
    key = MarkerKey.derive(user_key(), repo_identity(repo.root))
    old_mac = hmac.new(key.secret, b"\n".join((key.binding, path.name.encode(), old_record)), hashlib.sha256)
    os.unlink(marker_path)
    marker_path.write_bytes(old_record + b"\n" + old_mac.hexdigest().encode() + b"\n")  # as version 2 wrote it
    info = os.stat(path)
    assert sampled_check(path, info, key) is None  # not read as this layout: a full hash is due
    assert modulelens.load("v2", repo=repo).replay().passed
    assert json.loads(split_marker(marker_path.read_bytes())[0])["marker"] == 3
    assert sampled_check(path, os.stat(path), key) is True


def test_truncated_payload_is_detected(repo: modulelens.Repo) -> None:
    _capture_linear(repo)
    meta = repo.read_metadata("lin", 1)
    path = repo.blob_path(meta["packs"][0]["payload"])
    os.chmod(path, 0o644)
    os.truncate(path, 100)
    with pytest.raises(modulelens.CorruptCaptureError, match="truncated"):
        modulelens.load("lin", repo=repo).module  # noqa: B018


def test_full_verification_rehashes_everything(repo: modulelens.Repo) -> None:
    _capture_linear(repo)
    assert modulelens.load("lin", repo=repo, verify=True).replay().passed


def test_truncated_metadata_is_a_clear_error(repo: modulelens.Repo) -> None:
    info = _capture_linear(repo)
    meta = info.path / "capture.json"
    meta.write_text(meta.read_text()[:200])
    with pytest.raises(modulelens.CorruptCaptureError, match="not valid JSON"):
        modulelens.load("lin", repo=repo)
    result = subprocess.run([PYTHON, "-m", "modulelens", "show", "lin", "--repo", str(repo.root)],
                            capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert result.returncode == 3 and "Traceback" not in result.stderr and "not valid JSON" in result.stderr


def test_unsupported_constructor_argument_is_named_in_strict_mode(repo: modulelens.Repo) -> None:
    module = TakesOpaque(Opaque(3))
    with pytest.raises(modulelens.UnsupportedValueError, match=r"args\[0\].*Opaque"):
        with modulelens.capture(module, targets="TakesOpaque", repo=repo, name="opaque", strict=True):
            module(torch.randn(2, 4))


def test_unsupported_constructor_argument_is_recorded_by_attributes_and_said(repo: modulelens.Repo) -> None:
    # An argument no codec stores: the capture warns naming it and records the module by its attributes
    # (docs/fidelity.md "Rebuilt from recorded attributes"); the load rebuilds it without its constructor
    module = TakesOpaque(Opaque(3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with modulelens.capture(module, targets="TakesOpaque", repo=repo, name="opaque"):
            module(torch.randn(2, 4))
    said = [str(w.message) for w in caught if "recorded by their attributes" in str(w.message)]
    assert said and "Opaque" in said[0] and "args[0]" in said[0]
    loaded = modulelens.load("opaque", repo=repo)
    assert loaded.module.factor == 3
    assert any("rebuilt from its recorded attributes" in note for note in loaded.notes)
    assert loaded.replay().passed
    # init_args still rebuilds it through its constructor
    assert modulelens.load("opaque", repo=repo, init_args=(Opaque(3),)).replay().passed
    # a strict capture raises on the argument instead
    with pytest.raises(modulelens.UnsupportedValueError, match=r"args\[0\].*Opaque"):
        with modulelens.capture(module, targets="TakesOpaque", repo=repo, name="opaque-strict", strict=True):
            module(torch.randn(2, 4))


def test_module_built_before_tracking_needs_init_args(repo: modulelens.Repo) -> None:
    stop_tracking()
    try:
        module = nn.Linear(6, 2)
    finally:
        track_init()
    with modulelens.capture(module, targets="Linear", repo=repo, name="untracked"):
        module(torch.randn(1, 6))
    with pytest.raises(modulelens.RestoreError, match=r"before modulelens\.track_init"):
        modulelens.load("untracked", repo=repo).module  # noqa: B018
    capture = modulelens.load("untracked", repo=repo, init_args=(6, 2))
    assert capture.replay().passed


def test_unknown_capture_and_bad_names(repo: modulelens.Repo) -> None:
    with pytest.raises(modulelens.CaptureNotFoundError):
        modulelens.load("missing", repo=repo)
    for bad in ("../etc/passwd", "a/../b", "/abs", "a//b", ".hidden", "x:"):
        with pytest.raises(modulelens.InvalidNameError):
            modulelens.load(bad, repo=repo)
