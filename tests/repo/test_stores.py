"""The Store contract, run against every store: what ``Repo`` relies on, whatever keeps its files;
and the object-backend contract (repo/backend.py), run against every backend.

A new store or backend passes these before ``Repo`` can use it: a directory (``local``), object
backends under a remote store (``memory://``, and ``sqlite://``, a whole repo in one SQLite file);
tests/repo/test_remote.py runs the whole repo on a real S3 server and on SQLite from concurrent
processes.
"""

from __future__ import annotations

import itertools
import random
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

import modulelens
from modulelens.errors import CorruptCaptureError, RemoteRepoError, RepoBusyError, UsageError
from modulelens.format.hashing import hash_bytes
from modulelens.repo import _objects_sqlite as sqlite_module
from modulelens.repo import backend as backend_module
from modulelens.repo._objects_memory import MemoryObjects
from modulelens.repo._objects_sqlite import SqliteObjects
from modulelens.repo.backend import ObjectBackend
from modulelens.repo.layout import MARKER, blob_key, marker_json
from modulelens.repo.local import LocalStore
from modulelens.repo.markers import MAX_CHUNKS, MIN_CHUNK, ChunkHasher, chunk_digests, chunk_size
from modulelens.repo.remote import RemoteStore
from modulelens.repo.repository import open_store
from modulelens.repo.store import Store

_LOCATIONS = {"local": "{tmp}/repo", "memory": "memory://stores-{uid}", "sqlite": "sqlite://{tmp}/repo.db"}


@pytest.fixture(params=sorted(_LOCATIONS))
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("MODULELENS_CACHE", str(tmp_path / "cache"))
    made = open_store(_LOCATIONS[request.param].format(tmp=tmp_path, uid=uuid.uuid4().hex[:8]))
    made.open(MARKER, marker_json(), create=True)
    return made


def test_open_store_picks_the_store_from_the_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODULELENS_CACHE", str(tmp_path / "cache"))
    assert isinstance(open_store(tmp_path / "a"), LocalStore)
    assert isinstance(open_store(f"file://{tmp_path}/b"), LocalStore)
    assert open_store(f"file://{tmp_path}/b").location == f"{tmp_path}/b"
    assert isinstance(open_store("memory://somewhere"), RemoteStore)
    sqlite = open_store(f"sqlite://{tmp_path}/team.db")
    assert isinstance(sqlite, RemoteStore) and isinstance(sqlite.objects, SqliteObjects)
    assert sqlite.location == f"sqlite://{tmp_path}/team.db"
    with pytest.raises(UsageError, match="absolute path"):
        open_store("sqlite://relative/team.db")
    monkeypatch.setenv("MODULELENS_REPO", "memory://from-env")
    assert isinstance(modulelens.Repo().store, RemoteStore)
    with pytest.raises(UsageError, match="storage_options"):
        modulelens.Repo(tmp_path / "c", storage_options={"anon": True})


def test_files_by_key(store: Store) -> None:
    assert store.publish("names/a/versions/1", {"capture.json": b"{}"})  # the name's folder
    assert store.read("names/a/aliases/x") is None
    store.write("names/a/aliases/x", b"1")  # its folder is made
    store.write("names/a/aliases/y", b"2")
    assert store.read("names/a/aliases/x") == b"1"
    assert store.files("names/a/aliases") == ["x", "y"]
    assert store.read_many(["names/a/aliases/x", "names/a/aliases/nothing"]) == {"names/a/aliases/x": b"1"}
    assert store.remove("names/a/aliases/x") and not store.remove("names/a/aliases/x")
    assert store.files("names/a/aliases") == ["y"] and store.files("names/none") == []


def test_swap_is_compare_and_swap(store: Store) -> None:
    assert store.publish("names/a/versions/1", {"capture.json": b"{}"})
    key = "names/a/aliases/golden"
    data, tag = store.read_tagged(key)
    assert (data, tag) == (None, None)
    assert store.swap(key, b"1", None)  # create-if-absent
    assert not store.swap(key, b"2", None)  # taken
    data, tag = store.read_tagged(key)
    assert data == b"1"
    assert store.swap(key, b"3", tag)
    assert not store.swap(key, b"4", tag)  # another writer moved it since the read
    assert store.read(key) == b"3"


def test_a_folder_is_published_once_and_its_number_never_reused(store: Store) -> None:
    prefix = "names/a"
    assert store.publish(f"{prefix}/versions/1", {"capture.json": b"{}"}, folders=("reports",))
    assert not store.publish(f"{prefix}/versions/1", {"capture.json": b"{}"})
    assert store.publish(f"{prefix}/versions/2", {"capture.json": b"{}"})
    store.write(f"{prefix}/aliases/golden", b"2")
    scan = store.scan(prefix)
    assert (list(scan.versions), scan.used, scan.aliases) == ([1, 2], 2, {"golden": 2})
    assert store.retire(f"{prefix}/versions/2")
    assert not store.publish(f"{prefix}/versions/2", {"capture.json": b"{}"})  # its tombstone holds the number
    scan = store.scan(prefix)
    assert (list(scan.versions), scan.used) == ([1], 2)
    assert store.names() == ["a"]


def test_blobs(store: Store) -> None:
    data = b"x" * 1000
    digest = hash_bytes(data)
    assert not store.has_blob(digest)
    assert store.write_blob(digest, data)
    assert store.has_blob(digest)
    assert store.blob_file(digest, len(data)).read_bytes() == data  # a local file, checked
    listed = store.blobs()
    assert listed[digest.partition(":")[2]].size == len(data)
    assert listed[digest.partition(":")[2]].key == blob_key(digest)
    missing = hash_bytes(b"never stored")
    check = store.verify_blobs({digest: len(data), missing: 12}, {})
    assert check.damaged == {missing: "missing"} and check.checked == 1
    assert "expected 999" in store.verify_blobs({digest: 999}, {}).damaged[digest]
    store.remove_blobs([blob_key(digest)])
    assert not store.has_blob(digest) and store.blobs() == {}


def test_a_streamed_blob_is_hashed_as_written_and_published_unread(store: Store) -> None:
    """The blob writer (repo/blob_writer.py): pieces of any size, the content hash and the marker's
    chunk hashes computed on the way, sealed durably, then published by the save's adopt_file (a
    rename, or an upload) as a blob every later read checks like any other."""
    data = bytes(range(256)) * (17 * MIN_CHUNK // 256 + 7)  # over MARK_MIN_BYTES: published with its marker
    writer = store.blob_writer(len(data))
    for start, end in ((0, 5), (5, MIN_CHUNK + 3), (MIN_CHUNK + 3, 2 * MIN_CHUNK), (2 * MIN_CHUNK, len(data))):
        writer.write(memoryview(data)[start:end])  # a chunk split across pieces, and whole chunks
    payload = writer.seal()
    assert (payload.digest, payload.nbytes, payload.chunks) == (hash_bytes(data), len(data),
                                                                chunk_digests(memoryview(data)))
    assert payload.path.read_bytes() == data and payload.path.stat().st_mode & 0o777 == 0o444  # read-only
    assert store.adopt_file(payload.path, payload.digest, payload.chunks)
    assert not payload.path.exists() and store.has_blob(payload.digest)
    assert store.blob_file(payload.digest, len(data)).read_bytes() == data  # (a local blob: sampled by its marker)
    assert store.blob_file(payload.digest, len(data), full=True).read_bytes() == data


@pytest.mark.parametrize("size", [MIN_CHUNK * 17 + 5, MIN_CHUNK * MAX_CHUNKS + 3])
def test_chunk_hashes_are_the_xxh3_of_each_chunk_however_the_bytes_arrive(size: int) -> None:
    """A marker's chunk hashes (repo/markers.py) are the xxh3-64 of each chunk and its tail, for
    64 KiB chunks (hashed one at a time, the GIL let go between them) and for the larger chunks of
    a blob over 64 MiB, from one buffer or from pieces that split chunks anywhere."""
    data = memoryview(random.Random(size).randbytes(size))
    chunk = chunk_size(size)
    assert chunk == (MIN_CHUNK if size < MIN_CHUNK * MAX_CHUNKS else -(-size // MAX_CHUNKS))
    expected = b"".join(xxhash.xxh3_64_digest(data[i:i + chunk]) for i in range(0, size, chunk))
    assert chunk_digests(data) == (chunk, expected)
    hasher = ChunkHasher(size)
    cuts = [0, 3, chunk - 1, 3 * chunk + 7, size // 2, size - 2, size]
    for start, end in itertools.pairwise(cuts):
        hasher.update(data[start:end])
    assert hasher.digests() == (chunk, expected)


def test_a_blob_writer_refuses_wrong_sizes_and_abort_leaves_nothing(store: Store) -> None:
    writer = store.blob_writer(10)
    writer.write(memoryview(b"12345"))
    with pytest.raises(ValueError, match="11 bytes written, 10 announced"):
        writer.write(memoryview(b"123456"))
    with pytest.raises(ValueError, match="5 bytes written, 10 announced"):
        writer.seal()  # too short: removed
    writer.abort()  # twice is fine
    second = store.blob_writer(4)
    second.write(memoryview(b"abcd"))
    sealed = second.seal()
    second.abort()  # a sealed payload the save never took: removed
    assert not sealed.path.exists() and store.blobs() == {}
    assert not [f for f in sealed.path.parent.iterdir() if f.name.endswith(".weight")]


def test_writing_is_reentrant_and_exclusive_yields_a_time(store: Store) -> None:
    with store.writing() as outer, store.writing() as inner:
        assert outer.intact() and inner.intact()
    with store.exclusive(wait_s=30) as started:
        assert started > 0


def test_a_local_alias_moved_meanwhile_is_not_overwritten(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    store = repo.store
    store.publish("names/a/versions/1", {"capture.json": b"{}"})
    key = "names/a/aliases/golden"
    _, tag = store.read_tagged(key)
    assert store.swap(key, b"1", tag)
    assert not store.swap(key, b"1", tag)  # the tag read before the first swap is stale
    original = store.read_tagged

    def stale(key: str) -> tuple[bytes | None, str | None]:
        data, current = original(key)
        store.swap(key, b"9", current)  # another writer, between this read and the write
        return data, current

    store.read_tagged = stale  # type: ignore[method-assign]
    with pytest.raises(RepoBusyError, match="moved by another writer"):
        repo.set_alias("a:v1", "golden")


def test_a_local_read_never_goes_through_a_linked_folder(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "repo")
    store.open(MARKER, marker_json(), create=True)
    outside = tmp_path / "outside"
    (outside / "aliases").mkdir(parents=True)
    (outside / "aliases" / "golden").write_text("1")
    (tmp_path / "repo" / "names" / "a").symlink_to(outside, target_is_directory=True)
    with pytest.raises(CorruptCaptureError, match="symbolic link"):
        store.read("names/a/aliases/golden")
    with pytest.raises(CorruptCaptureError, match="symbolic link"):
        store.write("names/a/aliases/golden", b"2")
    with pytest.raises(CorruptCaptureError, match="symbolic link"):
        store.publish("names/a/versions/1", {"capture.json": b"{}"})
    assert sorted(p.name for p in outside.iterdir()) == ["aliases"]  # no versions/ made through the link
    assert (outside / "aliases" / "golden").read_text() == "1"


# ------------------------------------------------------------------------------ the object-backend contract


def _backend(kind: str, tmp_path: Path) -> ObjectBackend:
    backend: ObjectBackend = (MemoryObjects(f"memory://backend-{uuid.uuid4().hex[:8]}") if kind == "memory"
                              else SqliteObjects(f"sqlite://{tmp_path}/backend.db"))
    backend.make_base()
    return backend


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_backend_reads_ranges_lists_and_deletes(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The eight primitives and what the base derives from them, objects larger than a part
    included (parts shrunk so that a few KiB cross several)."""
    monkeypatch.setattr(backend_module, "PART_BYTES", 1000)
    monkeypatch.setattr(sqlite_module, "_PART", 700)
    objects = _backend(kind, tmp_path)
    big = bytes(range(256)) * 20  # 5,120 bytes: uploaded in 6 pieces, kept (SQLite) in 8 parts
    objects.put(objects.key("names", "a", "versions", "1", "capture.json"), b"{}")
    objects.put(objects.key("names", "b", "index.json"), b"[]")
    objects.put(objects.key("names", "c", "junk"), b"")  # a folder that holds no name
    objects.put(objects.key("names2", "x"), b"not under names/")
    objects.upload_bytes(memoryview(big), objects.key("blobs", "ab", "big"))
    source = tmp_path / "upload"
    source.write_bytes(big[::-1])
    objects.upload_file(source, objects.key("blobs", "cd", "file"))
    assert objects.get(objects.key("blobs", "ab", "big")) == big
    assert objects.read(objects.key("blobs", "cd", "file")) == big[::-1]
    for start, end in ((0, 1), (699, 701), (1234, 4321), (5000, 9999), (5120, 5200)):
        assert objects.read_range(objects.key("blobs", "ab", "big"), start, end) == big[start:end]
    info = objects.stat(objects.key("blobs", "ab", "big"))
    assert info is not None and info.size == len(big) and abs(info.mtime - time.time()) < 600
    assert objects.stat(objects.key("nothing")) is None and objects.get(objects.key("nothing")) is None
    assert objects.get(objects.key("names", "c", "junk")) == b""
    assert sorted(objects.list("names")) == ["names/a/versions/1/capture.json", "names/b/index.json", "names/c/junk"]
    assert objects.list("names")["names/b/index.json"].size == 2
    assert objects.ls("names") == {"a": "directory", "b": "directory", "c": "directory"}
    assert objects.folders_holding("names", "index.json", "versions") == ["a", "b"]
    with pytest.raises(CorruptCaptureError, match="more than the 100"):
        objects.read(objects.key("blobs", "ab", "big"), 100)
    assert objects.read_many([objects.key("names", "b", "index.json"), objects.key("blobs", "ab", "big"),
                              objects.key("nothing")], lambda key: (100, "")) == {objects.key("names", "b", "index.json"): b"[]"}
    objects.delete([objects.key("blobs", "ab", "big"), objects.key("nothing")])
    assert not objects.exists(objects.key("blobs", "ab", "big")) and objects.exists(objects.key("blobs", "cd", "file"))


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_backend_creates_once_and_replaces_only_what_it_read(kind: str, tmp_path: Path) -> None:
    objects = _backend(kind, tmp_path)
    key = objects.key("names", "a", "aliases", "golden")
    assert objects.read_tagged(key) == (None, None)
    assert objects.create(key, b"1") and not objects.create(key, b"2")
    data, tag = objects.read_tagged(key)
    assert data == b"1" and tag is not None
    assert objects.replace(key, b"x", None) is None  # "only if absent": it is not
    new_tag = objects.replace(key, b"3", tag)
    assert new_tag is not None and new_tag != tag
    assert objects.replace(key, b"4", tag) is None  # stale: another writer moved it since
    assert objects.read_tagged(key) == (b"3", new_tag)
    assert objects.replace(objects.key("names", "a", "aliases", "new"), b"5", None) is not None


def test_sqlite_reading_a_missing_repo_never_creates_it_and_a_foreign_file_is_one_line(tmp_path: Path) -> None:
    missing = SqliteObjects(f"sqlite://{tmp_path}/missing.db")
    assert missing.get("marker") is None and missing.list("names") == {} and missing.stat("x") is None
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(modulelens.CaptureNotFoundError):
        modulelens.Repo(f"sqlite://{tmp_path}/missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()
    (tmp_path / "notes.db").write_text("not a database, but a text file someone named .db\n" * 100)
    with pytest.raises(RemoteRepoError) as raised:
        modulelens.Repo(f"sqlite://{tmp_path}/notes.db")
    assert "\n" not in str(raised.value) and "notes.db" in str(raised.value)
    assert (tmp_path / "notes.db").read_text().startswith("not a database")  # left as it was


def test_sqlite_a_large_object_appears_whole_and_a_killed_writers_staging_is_swept(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_module, "_PART", 100)
    objects = _backend("sqlite", tmp_path)
    objects.put("blobs/x", b"old")
    seen = []

    def pieces() -> Iterator[bytes]:
        for i in range(5):
            seen.append(objects.get("blobs/x"))  # read between the parts being staged
            yield bytes([i]) * 100

    objects.put_stream("blobs/x", pieces())
    assert seen == [b"old"] * 5 and objects.get("blobs/x") == b"".join(bytes([i]) * 100 for i in range(5))
    with sqlite3.connect(tmp_path / "backend.db") as db:  # what a writer killed mid-upload two days ago left
        db.execute("INSERT INTO parts VALUES (?, 0, ?)", (f"\x00staging/{time.time_ns() - 2 * 86400 * 10**9:020d}/x",
                                                          b"z" * 100))
        db.execute("INSERT INTO parts VALUES (?, 0, ?)", (f"\x00staging/{time.time_ns():020d}/y", b"z" * 100))
    objects.put("names/a/aliases/golden", b"1")
    with sqlite3.connect(tmp_path / "backend.db") as db:
        left = [key for (key,) in db.execute("SELECT key FROM parts WHERE key < 'A'")]
    assert len(left) == 1 and left[0].endswith("/y")  # an upload still going on is left alone


def test_a_backend_is_at_most_twelve_methods_and_the_store_interface_shrank() -> None:
    """Issue 39's measure, kept true: the primitives a backend must write, the methods the SQLite
    backend (the worked example) defines in all, and the members a Store must implement."""
    assert sorted(ObjectBackend.__abstractmethods__) == ["create", "delete", "get", "list", "make_base",
                                                         "put_stream", "replace", "stat"]
    defined = [name for name, value in vars(SqliteObjects).items() if callable(value)]
    assert len(defined) <= 12, defined
    assert len(Store.__abstractmethods__) <= 22, sorted(Store.__abstractmethods__)
