"""Damaged or hostile metadata is a CorruptCaptureError naming the field, never a wrong tensor,
an unrelated exception, a hang or a huge allocation; bit rot in large payloads is caught on load."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from bit_rot import rot

import modulelens
from modulelens.format.validate import validate_capture
from modulelens.repo.index import SUMMARY_FILE


class Views(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sum() + y.sum()


@pytest.fixture
def views_capture(repo: modulelens.Repo) -> tuple[modulelens.Repo, str, Path]:
    """A capture whose two inputs are views of one storage (stored as one payload + views)."""
    with modulelens.track_init():
        model = torch.nn.Sequential(Views(), torch.nn.Linear(2, 2))
    base = torch.arange(12.0)
    with modulelens.capture(model, targets=["0"], repo=repo, name="v") as cap:
        model[0](base[:6].view(2, 3), base[2:8].view(3, 2))
    ref = cap.saved[0].ref
    name, version = repo.resolve(ref)
    return repo, ref, repo.version_path(name, version) / "capture.json"


def edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


def view_ids(meta: dict[str, Any]) -> list[str]:
    return [tid for tid, e in meta["tensors"].items() if "view_of" in e]


def payload_ids(meta: dict[str, Any]) -> list[str]:
    return [tid for tid, e in meta["tensors"].items() if "payload" in e]


CASES: dict[str, Callable[[dict[str, Any]], None]] = {
    "view dtype differs from its base": lambda m: m["tensors"][view_ids(m)[0]].update(dtype="int32"),
    "view reaches past its base": lambda m: m["tensors"][view_ids(m)[0]].update(storage_offset=100),
    "view of a view": lambda m: m["tensors"][view_ids(m)[0]].update(view_of=view_ids(m)[1]),
    "view of a missing tensor": lambda m: m["tensors"][view_ids(m)[0]].update(view_of="t999"),
    "shape smaller than the payload": lambda m: m["tensors"][payload_ids(m)[0]].update(shape=[1]),
    "shape larger than the payload": lambda m: m["tensors"][payload_ids(m)[0]].update(shape=[1000]),
    "huge stride": lambda m: m["tensors"][payload_ids(m)[0]].update(stride=[1 << 40]),
    "unknown dtype": lambda m: m["tensors"][payload_ids(m)[0]].update(dtype="float128"),
    "address offset past its boundary": lambda m: m["tensors"][payload_ids(m)[0]].update(address_offset=64),
    "negative size": lambda m: m["tensors"][payload_ids(m)[0]].update(shape=[-12]),
    "boolean size": lambda m: m["tensors"][payload_ids(m)[0]].update(shape=[True]),
    "huge rank": lambda m: m["tensors"][payload_ids(m)[0]].update(shape=[1] * 1000),
    "leaf count": lambda m: m["calls"][0]["inputs"]["leaves"].pop(),
    "dangling tensor id": lambda m: m["calls"][0]["inputs"]["leaves"].__setitem__(0, {"$type": "tensor", "id": "zz"}),
    "unknown value tag": lambda m: m["calls"][0]["inputs"]["leaves"].__setitem__(0, {"$type": "pickle"}),
    "deep nesting": lambda m: m["calls"][0]["inputs"]["leaves"].__setitem__(0, json.loads("[" * 500 + "]" * 500)),
    "state out of range": lambda m: m["calls"][0].update(state=7),
    "construction cycle": lambda m: m["constructions"][m["module"]["construction"]]["args"].append(
        {"$type": "module", "ref": m["module"]["construction"]}),
    "missing tensors table": lambda m: m.pop("tensors"),
    "string where a list belongs": lambda m: m.update(calls="many"),
}


@pytest.mark.parametrize("label", list(CASES))
def test_damaged_metadata_is_a_corrupt_capture_error(views_capture: tuple[modulelens.Repo, str, Path],
                                                     label: str) -> None:
    repo, ref, path = views_capture
    edit(path, CASES[label])
    with pytest.raises(modulelens.CorruptCaptureError, match=r"capture\.json"):
        cap = modulelens.load(ref, repo=repo)
        _ = [(c.args, c.output) for c in cap.calls]


def test_metadata_checked_once_is_checked_again_when_its_bytes_change(
        views_capture: tuple[modulelens.Repo, str, Path]) -> None:
    """A load skips checking a capture.json this process found valid (the same bytes); the same
    file damaged afterwards is checked again and refused."""
    repo, ref, path = views_capture
    assert modulelens.load(ref, repo=repo).replay().passed  # checked, and remembered as valid
    assert modulelens.load(ref, repo=repo).replay().passed  # the same bytes: not checked again
    edit(path, CASES["view reaches past its base"])
    with pytest.raises(modulelens.CorruptCaptureError, match=r"capture\.json"):
        modulelens.load(ref, repo=repo)


def test_views_load_as_recorded(views_capture: tuple[modulelens.Repo, str, Path]) -> None:
    repo, ref, _path = views_capture
    cap = modulelens.load(ref, repo=repo)
    x, y = cap.calls[0].args
    assert torch.equal(x, torch.arange(6.0).view(2, 3)) and torch.equal(y, torch.arange(2.0, 8.0).view(3, 2))


def test_not_json_and_not_a_capture(views_capture: tuple[modulelens.Repo, str, Path]) -> None:
    repo, ref, path = views_capture
    for text in (b"\xff\xfe\x00garbage", b"[1, 2]", b"{" * 100000):
        path.write_bytes(text)
        with pytest.raises(modulelens.CorruptCaptureError):
            modulelens.load(ref, repo=repo)


def test_validate_accepts_the_golden_capture() -> None:
    golden = Path(__file__).parent / "golden_v1" / "repo" / "names" / "golden" / "versions" / "1" / "capture.json"
    meta = json.loads(golden.read_text())
    assert validate_capture(meta, "golden") is meta


def test_bit_rot_with_kept_mtime_is_caught_by_the_sampled_check(repo: modulelens.Repo) -> None:
    with modulelens.track_init():
        model = torch.nn.Sequential(torch.nn.Linear(512, 1024))  # 2 MiB of weights: a marked payload
    with modulelens.capture(model, targets=["0"], repo=repo, name="big") as cap:
        model(torch.randn(1, 512))
    ref = cap.saved[0].ref
    assert modulelens.load(ref, repo=repo).replay().passed
    meta = repo.read_metadata(*repo.resolve(ref))
    digest = next(e["payload"] for e in meta["tensors"].values() if e.get("nbytes", 0) >= 1 << 21)
    blob = repo.blob_path(digest)
    assert blob.with_name(blob.name + ".ok").exists()
    rot(repo, blob, list(range(1000, 1 << 21, 64 << 10)))  # a bit in every chunk; size, mtime, ctime kept
    with pytest.raises(modulelens.CorruptCaptureError, match="sampled chunk"):
        _ = modulelens.load(ref, repo=repo).module


def test_a_change_that_restores_the_mtime_is_found_by_the_ctime(repo: modulelens.Repo) -> None:
    with modulelens.track_init():
        model = torch.nn.Sequential(torch.nn.Linear(512, 1024))
    with modulelens.capture(model, targets=["0"], repo=repo, name="big") as cap:
        model(torch.randn(1, 512))
    ref = cap.saved[0].ref
    meta = repo.read_metadata(*repo.resolve(ref))
    blob = repo.blob_path(next(e["payload"] for e in meta["tensors"].values() if e.get("nbytes", 0) >= 1 << 21))
    info = blob.stat()
    blob.chmod(0o644)
    with open(blob, "r+b") as handle:  # a write that puts the mtime back: the marker's ctime no longer matches
        handle.seek(1_500_000)
        byte = handle.read(1)
        handle.seek(1_500_000)
        handle.write(bytes([byte[0] ^ 0x01]))
    os.utime(blob, ns=(info.st_atime_ns, info.st_mtime_ns))
    with pytest.raises(modulelens.CorruptCaptureError, match="hashes to"):
        _ = modulelens.load(ref, repo=repo).module


def test_a_damaged_version_is_listed_and_gc_keeps_its_payloads(views_capture: tuple[modulelens.Repo, str, Path]) -> None:
    repo, ref, path = views_capture
    with modulelens.track_init():
        model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with modulelens.capture(model, targets=["0"], repo=repo, name="healthy") as cap:
        model(torch.randn(1, 2))
    original = path.read_bytes()
    edit(path, lambda m: m.pop("calls"))
    assert {info.ref for info in repo.list()} >= {ref, cap.saved[0].ref}  # listing reads summaries, not captures
    (path.parents[2] / SUMMARY_FILE).unlink()  # a rebuilt summary reads the damaged file: it must still list
    infos = {info.ref: info for info in modulelens.Repo(repo.root).list()}
    assert infos[cap.saved[0].ref].problem is None
    assert "missing 'calls'" in infos[ref].problem and infos[ref].to_dict()["problem"] == infos[ref].problem
    report = modulelens.Repo(repo.root).gc(tmp_age_s=0)
    assert report.removed_blobs == 0
    path.write_bytes(original)  # repaired: everything it needs is still there (blobs and packs alike)
    assert modulelens.load(ref, repo=modulelens.Repo(repo.root)).replay().passed


def test_the_fast_check_of_usual_tensor_entries_accepts_only_what_the_full_check_accepts() -> None:
    """The table of a load of thousands of small tensors is checked a faster way for the usual
    entry (validate.py, plain_payload): every entry it lets through must pass the checks one by
    one, and each damage must still be found with its field's name. Mutations of a packed entry,
    one field at a time, with the values damaged metadata and hostile files hold."""
    from modulelens.errors import CorruptCaptureError
    from modulelens.format.validate import _Checker

    good = {"dtype": "float32", "shape": [16, 32], "stride": [32, 1], "device": "cpu",
            "payload": "blake3:" + "ab" * 32, "nbytes": 2048, "pack": 0}
    values: list[Any] = [None, True, False, 0, 1, -1, 2, 3.0, "0", "float32", "qint8", "bfloat16", [], [16], [16, 32],
                         [32, 1], [1, 32], [16, -32], [16, True], [16, 32.0], [16, 1 << 51], [0, 32], [64, 64],
                         [1] * 65, {}, 2048, 1024, 4096, 1 << 60, "blake3:" + "cd" * 32]
    outcomes = {"accepted": 0, "refused": 0}
    for key in [*good, "view_of", "shape_only", "requires_grad", "quantized", "storage_offset", "address_offset"]:
        for value in [*values, "absent"]:
            entry = dict(good)
            if value == "absent":
                entry.pop(key, None)
            else:
                entry[key] = value
            meta = {"format_version": 2, "tensors": {"t0": entry, "base": dict(good)},
                    "packs": [{"payload": "blake3:" + "ef" * 32, "nbytes": 9000}]}
            checker = _Checker(meta, "capture")
            try:
                checker.tensors()
            except CorruptCaptureError as error:
                assert "tensors[" in str(error) or "packs" in str(error), (key, value, error)
                outcomes["refused"] += 1
                continue
            outcomes["accepted"] += 1
            if checker.plain_payload(entry):  # what the fast check let through passes every check one by one
                checker.tensor("t0", entry)
    assert outcomes["accepted"] > 20 and outcomes["refused"] > 200, outcomes
