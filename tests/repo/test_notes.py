"""A version's description and edited tags (repo/notes.py): stored per name beside the index,
shown by every listing, checked when read, changed with compare-and-swap, copied by push and pull,
named by fsck when damaged."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import modulelens
from modulelens.errors import CorruptCaptureError, InvalidNameError, RepoBusyError, UsageError
from modulelens.interfaces.listing import VersionFilter
from modulelens.repo import VersionNotes
from modulelens.repo.layout import notes_key


def _save(repo: modulelens.Repo, name: str = "lin", tags: tuple[str, ...] = ("nightly",)) -> str:
    module = nn.Linear(3, 2)
    with modulelens.capture(module, targets="Linear", repo=repo, name=name, tags=list(tags)) as cap:
        module(torch.randn(2, 3))
    return cap.wait()[0].ref  # a remote repo's captures are uploaded in the background: wait until they are there


@pytest.fixture(params=["local", "memory"])
def any_repo(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> modulelens.Repo:
    """A directory and an object store (fsspec's memory://, the same code as s3://)."""
    monkeypatch.setenv("MODULELENS_CACHE", str(tmp_path / "cache"))
    if request.param == "local":
        return modulelens.Repo(tmp_path / "repo")
    return modulelens.Repo(f"memory://notes-{tmp_path.name}/repo")


def test_description_and_tags_are_kept_and_listed(any_repo: modulelens.Repo) -> None:
    first, second = _save(any_repo), _save(any_repo)
    assert any_repo.notes(first) == VersionNotes()
    written = any_repo.describe(first, "  golden run\r\nbefore the refactor  ")
    assert written.description == "golden run\nbefore the refactor" and written.by and written.updated.endswith("Z")
    any_repo.tag(first, "reviewed", "run:2026-12")
    any_repo.untag(first, "nightly")  # a tag given at capture can be taken off too
    assert any_repo.notes("lin:v1").tags == ("reviewed", "run:2026-12")
    tags = {info.ref: info.tags for info in any_repo.list()}
    assert tags == {first: ("reviewed", "run:2026-12"), second: ("nightly",)}
    assert any_repo.info("lin", 1).tags == ("reviewed", "run:2026-12")
    only_reviewed = VersionFilter.from_options(module_class=None, tags=["reviewed"], since=None)
    assert [i.ref for i in any_repo.list() if only_reviewed.keeps(i)] == [first]
    # a fresh Repo object reads the same (nothing kept in memory), and the capture itself is unchanged
    again = modulelens.Repo(any_repo.location)
    assert again.notes(first).description == "golden run\nbefore the refactor"
    assert again.read_metadata("lin", 1)["tags"] == ["nightly"]
    any_repo.describe(first, "")
    assert any_repo.notes(first).description == "" and any_repo.notes(first).tags == ("reviewed", "run:2026-12")


def test_bad_input_is_refused_and_changes_nothing(repo: modulelens.Repo) -> None:
    ref = _save(repo)
    for tag in ("", "-x", "a b", "<script>", "x" * 65, "tab\there"):
        with pytest.raises(InvalidNameError, match="invalid tag"):
            repo.tag(ref, tag)
    with pytest.raises(UsageError, match="at most 10,000 characters"):
        repo.describe(ref, "x" * 10_001)
    with pytest.raises(UsageError, match="control characters"):
        repo.describe(ref, "bell \x07")
    with pytest.raises(UsageError, match="no tag 'absent' to take off"):
        repo.untag(ref, "absent")
    with pytest.raises(UsageError, match="at most 64 tags"):
        repo.tag(ref, *[f"t{i}" for i in range(64)])
    with pytest.raises(modulelens.CaptureNotFoundError):
        repo.describe("lin:v9", "x")
    assert repo.notes(ref) == VersionNotes()
    assert not (Path(repo.location) / notes_key("lin")).exists()


def test_a_stale_description_is_not_overwritten(repo: modulelens.Repo) -> None:
    """Two people edit the same description: the second, who saw the old text, is refused."""
    ref = _save(repo)
    repo.describe(ref, "first words")
    repo.describe(ref, "alice's words", expected="first words\r\n")  # (a form's text: CRLF, a trailing newline)
    with pytest.raises(RepoBusyError, match="changed by someone else"):
        repo.describe(ref, "bob's words", expected="first words")
    assert repo.notes(ref).description == "alice's words"


def test_concurrent_editors_lose_no_tag(repo: modulelens.Repo) -> None:
    """Eight threads tag versions of one name at once (one notes file): every tag is there."""
    refs = [_save(repo) for _ in range(4)]
    errors: list[BaseException] = []

    def tag_all(worker: int) -> None:
        try:
            for ref in refs:
                modulelens.Repo(repo.location).tag(ref, f"w{worker}")
        except BaseException as error:  # (reported below)
            errors.append(error)

    threads = [threading.Thread(target=tag_all, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for info in repo.list("lin"):
        assert set(info.tags) == {"nightly", *(f"w{w}" for w in range(8))}, info


@pytest.mark.parametrize("content", [
    b"not json", b"[]", b'{"notes": 2, "versions": {}}', b'{"notes": 1, "versions": {"x": {}}}',
    b'{"notes": 1, "versions": {"1": {"description": ["a list"]}}}',
    b'{"notes": 1, "versions": {"1": {"tags": "not-a-list"}}}',
    b'{"notes": 1, "versions": {"1": {"tags": [""]}}}',
    b'{"notes": 1, "versions": {"1": {"description": "bell \\u0007"}}}',
    b"[" * 100_000, b'{"notes": 1, "versions": {}, "pad": "' + b"x" * (5 << 20) + b'"}',
])
def test_a_damaged_notes_file_is_named_and_never_breaks_a_listing(repo: modulelens.Repo, content: bytes) -> None:
    ref = _save(repo)
    path = Path(repo.location) / notes_key("lin")
    path.write_bytes(content)
    assert [i.tags for i in repo.list()] == [("nightly",)]  # the captured tags, the listing unharmed
    with pytest.raises(CorruptCaptureError, match=r"notes\.json"):
        repo.notes(ref)
    with pytest.raises(CorruptCaptureError):
        repo.tag(ref, "reviewed")
    assert path.read_bytes() == content  # an edit never overwrites what it could not read
    report = repo.fsck()
    assert [(p.kind, p.path) for p in report.problems] == [("notes", notes_key("lin"))]
    repaired = repo.fsck(repair=True)
    assert repaired.problems[0].repaired and not path.exists()
    assert repo.fsck().clean
    repo.tag(ref, "reviewed")  # the name can be noted again
    assert repo.notes(ref).tags == ("nightly", "reviewed")


def test_notes_of_removed_versions_are_dropped_and_numbers_never_reused(repo: modulelens.Repo) -> None:
    first, _ = _save(repo), _save(repo)
    repo.describe(first, "will be removed")
    repo.remove(first)
    third = _save(repo)
    assert repo.notes(third) == VersionNotes()  # v3: the notes of v1 never reach it
    repo.describe(third, "new")
    stored = json.loads((Path(repo.location) / notes_key("lin")).read_text())
    assert set(stored["versions"]) == {"3"}
    assert repo.fsck().clean


def test_push_and_pull_carry_notes_without_overwriting_the_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODULELENS_CACHE", str(tmp_path / "cache"))
    source = modulelens.Repo(tmp_path / "source")
    ref = _save(source)
    source.describe(ref, "from the source")
    source.tag(ref, "reviewed")
    remote = f"memory://notes-push-{tmp_path.name}/team"
    source.push("lin", remote)
    team = modulelens.Repo(remote)
    assert team.notes("lin:v1").description == "from the source"
    assert team.list()[0].tags == ("nightly", "reviewed")
    assert team.notes("lin:v1").by == source.notes(ref).by  # who wrote them travels too
    team.describe("lin:v1", "the team's words")
    source.push("lin", remote)  # already there: the team's words stay
    assert team.notes("lin:v1").description == "the team's words"
    back = modulelens.Repo(tmp_path / "back")
    back.pull(remote, "lin")
    assert back.notes("lin:v1").description == "the team's words" and back.list()[0].tags == ("nightly", "reviewed")
