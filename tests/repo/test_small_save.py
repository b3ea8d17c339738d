"""One more small version (issue 37): what a save does to the disk stays the durability protocol
(three fsyncs, on the right files, in the right order), and what it no longer repeats (a second read
of the index head, the signing key found again) loses no concurrent writer's update."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

import modulelens
from modulelens.format.provenance import PROVENANCE_FIELD, key_id, user_key
from modulelens.repo.local import LocalStore
from modulelens.repo.trust import own_capture


def _save(repo: modulelens.Repo, name: str) -> None:
    module = nn.Linear(4, 4)
    with modulelens.capture(module, targets="Linear", repo=repo, name=name):
        module(torch.randn(2, 4))


def _again(repo: modulelens.Repo, name: str, tag: str) -> modulelens.VersionInfo:
    """One more version of ``name`` whose payloads are all stored already (a small save)."""
    meta = repo.read_metadata(name, 1)
    stored = repo.payloads(repo.read_metadata(name, 1))
    payloads = {tid: memoryview(stored.read_bytes(e)) for tid, e in meta["tensors"].items() if e.get("payload")}
    for entry in meta["tensors"].values():
        entry.pop("pack", None)
    meta.pop("packs", None)
    meta.pop(PROVENANCE_FIELD, None)
    meta["tags"] = [tag]
    return repo.save_version(name, meta, payloads)


def test_a_small_save_flushes_capture_json_its_folder_and_versions_then_nothing_else(
        repo: modulelens.Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three fsyncs, as the floor (a safetensors file, its folder, a JSON-lines index): the capture
    file through the descriptor that wrote it, the staging folder, then ``versions/`` after the
    rename that publishes it (docs/repo-layout.md, "Durability")."""
    _save(repo, "lin")
    flushed: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setenv("MODULELENS_FSYNC", "1")
    monkeypatch.setattr(os, "fsync", fsync)
    info = _again(repo, "lin", "more")
    assert info.version == 2
    root = os.path.realpath(repo.root)
    staging = os.path.dirname(flushed[0])
    assert staging.startswith(f"{root}/tmp/") and staging.endswith(".version")
    assert flushed == [f"{staging}/capture.json", staging, f"{root}/names/lin/versions"]
    assert repo.read_metadata("lin", 2)["tags"] == ["more"]
    assert repo.fsck().clean


def test_a_writer_between_a_saves_reserve_and_finish_loses_nothing(repo: modulelens.Repo,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A save's finish starts from the head its reserve stored; another writer that changed the
    head meanwhile (its own save, an alias) is found by the swap's compare, and nothing of it is lost."""
    _save(repo, "lin")
    other = modulelens.Repo(repo.root)
    publish = LocalStore.publish
    interleaved: list[int] = []

    def publish_then_another_writer(self: LocalStore, *args: object, **kwargs: object) -> bool:
        done = publish(self, *args, **kwargs)  # type: ignore[arg-type]
        if self is repo.store and not interleaved:
            interleaved.append(_again(other, "lin", "between").version)  # reserves, publishes, finishes
            other.set_alias("lin:v1", "golden")
        return done

    monkeypatch.setattr(LocalStore, "publish", publish_then_another_writer)
    mine = _again(repo, "lin", "mine")
    assert (mine.version, interleaved) == (2, [3])
    fresh = modulelens.Repo(repo.root)
    listed = {i.version: (i.tags, i.aliases) for i in fresh.list("lin")}
    assert listed == {1: ((), ("golden",)), 2: (("mine",), ()), 3: (("between",), ("latest",))}
    head = fresh._summaries.head("lin", "names/lin")
    assert (head.used, head.latest, head.count, head.reserved) == (3, 3, 3, {})
    assert fresh.fsck().clean
    monkeypatch.undo()
    assert _again(repo, "lin", "next").version == 4  # the object that was interrupted saves on


def test_saves_are_signed_with_the_key_the_environment_names_now(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sealer is kept per Repo, but per key location: a process that points XDG_CONFIG_HOME
    elsewhere signs its next save with that key, and a capture saved with either loads as its own
    only under the key that signed it."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "first"))
    repo = modulelens.Repo(tmp_path / "repo")
    _save(repo, "lin")
    _again(repo, "lin", "same key")
    first = key_id(user_key())
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "second"))
    _again(repo, "lin", "new key")
    second = key_id(user_key())
    signed = [repo.read_metadata("lin", v)[PROVENANCE_FIELD]["key"] for v in (1, 2, 3)]
    assert first != second and signed == [first, first, second]
    assert own_capture(repo.root, "lin", 3, repo.read_metadata("lin", 3)).own
    assert not own_capture(repo.root, "lin", 2, repo.read_metadata("lin", 2)).own  # the first key's, not this one


@pytest.mark.parametrize("planted", ["link", "fifo", "socket"])
def test_an_entry_planted_at_the_index_head_is_replaced_never_followed_or_blocking(
        repo: modulelens.Repo, tmp_path: Path, planted: str) -> None:
    """The head is compared and rewritten through one descriptor opened without following a link
    and without blocking: a link, a FIFO or a socket planted where it was is never written
    through, and the save replaces it with a real head (by a rename), as before that change."""
    import socket

    _save(repo, "lin")
    head = repo.root / "names" / "lin" / "summary.json"
    outside = tmp_path / "outside.json"
    outside.write_text("theirs")
    head.unlink()
    if planted == "link":
        head.symlink_to(outside)
    elif planted == "fifo":
        os.mkfifo(head)
    else:
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(head))
    fresh = modulelens.Repo(repo.root)  # no head kept from an earlier save: it is read
    assert _again(fresh, "lin", "after").version == 2
    assert head.is_file() and not head.is_symlink() and outside.read_text() == "theirs"
    assert [i.version for i in modulelens.Repo(repo.root).list("lin")] == [1, 2]
    assert _again(fresh, "lin", "again").version == 3  # (then from the head it stored)
