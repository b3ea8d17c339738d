"""The store registry (issue 39): ``Repo(location)`` opens the store registered for the location's
scheme; a new backend is a store and one ``register_store`` line; an unknown scheme is one line.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import fsspec
import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem
from typer.testing import CliRunner

import modulelens
from modulelens.errors import UsageError
from modulelens.interfaces.cli import app
from modulelens.repo import registry
from modulelens.repo._objects import FsspecObjects
from modulelens.repo._objects_memory import MemoryObjects
from modulelens.repo._objects_s3 import S3Objects
from modulelens.repo._objects_sqlite import SqliteObjects
from modulelens.repo.local import LocalStore
from modulelens.repo.registry import object_store, open_store, register_store, registered_schemes
from modulelens.repo.remote import RemoteStore
from modulelens.repo.store import Store


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Registrations made by a test stay in it; the cache is the test's own."""
    monkeypatch.setattr(registry, "_FACTORIES", dict(registry._FACTORIES))
    monkeypatch.setenv("MODULELENS_CACHE", str(tmp_path / "cache"))


def _capture_into(repo: modulelens.Repo, name: str) -> tuple[str, torch.Tensor]:
    """Capture one real call of a small model's linear layer into ``repo``: its ref, and the
    output the layer gives for that input."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    batch = torch.randn(2, 4)
    with modulelens.capture(model, targets="Linear", repo=repo, name=name, strict=True) as cap:
        model(batch)
    with torch.no_grad():
        return cap.saved[0].ref, model[0](batch)


def test_the_built_in_schemes_are_registered_with_their_server_operations(tmp_path: Path) -> None:
    assert {"", "file", "memory", "s3", "s3a", "sqlite"} <= set(registered_schemes())
    assert isinstance(open_store(tmp_path / "a"), LocalStore)
    memory = open_store(f"memory://registry-{uuid.uuid4().hex[:8]}")
    assert isinstance(memory, RemoteStore) and type(memory.objects) is MemoryObjects
    sqlite = open_store(f"sqlite://{tmp_path}/team.db")
    assert isinstance(sqlite, RemoteStore) and type(sqlite.objects) is SqliteObjects
    assert not (tmp_path / "team.db").exists()  # opening the store reads and writes nothing
    for scheme in ("s3", "s3a"):  # building the client sends no request
        s3 = open_store(f"{scheme}://some-bucket/prefix", storage_options={"anon": True})
        assert isinstance(s3, RemoteStore) and type(s3.objects) is S3Objects


def test_a_registered_scheme_opens_its_store_for_save_and_load(tmp_path: Path) -> None:
    """A team maps ``team://PROJECT`` to its shared folder: one registration line, then every
    entry point that takes a location takes the URL."""
    def team_store(location: str, storage_options: dict[str, object] | None) -> Store:
        return LocalStore(tmp_path / "shared" / location.removeprefix("team://"))

    register_store("team", team_store)
    repo = modulelens.Repo("team://ranking")
    assert isinstance(repo.store, LocalStore) and repo.location == str(tmp_path / "shared" / "ranking")
    ref, expected = _capture_into(repo, "head")
    loaded = modulelens.load(ref, repo="team://ranking")
    report = loaded.replay()
    assert report.passed, report
    assert torch.equal(loaded.calls[0].output, expected)
    listing = CliRunner().invoke(app, ["ls", "--repo", "team://ranking", "--json"])
    assert listing.exit_code == 0, listing.output
    assert [v["ref"] for v in json.loads(listing.output)["result"]] == [ref]


def test_a_new_backend_is_one_class_and_one_registration_line(tmp_path: Path) -> None:
    """``object_store`` turns an object backend (here the SQLite one, under a team's own scheme)
    into a store factory: capture, load, replay and the CLI work on the new scheme; the class may
    also be named by where to import it from, imported on first use."""
    register_store("teamdb", object_store(SqliteObjects))
    url = f"teamdb://{tmp_path}/ranking.db"
    repo = modulelens.Repo(url)
    assert isinstance(repo.store, RemoteStore) and type(repo.store.objects) is SqliteObjects
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    batch = torch.randn(2, 4)
    with modulelens.capture(model, targets="Linear", repo=url, name="head", strict=True) as cap:
        model(batch)
    ref = cap.wait(timeout=60)[0].ref  # (staged locally, uploaded in the background: a remote store)
    loaded = modulelens.load(ref, repo=url)
    assert loaded.replay().passed
    with torch.no_grad():
        assert torch.equal(loaded.calls[0].output, model[0](batch))
    listing = CliRunner().invoke(app, ["ls", "--repo", url, "--json"])
    assert listing.exit_code == 0, listing.output
    assert [v["ref"] for v in json.loads(listing.output)["result"]] == [ref]
    register_store("teamdb2", object_store("modulelens.repo._objects_sqlite:SqliteObjects"))
    assert [v.ref for v in modulelens.Repo(f"teamdb2://{tmp_path}/ranking.db").list()] == [ref]


def test_a_capture_into_a_registered_local_scheme_is_saved_directly_not_staged(tmp_path: Path) -> None:
    """Staging is decided by the store the location opens to, not by the ``://`` in its spelling:
    ``team://`` names a local directory, so a capture given that string is saved there at once
    (no staging repo, no background upload); ``memory://`` is remote, so it is staged and uploaded."""
    def team_store(location: str, storage_options: dict[str, object] | None) -> Store:
        return LocalStore(tmp_path / "shared" / location.removeprefix("team://"))

    register_store("team", team_store)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    with modulelens.capture(model, targets="Linear", repo="team://ranking", name="head", strict=True) as cap:
        model(torch.randn(2, 4))
    assert cap.upload is None
    assert not (tmp_path / "cache" / "staging").exists()
    refs = [v.ref for v in cap.saved]
    assert len(refs) == 1 and [v.ref for v in cap.wait()] == refs
    assert [v.ref for v in modulelens.Repo(tmp_path / "shared" / "ranking").list()] == refs

    url = f"memory://staged-{uuid.uuid4().hex[:8]}"
    with modulelens.capture(model, targets="Linear", repo=url, name="head", strict=True) as remote_cap:
        model(torch.randn(2, 4))
    assert remote_cap.upload is not None
    assert [v.ref for v in remote_cap.wait(timeout=60)] == refs
    assert [v.ref for v in modulelens.Repo(url).list()] == refs


def test_an_unknown_scheme_is_one_line_naming_the_registered_ones(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as raised:
        modulelens.Repo("nosuch://bucket/captures")
    message = str(raised.value)
    assert "\n" not in message and "nosuch://" in message
    assert all(f"{scheme}://" in message for scheme in ("file", "memory", "s3", "s3a")), message
    result = CliRunner().invoke(app, ["ls", "--repo", "nosuch://bucket/captures"])
    assert result.exit_code == UsageError.exit_code, result.output
    assert "no store for nosuch://" in result.output and len(result.output.strip().splitlines()) == 1, result.output
    with pytest.raises(UsageError, match="nosuch://"):
        modulelens.load("x", repo="nosuch://bucket/captures")


def test_any_protocol_fsspec_knows_is_a_remote_repo_over_its_generic_operations() -> None:
    """A protocol registered with fsspec itself (here a private in-memory filesystem) needs no
    registration here: its repo runs on fsspec's generic operations."""
    scheme = f"mlreg{uuid.uuid4().hex[:6]}"

    class PrivateMemory(MemoryFileSystem):
        store: dict[str, object] = {}  # noqa: RUF012 (fsspec's class-level store, not shared with memory://)
        pseudo_dirs = [""]  # noqa: RUF012
        protocol = (scheme,)

    fsspec.register_implementation(scheme, PrivateMemory)
    assert scheme not in registered_schemes()
    repo = modulelens.Repo(f"{scheme}://captures")
    assert isinstance(repo.store, RemoteStore) and type(repo.store.objects) is FsspecObjects
    assert not repo.store.objects.atomic  # fsspec's exclusive create only: said, not assumed
    assert repo.list() == []
    objects = repo.store.objects
    with pytest.raises(modulelens.RemoteRepoError, match="no compare-and-swap") as raised:
        objects.replace(objects.key("names", "a", "index.json"), b"{}", None)  # no ETag: a swap cannot be safe
    assert "\n" not in str(raised.value)


def test_register_store_refuses_bad_and_taken_schemes() -> None:
    def nowhere(location: str, storage_options: dict[str, object] | None) -> Store:
        raise AssertionError("never opened")

    for bad in ("S3", "s3://", "a/b", "9p", "has space"):
        with pytest.raises(UsageError, match="lowercase"):
            register_store(bad, nowhere)
    with pytest.raises(UsageError, match="registered already"):
        register_store("s3", nowhere)
    register_store("s3", registry._FACTORIES["s3"])  # the same factory again: nothing changes
    register_store("s3", nowhere, clobber=True)
    with pytest.raises(AssertionError, match="never opened"):
        open_store("s3://bucket/x")
