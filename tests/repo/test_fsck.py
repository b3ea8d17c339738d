"""fsck: finds damage of every kind a repo can suffer, and --repair quarantines it without deleting."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import xxhash
from torch import nn
from typer.testing import CliRunner

import modulelens
from modulelens.interfaces.cli import app
from modulelens.repo.packs import referenced_blobs

runner = CliRunner()


def _save(repo: modulelens.Repo, name: str = "lin", size: int = 512) -> str:
    """A real capture: a 1 MiB weight (its own blob) and small payloads (a pack)."""
    module = nn.Linear(size, size)
    with modulelens.capture(module, targets="Linear", repo=repo, name=name) as cap:
        module(torch.randn(2, size))
    return cap.wait()[0].ref  # for a remote repo: the uploaded version, not the staged one


def _blobs(repo: modulelens.Repo, ref: str) -> tuple[Path, Path]:
    """(the loose 1 MiB blob, the pack) of a version."""
    meta = repo.read_metadata(*repo.resolve(ref))
    pack = repo.blob_path(meta["packs"][0]["payload"])
    loose = next(repo.blob_path(d) for d in referenced_blobs(meta) if repo.blob_path(d) != pack)
    return loose, pack


def _flip(path: Path, offset: int) -> None:
    """Flip one byte and keep the mtime, as bit rot does."""
    info = path.stat()
    os.chmod(path, 0o644)
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def _tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    return {str(p.relative_to(root)): (p.lstat().st_mode, p.lstat().st_mtime_ns, p.read_bytes() if p.is_file() else b"")
            for p in sorted(root.rglob("*"))}


def test_a_healthy_repo_is_clean_and_fsck_writes_nothing(repo: modulelens.Repo) -> None:
    _save(repo)
    _save(repo)
    repo.set_alias("lin:v1", "golden")
    before = _tree(repo.root)
    report = repo.fsck()
    assert report.clean, report.problems
    assert (report.names, report.versions) == (1, 2)
    assert report.payloads_checked >= 2 and report.bytes_checked >= 1 << 20
    assert _tree(repo.root) == before


def test_bit_rot_in_a_large_payload_is_found_and_repair_quarantines_it(repo: modulelens.Repo) -> None:
    ref = _save(repo)
    loose, _ = _blobs(repo, ref)
    _flip(loose, 12345)
    report = repo.fsck()
    assert not report.clean
    kinds = {(p.kind, p.path) for p in report.problems}
    assert ("corrupt-payload", str(loose.relative_to(repo.root))) in kinds
    assert ("corrupt-payload", "names/lin/versions/1") in kinds
    result = runner.invoke(app, ["fsck", "--repo", str(repo.root), "--json"])
    assert result.exit_code == 3
    assert json.loads(result.stdout)["result"]["clean"] is False

    repaired = repo.fsck(repair=True)
    assert repaired.clean and all(p.repaired for p in repaired.problems)
    quarantine = Path(repaired.quarantine)
    assert (quarantine / loose.relative_to(repo.root)).exists()
    assert (quarantine / "names/lin/versions/1/capture.json").exists()
    assert json.loads((quarantine / "fsck.json").read_text())["problems"]
    assert modulelens.Repo(repo.root).list() == []
    assert repo.fsck().clean
    # the number stays used, and a save of the same content writes the payload again
    assert _save(repo) == "lin:v2"
    modulelens.load("lin", repo=repo, verify=True)


def test_a_damaged_pack_member_is_found(repo: modulelens.Repo) -> None:
    ref = _save(repo)
    _, pack = _blobs(repo, ref)
    _flip(pack, pack.stat().st_size - 3)
    problems = repo.fsck().problems
    assert {p.kind for p in problems} == {"corrupt-payload"}
    assert any(str(pack.relative_to(repo.root)) == p.path for p in problems)


def test_metadata_aliases_foreign_entries_and_links(repo: modulelens.Repo, tmp_path: Path) -> None:
    _save(repo)
    _save(repo)
    _save(repo, name="other")
    repo.set_alias("lin:v1", "golden")
    v2 = repo.root / "names/lin/versions/2/capture.json"
    os.chmod(v2, 0o644)
    v2.write_text('{"format_version": 1, "tensors": 7}')
    (repo.root / "names/lin/aliases/stale").write_text("9")
    (repo.root / "names/not a name").mkdir()
    (repo.root / "names/lin/notes.txt").write_text("mine")
    outside = tmp_path / "outside"
    outside.write_text("not yours")
    (repo.root / "blobs/00").mkdir(exist_ok=True)
    (repo.root / "blobs/00" / ("00" * 32)).symlink_to(outside)
    problems = {(p.kind, p.path) for p in repo.fsck().problems}
    assert problems == {
        ("metadata", "names/lin/versions/2/capture.json"),
        ("alias", "names/lin/aliases/stale"),
        ("foreign", "names/not a name"),
        ("foreign", "names/lin/notes.txt"),
        ("symlink", "blobs/00/" + "00" * 32),
    }
    result = runner.invoke(app, ["fsck", "--repair", "--repo", str(repo.root), "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)["result"]
    assert body["clean"] and len(body["problems"]) == 5
    quarantine = Path(body["quarantine"])
    assert (quarantine / "names/lin/aliases/stale").read_text() == "9"  # the dropped alias is kept
    assert (quarantine / "names/lin/notes.txt").read_text() == "mine"
    assert outside.read_text() == "not yours"
    fresh = modulelens.Repo(repo.root)
    assert [i.ref for i in fresh.list()] == ["lin:v1", "other:v1"]
    assert fresh.aliases("lin") == {"golden": 1}
    assert fresh.fsck().clean
    assert runner.invoke(app, ["fsck", "--repo", str(repo.root)]).exit_code == 0


def test_a_summary_marked_current_but_wrong_is_found_and_rebuilt(repo: modulelens.Repo) -> None:
    _save(repo)
    folder = repo.root / "names/lin"
    head = json.loads((folder / "summary.json").read_text())
    log = folder / f"summary-{head['log']}.log"
    entry = json.loads(log.read_text().splitlines()[0])
    entry["blobs"] = []  # gc trusting this would free v1's payloads
    line = (json.dumps(entry) + "\n").encode()
    with open(log, "ab") as handle:  # a later line of the index's log wins
        handle.write(line)
    head["log_bytes"] += len(line)
    del head["check"]
    body = json.dumps(head, separators=(",", ":")).encode()[1:]  # the head's own framing (repo/index.py)
    (folder / "summary.json").write_bytes(b'{"check":"' + xxhash.xxh3_64_hexdigest(body).encode() + b'",' + body)
    assert [(p.kind, p.path) for p in repo.fsck().problems] == [("summary", "names/lin/summary.json")]
    assert repo.fsck(repair=True).clean
    assert repo.stored_summary("lin")[0]["1"]["blobs"]
    assert repo.gc().removed_blobs == 0
    modulelens.load("lin", repo=repo, verify=True)


def test_orphans_and_dead_writers_staging_are_left_to_gc(repo: modulelens.Repo) -> None:
    _save(repo)
    _save(repo, size=8)
    repo.remove("lin:v2")
    dead = repo.root / "tmp" / "999999999-0123abcd.version"
    dead.mkdir(parents=True)
    live = repo.root / "tmp" / f"{os.getpid()}-0123abcd.version"
    live.mkdir()
    report = repo.fsck()
    assert report.clean and report.orphan_blobs >= 1 and report.stale_staging == 1
    result = runner.invoke(app, ["gc", "--tmp-older-than", "0", "--repo", str(repo.root), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["result"]["removed_tmp"] == 1
    assert not dead.exists() and live.exists()  # a running writer's staging is never freed
    assert runner.invoke(app, ["gc", "--tmp-older-than", "soon", "--repo", str(repo.root)]).exit_code == 2


def test_a_remote_repo_gets_a_read_only_check() -> None:
    remote = modulelens.Repo("memory://fsck-remote")
    ref = _save(remote, size=8)
    _save(remote, name="other", size=8)
    remote.set_alias(ref, "golden")
    result = runner.invoke(app, ["fsck", "--repo", remote.location, "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)["result"]
    assert (body["names"], body["versions"], body["clean"]) == (2, 2, True)
    pack = remote.read_metadata(*remote.resolve(ref))["packs"][0]["payload"].partition(":")[2]
    remote.store.objects.delete([remote.store.objects.key("blobs", pack[:2], pack)])
    result = runner.invoke(app, ["fsck", "--repo", remote.location, "--json"])
    assert result.exit_code == 3
    problems = {(p["kind"], p["path"]) for p in json.loads(result.stdout)["result"]["problems"]}
    assert problems == {("missing-payload", f"blobs/{pack[:2]}/{pack}"), ("alias", "names/lin/aliases/golden")}
    refused = runner.invoke(app, ["fsck", "--repair", "--repo", remote.location, "--json"])
    assert refused.exit_code == 2
    assert "local repos only" in json.loads(refused.stdout)["error"]["message"]


@pytest.mark.parametrize("what", ["pack", "summary", "alias", "tombstone", "version"])
def test_links_inside_a_repo_are_never_followed(repo: modulelens.Repo, tmp_path: Path, what: str) -> None:
    ref = _save(repo, size=8)
    repo.set_alias(ref, "golden")
    repo.remove(_save(repo, size=8))  # leaves tombstone 2.removed
    folder = repo.root / "names/lin"
    outside = tmp_path / "outside"
    target = {"pack": _blobs_pack(repo, ref), "summary": folder / "summary.json", "alias": folder / "aliases/golden",
              "tombstone": folder / "versions/2.removed", "version": folder / "versions/1"}[what]
    if target.is_dir():
        os.rename(target, outside)
    else:
        outside.write_bytes(target.read_bytes())
        target.unlink()
    outside_before = _tree(tmp_path / "outside") if outside.is_dir() else outside.read_bytes()
    target.symlink_to(outside)
    fresh = modulelens.Repo(repo.root)
    report = fresh.fsck()
    assert ("symlink", str(target.relative_to(repo.root))) in {(p.kind, p.path) for p in report.problems}
    if what in ("pack", "version"):
        with pytest.raises(modulelens.CorruptCaptureError, match=r"symbolic link|not a regular file"):
            modulelens.load(ref, repo=fresh).module  # noqa: B018 (building the module reads the payloads)
    else:
        assert isinstance(modulelens.load(ref, repo=fresh).module, nn.Linear)  # the link is ignored
    fresh.list()
    _save(fresh, size=8)
    fresh.gc(tmp_age_s=0)
    assert (_tree(outside) if outside.is_dir() else outside.read_bytes()) == outside_before
    assert fresh.fsck(repair=True).clean
    assert fresh.fsck().clean


def _blobs_pack(repo: modulelens.Repo, ref: str) -> Path:
    meta = repo.read_metadata(*repo.resolve(ref))
    return repo.blob_path(meta["packs"][0]["payload"])


def test_repair_never_moves_anything_through_a_linked_quarantine(repo: modulelens.Repo, tmp_path: Path) -> None:
    _save(repo, size=8)
    (repo.root / "names/lin/notes.txt").write_text("mine")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (repo.root / "quarantine").symlink_to(outside, target_is_directory=True)
    assert {p.kind for p in repo.fsck().problems} == {"symlink", "foreign"}
    report = repo.fsck(repair=True)  # the link is moved aside first (into a real quarantine folder), never through
    assert report.clean and {p.path for p in report.problems} == {"quarantine", "names/lin/notes.txt"}
    assert not any(outside.iterdir()) and not (repo.root / "quarantine").is_symlink()
    run = Path(report.quarantine)
    assert (run / "quarantine").is_symlink() and (run / "names/lin/notes.txt").read_text() == "mine"
    assert repo.fsck().clean


def test_an_rm_killed_after_marking_is_left_for_gc_not_a_problem(tmp_path: Path) -> None:
    """kill -9 of an ``rm`` between marking its versions (readers no longer show them) and removing
    them: fsck finds nothing wrong (a crash leaves only garbage for gc), and gc finishes the removal
    (found by the stress suite's kill row)."""
    from modulelens.repo.layout import name_key

    repo = modulelens.Repo(tmp_path / "repo")
    _save(repo)
    _save(repo)
    repo._summaries.begin_removal("lin", name_key("lin"), [1])  # what the killed rm had done
    assert [v.version for v in repo.list("lin")] == [2]
    report = repo.fsck()
    assert report.clean, [(p.kind, p.path, p.detail) for p in report.problems]
    repo.gc(grace_s=0)
    assert not (tmp_path / "repo" / "names" / "lin" / "versions" / "1").exists()
    assert repo.fsck().clean
    assert [v.version for v in repo.list("lin")] == [2]


def test_an_rm_killed_after_removing_a_folder_is_left_for_gc_not_a_problem(tmp_path: Path) -> None:
    """kill -9 of an ``rm`` after it removed a marked version's folder (its tombstone written) and
    before it dropped the index entry: the index still marks the version as being removed, which
    is not a version that does not exist (found by the stress suite's kill row, 2026-12-02)."""
    from modulelens.repo.layout import name_key, version_key

    repo = modulelens.Repo(tmp_path / "repo")
    _save(repo)
    _save(repo)
    repo._summaries.begin_removal("lin", name_key("lin"), [1])  # what the killed rm had done
    assert repo.store.retire(version_key("lin", 1))
    assert not (tmp_path / "repo" / "names" / "lin" / "versions" / "1").exists()
    assert [v.version for v in repo.list("lin")] == [2]
    report = repo.fsck()
    assert report.clean, [(p.kind, p.path, p.detail) for p in report.problems]
    repo.gc(grace_s=0)
    assert repo.fsck().clean
    assert [v.version for v in repo.list("lin")] == [2]
    _save(repo)
    assert [v.version for v in repo.list("lin")] == [2, 3]  # the removed number is never reused


def test_an_rm_killed_before_it_dropped_the_aliases_leaves_none_dangling_after_gc(tmp_path: Path) -> None:
    """kill -9 of an ``rm`` after it marked its version and before it removed the alias pointing at
    it: the gc that finishes the removal removes the alias too (an rm killed after removing the
    folder, its aliases then still there, left ``best -> v1`` naming nothing: found by the stress
    suite's kill row, 2026-12-06)."""
    from modulelens.repo.layout import name_key

    repo = modulelens.Repo(tmp_path / "repo")
    _save(repo)
    _save(repo)
    repo.set_alias("lin:v1", "best")
    repo._summaries.begin_removal("lin", name_key("lin"), [1])  # what the killed rm had done
    assert repo.fsck().clean  # marked, its folder and alias still there: left for gc
    repo.gc(grace_s=0)
    assert repo.fsck().clean
    assert [v.version for v in repo.list("lin")] == [2] and repo.aliases("lin") == {}
    repo.set_alias("lin:v2", "best")
    repo.remove("lin:v2")  # an rm that completes: its alias goes first, then its folder
    assert repo.aliases("lin") == {} and repo.fsck().clean


def test_an_alias_set_while_its_version_is_removed_is_taken_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``alias`` resolves ``lin:v2``; another process's ``rm lin:v2`` runs before the alias is written
    (it looks for aliases to remove before this one exists): the alias is taken back and the call
    says why, so no alias points at nothing (found by the stress suite's race row)."""
    repo = modulelens.Repo(tmp_path / "repo")
    _save(repo)
    _save(repo)
    resolve = repo.resolve
    raced: list[str] = []

    def resolve_then_removed(ref: str) -> tuple[str, int]:
        found = resolve(ref)
        if not raced:
            raced.append(ref)
            repo.remove("lin:v2")  # the other process, between the resolve and the write
        return found

    monkeypatch.setattr(repo, "resolve", resolve_then_removed)
    with pytest.raises(modulelens.CaptureNotFoundError, match="removed by another process"):
        repo.set_alias("lin:v2", "best")
    monkeypatch.undo()
    assert "best" not in repo.aliases("lin")
    report = repo.fsck()
    assert report.clean, [(p.kind, p.path, p.detail) for p in report.problems]
