"""Hostile and damaged repos (issue 21, defects 2, 3, 4, 5 and 7a): forged verification markers,
copies between repos, pack headers that lie, links at every path of the layout, one damaged file.

Every case of ``stress/hostile_repo2.py`` runs here through every consumer (load, ``ls``,
``show``, ``diff``, ``push``, ``pull``, a save, ``gc``, ``fsck``, ``fsck --repair`` and everything
again after the repair); the focused tests below pin the behaviours one at a time.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import modulelens
from modulelens.errors import CorruptCaptureError
from modulelens.format.provenance import user_key
from modulelens.interfaces.cli import app
from modulelens.repo.layout import LAYOUT_VERSION
from modulelens.repo.markers import MarkerKey, marker_path, sampled_check, split_marker, write_marker
from modulelens.repo.trust import repo_identity
from stress.hostile_repo2 import CASES, Setup, Template, _flip, full_disk_outcome, make_template, run_case
from stress.hostile_trust import as_user


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Template]:
    tmp = tmp_path_factory.mktemp("hostile")
    with as_user(tmp / "config"):
        yield make_template(tmp)


@pytest.fixture
def user(template: Template) -> Iterator[None]:
    """The user who made the template (their signing key, so their markers)."""
    with as_user(template.root.parent / "config"):
        yield


@pytest.fixture
def setup(tmp_path: Path, template: Template, user: None) -> Setup:
    """A received copy of the template (``repo``) and the user's own repo (``user``)."""
    made = Setup(tmp_path / "case", template)
    made.case.mkdir()
    made.outside.mkdir()
    shutil.copytree(template.root, made.root, symlinks=True)
    shutil.copytree(template.user, made.user, symlinks=True)
    return made


@pytest.mark.parametrize("case", CASES, ids=[f"{c.defect}: {c.label}" for c in CASES])
def test_every_consumer_survives_the_hostile_repo(case, tmp_path: Path, template: Template, user: None) -> None:
    outcome = run_case(case, tmp_path / "case", template)
    assert outcome.attempts > 30
    assert outcome.issues == []


def test_a_pull_onto_a_full_disk_is_a_storage_error(tmp_path: Path, template: Template, user: None) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    outcome = full_disk_outcome(tmp_path, template)
    assert outcome.issues == [] and outcome.attempts == 3


# ------------------------------------------------------------------------------------ defect 2


def _weight(repo: modulelens.Repo, name: str = "big") -> tuple[str, Path]:
    meta = repo.read_metadata(*repo.resolve(name))
    digest = next(e["payload"] for e in meta["tensors"].values() if e.get("payload") and "pack" not in e)
    return digest, repo.blob_path(digest)


def test_a_marker_is_bound_to_its_repo_and_user(setup: Setup) -> None:
    repo = modulelens.Repo(setup.root)
    _, blob = _weight(repo)
    assert modulelens.load("big", repo=repo).module is not None  # a received repo: hashed in full, then marked
    record, mac, digests = split_marker(marker_path(blob).read_bytes())
    assert json.loads(record)["marker"] == 3 and len(mac) == 64
    assert len(digests) == 8 * -(-blob.stat().st_size // json.loads(record)["chunk"])  # one xxh3-64 per chunk
    key = MarkerKey.derive(user_key(), repo_identity(setup.root))
    assert key.mac(blob.name, record, digests) == mac
    assert key.mac(blob.name, record, bytes(len(digests))) != mac  # the chunk hashes are under the MAC too
    other = MarkerKey.derive(b"k" * 32, repo_identity(setup.root))  # another user's key
    assert other.mac(blob.name, record, digests) != mac
    elsewhere = MarkerKey.derive(user_key(), {**repo_identity(setup.root), "inode": 1})  # another directory
    assert elsewhere.mac(blob.name, record, digests) != mac


def test_a_marker_vouched_for_once_is_read_again_when_it_changes(setup: Setup) -> None:
    """A load keeps the marker records whose MAC it checked (by blob and marker identity): a marker
    replaced afterwards by one no key of this user made is read again and not trusted, whatever
    this process trusted before."""
    repo = modulelens.Repo(setup.root)
    _, blob = _weight(repo)
    assert modulelens.load("big", repo=repo).module is not None  # a received repo: hashed, then marked
    key = MarkerKey.derive(user_key(), repo_identity(setup.root))
    assert sampled_check(blob, os.stat(blob), key) is True  # vouched for, and remembered
    record, mac, digests = split_marker(marker_path(blob).read_bytes())
    forged = json.dumps({**json.loads(record), "checked": 0.0}).encode()
    marker_path(blob).write_bytes(b"\n".join((forged, mac, digests)))  # the old MAC: not this record's
    assert sampled_check(blob, os.stat(blob), key) is None


def test_a_marker_that_came_with_the_repo_is_not_trusted(setup: Setup) -> None:
    """The sender alters a blob and records a marker for it with their own key and repo; the user's
    load hashes it in full and refuses it, on every load, and so do pull and fsck."""
    _, blob = _weight(modulelens.Repo(setup.root))
    sender = setup.case / "sender"
    shutil.copytree(setup.root, sender, symlinks=True)
    sent_blob = sender / blob.relative_to(setup.root)
    with as_user(setup.case / "sender-config"):
        _flip(sent_blob, 3 << 20)
        write_marker(sent_blob, MarkerKey.derive(user_key(create=True), repo_identity(sender)))
    received = setup.case / "received"
    shutil.copytree(sender, received, symlinks=True)  # times kept, as cp -a or a tarball
    for _ in range(2):
        with pytest.raises(CorruptCaptureError, match="hashes to"):
            modulelens.load("big", repo=modulelens.Repo(received)).module  # noqa: B018
    with pytest.raises(CorruptCaptureError, match="hashes to"):
        modulelens.Repo(setup.user).pull(received, "big")
    assert "big" not in modulelens.Repo(setup.user).names()
    assert not modulelens.Repo(received).fsck().clean


def test_a_change_that_puts_the_mtime_back_is_found_on_the_next_load(setup: Setup) -> None:
    repo = modulelens.Repo(setup.root)
    _, blob = _weight(repo)
    assert modulelens.load("big", repo=repo).replay().passed  # marked for this repo and user
    _flip(blob, 3 << 20)  # 5 MiB: the sampled chunks would see this one chunk 8 times in 80; the ctime always
    with pytest.raises(CorruptCaptureError, match="hashes to"):
        modulelens.load("big", repo=modulelens.Repo(setup.root)).module  # noqa: B018


def test_push_and_pull_copy_every_byte_hashed_and_never_link(setup: Setup) -> None:
    source = modulelens.Repo(setup.root)
    pulled = modulelens.Repo(setup.user)
    pulled.pull(source, "big")
    pushed = setup.case / "pushed"
    source.push("big", pushed)
    digest, blob = _weight(source)
    for target in (pulled, modulelens.Repo(pushed)):
        copy = target.blob_path(digest)
        assert os.stat(copy).st_nlink == 1 and os.stat(copy).st_ino != os.stat(blob).st_ino
        assert modulelens.load("big", repo=target, verify=True).replay().passed


def test_a_save_never_dedups_against_a_blob_that_does_not_verify(setup: Setup, template: Template) -> None:
    """A received repo holds a damaged blob under the name of the user's weights (and a marker
    matching it): saving those weights writes them again, and the capture loads."""
    repo = modulelens.Repo(setup.root)
    _, blob = _weight(repo)
    _flip(blob, 3 << 20)
    meta = json.loads(json.dumps(template.big_meta))
    info = repo.save_version("mine/big", meta, {t: memoryview(d) for t, d in template.big_payloads.items()})
    cap = modulelens.load(info.ref, repo=modulelens.Repo(setup.root))
    assert cap.replay().passed
    assert modulelens.load("big", repo=repo, verify=True).replay().passed  # the old version is whole again too


# ------------------------------------------------------------------------------------ defect 3


def test_diff_says_which_tensors_it_compared_by_their_recorded_hash(setup: Setup) -> None:
    result = CliRunner().invoke(app, ["diff", "small", "copy/small", "--repo", str(setup.root)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # (rich wraps the note)
    assert "2/2 tensors identical" in text
    assert "note: 2 tensors with the same recorded payload hash in A and B were compared by that hash" in text


def test_a_pack_member_pointing_at_another_members_bytes_is_refused(setup: Setup) -> None:
    from stress.hostile_repo2 import _member_swap, _rewrite_pack

    _rewrite_pack(setup, "small", _member_swap)
    repo = modulelens.Repo(setup.root)
    with pytest.raises(CorruptCaptureError, match="does not match its hash"):
        modulelens.load("small", repo=repo).module  # noqa: B018
    result = CliRunner().invoke(app, ["diff", "small", "copy/small", "--repo", str(setup.root), "--no-outputs"])
    assert result.exit_code == 3 and "does not match its hash" in result.stderr
    assert not repo.fsck().clean


# ------------------------------------------------------------------------------------ defects 4 and 5


def test_a_linked_lock_refuses_writes_in_one_line_and_the_repair_moves_it(setup: Setup, template: Template) -> None:
    outside = setup.outside / "lock"
    outside.write_text("")
    (setup.root / "lock").unlink(missing_ok=True)
    (setup.root / "lock").symlink_to(outside)
    result = CliRunner().invoke(app, ["gc", "--repo", str(setup.root)])
    assert result.exit_code == 3 and len(result.stderr.strip().splitlines()) == 1
    assert "lock is not a regular file" in result.stderr and "fsck --repair" in result.stderr
    assert CliRunner().invoke(app, ["ls", "--repo", str(setup.root)]).exit_code == 0  # reading takes no lock
    repaired = CliRunner().invoke(app, ["fsck", "--repair", "--repo", str(setup.root)])
    assert repaired.exit_code == 0, repaired.output
    assert not (setup.root / "lock").is_symlink() and outside.read_text() == ""
    assert CliRunner().invoke(app, ["gc", "--repo", str(setup.root)]).exit_code == 0


def test_a_damaged_layout_marker_leaves_the_repo_readable_and_the_repair_rewrites_it(setup: Setup) -> None:
    (setup.root / "modulelens-repo.json").write_text('{"layout_version": "2"}')
    repo = modulelens.Repo(setup.root)
    assert "modulelens-repo.json: unreadable repo marker" in repo.layout_problem
    assert {info.name for info in repo.list()} >= {"small", "big", "other/bystander"}
    assert modulelens.load("small", repo=repo).replay().passed
    with pytest.raises(CorruptCaptureError, match="fsck --repair"):
        repo.set_alias("small", "golden")
    report = repo.fsck(repair=True)
    assert report.clean and any(p.path == "modulelens-repo.json" for p in report.problems)
    assert json.loads((setup.root / "modulelens-repo.json").read_text()) == {"layout_version": LAYOUT_VERSION}
    assert modulelens.Repo(setup.root).set_alias("small", "golden").version == 1


def test_top_level_links_are_never_written_through(setup: Setup) -> None:
    for folder in ("names", "blobs", "tmp"):
        target = setup.outside / folder
        shutil.move(str(setup.root / folder), str(target))
        (setup.root / folder).symlink_to(target, target_is_directory=True)
    before = sorted((str(p), p.stat().st_mtime_ns) for p in setup.outside.rglob("*"))
    repo = modulelens.Repo(setup.root)
    with pytest.raises(CorruptCaptureError, match="symbolic link"):
        repo.list()
    with pytest.raises(CorruptCaptureError, match="symbolic link"):
        repo.gc()
    report = repo.fsck(repair=True)
    assert report.clean and {"names", "blobs", "tmp"} <= {p.path for p in report.problems}
    assert sorted((str(p), p.stat().st_mtime_ns) for p in setup.outside.rglob("*")) == before
    module = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with modulelens.capture(module, targets=["0"], repo=repo, name="fresh", strict=True):
        module(torch.randn(1, 2))
    assert [info.name for info in modulelens.Repo(setup.root).list()] == ["fresh/0"]



def test_a_user_without_a_key_gets_one_at_the_first_marker_and_fast_loads_after(setup: Setup, tmp_path: Path) -> None:
    """A user who never saved (a teammate's captures, a remote repo's cache) has no signing key; the
    first full check of a large blob makes it, so later loads trust this user's marker."""
    config = tmp_path / "consumer-config"
    with as_user(config):
        repo = modulelens.Repo(setup.root)
        _, blob = _weight(repo)
        assert modulelens.load("big", repo=repo).replay().passed  # hashed in full, then marked
        key = MarkerKey.derive(user_key(), repo_identity(setup.root))  # made by that load
        record, mac, digests = split_marker(marker_path(blob).read_bytes())
        assert key.mac(blob.name, record, digests) == mac
        assert sampled_check(blob, os.stat(blob), key) is True  # the next load samples instead of hashing
