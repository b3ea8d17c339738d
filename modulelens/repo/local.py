"""The embedded local repo: content-addressed payload blobs plus immutable, numbered versions.

Layout (see docs/repo-layout.md)::

    <root>/modulelens-repo.json          layout version
    <root>/blobs/<2 hex>/<hash hex>      raw tensor payloads and packs of small ones, named by their blake3 hash
    <root>/blobs/<2 hex>/<hash hex>.ok   "size mtime" of the blob when its hash was last checked
    <root>/names/<quoted name>/versions/<N>/capture.json
    <root>/names/<quoted name>/versions/<N>/reports/<kind>-<time>-<id>.json
    <root>/names/<quoted name>/aliases/<alias>     text: the version number
    <root>/names/<quoted name>/summary.json        listing cache (repo/index.py)
    <root>/tmp/                          staging area; everything becomes visible by rename
    <root>/lock                          shared by writers, exclusive for gc

A version directory appears in one ``rename`` of a fully written staging directory, so a crash
never leaves a half-visible version, and two writers racing for ``N`` both succeed: the loser of
the rename takes ``N+1``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import mmap
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISREG
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from modulelens.errors import CaptureNotFoundError, CorruptCaptureError, InvalidNameError, RepoError
from modulelens.format.hashing import HASH_ALGORITHM, hash_bytes
from modulelens.format.provenance import PROVENANCE_FIELD, field_line, field_lines
from modulelens.repo.files import (
    flush_and_rename,
    flush_file,
    flush_folder,
    open_regular,
    read_regular,
    require_dir,
    write_new_file,
)
from modulelens.repo.index import NameIndex, version_entry
from modulelens.repo.markers import MARK_MIN_BYTES, ChunkDigests, chunk_digests, sampled_check, write_marker
from modulelens.repo.names import LATEST, Ref, parse_ref, validate_alias, validate_name, validate_report_file
from modulelens.repo.packs import PACK_BELOW, Payloads, referenced_blobs, store_packs
from modulelens.repo.trust import capture_sealer, set_trust_source, trusts_source

if TYPE_CHECKING:
    from concurrent.futures import Future

    from modulelens.repo.fsck import FsckReport
    from modulelens.repo.transfer import TransferReport

# 2: small payloads in packs, per-name summaries (docs/repo-layout.md). Layout-1 repos are read as
# they are; the first save into one rewrites the marker, so older modulelens refuse it instead of
# failing on a payload they cannot find.
LAYOUT_VERSION = 2
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MARKER = "modulelens-repo.json"
CAPTURE_FILE = "capture.json"
_TOMBSTONE = ".removed"  # versions/<N>.removed: N was used by a version since removed


def capture_json(metadata: dict[str, Any], seal: Callable[[list[str]], dict[str, Any]] | None = None) -> bytes:
    """A capture's ``capture.json``: one line per top-level field. Indented JSON goes through the
    pure-Python encoder, a third of a 5,000-tensor save (benchmarks/bench_repo.py); compact values
    use the C encoder and the file stays readable field by field. ``seal`` (a new capture saved
    here: :func:`modulelens.repo.trust.capture_sealer`) signs those very lines, so signing costs no
    second encoding, and its ``provenance`` field is set in ``metadata`` and written last."""
    fields = field_lines(metadata) if seal is not None else [field_line(k, v) for k, v in metadata.items()]
    if seal is not None:
        metadata[PROVENANCE_FIELD] = seal(fields)
        fields.append(field_line(PROVENANCE_FIELD, metadata[PROVENANCE_FIELD]))
    return ("{\n" + ",\n".join(fields) + "\n}\n").encode()


def is_url(location: str | os.PathLike[str]) -> bool:
    """True for an fsspec URL other than ``file://`` (those are served by :class:`RemoteRepo`)."""
    text = os.fspath(location)
    return "://" in text and not text.startswith("file://")


def default_repo_location() -> str:
    """``$MODULELENS_REPO`` (a directory or a URL such as ``s3://bucket/prefix``), else the default
    local repo path."""
    env = os.environ.get("MODULELENS_REPO")
    if env:
        return env if is_url(env) else str(Path(env).expanduser())
    return str(default_repo_path())


def default_repo_path() -> Path:
    """``$MODULELENS_REPO``, else ``$XDG_CACHE_HOME/modulelens/repo`` (``~/.cache/...``)."""
    env = os.environ.get("MODULELENS_REPO")
    if env and not is_url(env):
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "modulelens" / "repo"


@dataclass(slots=True)
class VersionInfo:
    """One stored version, as a listing describes it: a snapshot (changing it changes nothing
    stored). Not frozen: a frozen dataclass sets each field through ``object.__setattr__``, which
    made building these 5x slower and a fifth of listing 2,000 versions (benchmarks/bench_repo.py)."""

    name: str
    version: int
    folder: str  # the version's folder or URL (a str: building 2,000 Paths was most of a listing's time)
    created: str
    tags: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    nbytes: int = 0
    module_class: str = ""
    calls: int = 0
    problem: str | None = None  # why its metadata cannot be read (a damaged version still lists)

    @property
    def ref(self) -> str:
        return f"{self.name}:v{self.version}"

    @property
    def path(self) -> Path:
        """The version's folder (``capture.json``, ``reports/``) in a local repo; for a remote repo
        use :attr:`folder` (its URL) or ``repo.version_path()`` (the cached copy)."""
        return Path(self.folder)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "version": self.version, "ref": self.ref, "path": self.folder,
            "created": self.created, "tags": list(self.tags), "aliases": list(self.aliases),
            "payload_bytes": self.nbytes, "module_class": self.module_class, "calls": self.calls,
            "problem": self.problem,
        }


@dataclass
class GcReport:
    """What :meth:`Repo.gc` removed (or, with ``dry_run``, would remove) and kept."""

    removed_blobs: int = 0
    freed_bytes: int = 0
    kept_blobs: int = 0
    removed_tmp: int = 0
    dry_run: bool = False
    removed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"removed_blobs": self.removed_blobs, "freed_bytes": self.freed_bytes,
                "kept_blobs": self.kept_blobs, "removed_tmp": self.removed_tmp, "dry_run": self.dry_run}


class Repo:
    """A modulelens repository: a local directory, or any fsspec URL (``s3://bucket/prefix``,
    ``memory://x``, ``gs://...``), which returns a :class:`~modulelens.repo.remote.RemoteRepo`.

    Args:
        path: a directory, a ``file://`` or other fsspec URL; ``None`` means ``$MODULELENS_REPO``
            or ``~/.cache/modulelens/repo``.
        create: create the repo when it does not exist (readers pass ``False``).

    Raises:
        CaptureNotFoundError: ``create=False`` and there is no repo there.

    Example::

        repo = modulelens.Repo("/data/captures")   # or Repo() for $MODULELENS_REPO / the default
        for info in repo.list():
            print(info.ref, info.module_class)
    """

    is_remote: bool = False

    def __new__(cls, path: str | os.PathLike[str] | None = None, *args: Any, **kwargs: Any) -> Repo:
        if cls is Repo and is_url(default_repo_location() if path is None else path):
            from modulelens.repo.remote import RemoteRepo

            return super().__new__(RemoteRepo)
        return super().__new__(cls)

    def __init__(self, path: str | os.PathLike[str] | None = None, *, create: bool = True) -> None:
        if path is None:
            path = default_repo_path()
        text = os.fspath(path)
        if text.startswith("file://"):
            text = text[len("file://"):]
        self.root = Path(text).expanduser().absolute()
        marker = self.root / _MARKER
        if not marker.exists():
            if not create:
                raise CaptureNotFoundError(f"no modulelens repo at {self.root}")
            self._initialise()
        else:
            try:
                layout = json.loads(read_regular(marker))["layout_version"]
            except (ValueError, KeyError, TypeError) as error:
                raise CorruptCaptureError(f"{marker}: unreadable repo marker ({error})") from None
            self._layout = layout
            if layout > LAYOUT_VERSION:
                raise RepoError(
                    f"repo {self.root} has layout {layout}; this modulelens reads up to {LAYOUT_VERSION}"
                )

    def __repr__(self) -> str:
        return f"Repo({str(self.root)!r})"

    @property
    def trust_source(self) -> bool:
        """Whether loading this repo's captures runs their stored source by default.

        Off unless you set it on your own repo (``repo.trust_source = True`` or
        ``modulelens trust --repo DIR``); the setting is bound to this directory and user, so a
        copied or downloaded repo never arrives trusted (docs/security.md)."""
        return trusts_source(self.root)

    @trust_source.setter
    def trust_source(self, value: bool) -> None:
        set_trust_source(self.root, bool(value))

    def __fspath__(self) -> str:
        return str(self.root)

    @property
    def location(self) -> str:
        """What to pass to ``Repo()`` (or ``--repo``) to open this repo again: a path or a URL."""
        return str(self.root)

    # ---------------------------------------------------------------------------------- setup

    _layout = LAYOUT_VERSION
    _summaries: dict[str, dict[str, Any]]

    def _initialise(self) -> None:
        for sub in ("blobs", "names", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._atomic_write(self.root / _MARKER, json.dumps({"layout_version": LAYOUT_VERSION}).encode())

    def _upgrade_layout(self) -> None:
        """Mark a layout-1 repo as layout 2 before writing anything only layout 2 can read."""
        if self._layout < LAYOUT_VERSION:
            self._atomic_write(self.root / _MARKER, json.dumps({"layout_version": LAYOUT_VERSION}).encode())
            self._layout = LAYOUT_VERSION

    @contextlib.contextmanager
    def _lock(self, exclusive: bool) -> Iterator[None]:
        """Saves hold ``lock`` shared, gc and ``fsck --repair`` exclusively. Linux grants a shared
        ``flock`` while an exclusive one waits, so saves run back to back kept gc waiting forever
        (issue 12). A turnstile, ``lock-gate``, makes it fair: a saver passes it (held exclusively
        for an instant) before taking ``lock``; gc holds it while it waits for ``lock``, so new saves
        queue behind gc, saves in progress finish, and gc runs."""
        with self._flock("lock-gate", exclusive=True) if exclusive else self._passing_gate():
            with self._flock("lock", exclusive=exclusive):
                yield

    @contextlib.contextmanager
    def _passing_gate(self) -> Iterator[None]:
        with self._flock("lock-gate", exclusive=True):
            pass
        yield

    @contextlib.contextmanager
    def _flock(self, filename: str, *, exclusive: bool) -> Iterator[None]:
        fd = os.open(self.root / filename, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # releases the lock

    def exclusive_lock(self) -> contextlib.AbstractContextManager[None]:
        """Hold the repo against every save (what gc and ``fsck --repair`` do while they work)."""
        return self._lock(exclusive=True)

    def _tmp_path(self, suffix: str = "") -> Path:
        tmp = self.root / "tmp"
        tmp.mkdir(exist_ok=True)
        return tmp / f"{os.getpid()}-{uuid.uuid4().hex}{suffix}"

    def _atomic_write(self, target: Path, data: bytes | memoryview, *, flush: bool = True) -> None:
        """Replace ``target`` in one rename; ``flush=False`` for caches, which are rebuilt when lost."""
        tmp = self._tmp_path()
        write_new_file(tmp, data, mode=0o644)
        if flush:
            flush_and_rename(tmp, target)
        else:
            os.replace(tmp, target)

    # ---------------------------------------------------------------------------------- blobs

    def blob_path(self, digest: str) -> Path:
        algorithm, _, hexdigest = digest.partition(":")
        if algorithm != HASH_ALGORITHM or not _HEX64.fullmatch(hexdigest):
            raise CorruptCaptureError(f"malformed payload hash {digest!r}")
        return Path(f"{self.root}/blobs/{hexdigest[:2]}/{hexdigest}")  # one parse, not three joins: a load asks per blob

    def write_blob(self, digest: str, data: memoryview | bytes, *, chunks: ChunkDigests | None = None) -> bool:
        """Store a payload under its hash, durably; returns False when it was already there (dedup).
        ``chunks``: its marker's chunk hashes, when the caller computed them with the hash."""
        if self.has_blob(digest):
            return False
        self._publish_blob(self._stage_blob(data), digest, chunks)
        return True

    def _stage_blob(self, data: memoryview | bytes) -> tuple[Path | None, memoryview]:
        view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
        tmp = self._tmp_path()
        write_new_file(tmp, view)
        return tmp, view

    def _publish_blob(self, staged: tuple[Path | None, memoryview], digest: str, chunks: ChunkDigests | None,
                      *, flush_folder_now: bool = True) -> Path | None:
        """Flush a staged payload and rename it into ``blobs/``; then write its marker. Returns the
        blob's path (``None`` where a subclass stores it elsewhere)."""
        tmp, view = staged
        assert tmp is not None
        path = self.blob_path(digest)
        path.parent.mkdir(exist_ok=True)
        require_dir(path.parent)  # a shard folder planted as a link is refused, never written through
        flush_and_rename(tmp, path, flush_target_folder=flush_folder_now)
        if len(view) >= MARK_MIN_BYTES:
            write_marker(path, chunks or chunk_digests(view))
        return path

    def has_blob(self, digest: str) -> bool:
        return _is_regular(self.blob_path(digest))

    def put_blob_file(self, digest: str, source: Path, *, verified: bool = False) -> int:
        """Copy the file ``source`` (whose content hashes to ``digest``) in as a blob; returns the
        bytes added (0 when the blob was already there).

        ``verified``: ``source`` was hash-checked already (a path from another repo's
        :meth:`check_blob`), so it is not hashed again, and it is hard-linked rather than copied
        when both are on one filesystem (blobs are read-only and never change, so sharing an inode
        is safe); this makes a pull from a cached remote cost no second write.
        """
        path = self.blob_path(digest)
        if _is_regular(path):
            return 0
        size = os.path.getsize(source)
        if verified and self._link_blob(source, path):
            return size
        if not verified and self._hash_file(Path(source), size) != digest:
            raise CorruptCaptureError(f"{source} does not hash to {digest}")
        if size == 0:
            self.write_blob(digest, b"")
            return 0
        with os.fdopen(open_regular(source), "rb") as handle, \
                mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                self.write_blob(digest, view)
            finally:
                view.release()
        return size

    def _link_blob(self, source: Path, path: Path) -> bool:
        path.parent.mkdir(exist_ok=True)
        tmp = self._tmp_path()
        try:
            os.link(source, tmp)
        except OSError:  # another filesystem, or links not supported: copy instead
            return False
        os.replace(tmp, path)
        return True

    def fetch_version(self, name: str, version: int) -> None:
        """Make every payload of a version available locally (a no-op here; a remote repo downloads
        them into its cache in parallel)."""

    def download(self, blobs: dict[str, int], *, label: str = "") -> int:
        """Make ``{digest: nbytes}`` available locally; returns bytes downloaded (always 0 here)."""
        return 0

    def check_blob(self, digest: str, nbytes: int, *, full: bool = False) -> Path:
        """Path of a payload after checking it: size always; the full hash for small payloads,
        for large ones changed since their last check, or always with ``full``; otherwise a
        sampled hash of a few chunks (coverage: :mod:`modulelens.repo.markers`)."""
        path = self.blob_path(digest)
        try:
            stat = os.lstat(path)
        except FileNotFoundError:
            raise CorruptCaptureError(f"payload {digest} is missing from {self.root}") from None
        if not S_ISREG(stat.st_mode):
            raise CorruptCaptureError(f"payload {path} is not a regular file (a link or other entry is never followed)")
        if stat.st_size != nbytes:
            raise CorruptCaptureError(
                f"payload {digest} has {stat.st_size} bytes, expected {nbytes} (truncated or damaged)"
            )
        sampled = None if full or stat.st_size < MARK_MIN_BYTES else sampled_check(path, stat)
        if sampled is False:
            raise CorruptCaptureError(f"payload {path} is corrupted: a sampled chunk does not hash as recorded")
        if sampled is None:
            actual = self._hash_file(path, stat.st_size)
            if actual != digest:
                raise CorruptCaptureError(f"payload {path} is corrupted: its content hashes to {actual}")
            if stat.st_size >= MARK_MIN_BYTES:
                write_marker(path)
        return path

    @staticmethod
    def _hash_file(path: Path, size: int) -> str:
        if size == 0:
            return hash_bytes(b"")
        with os.fdopen(open_regular(path), "rb") as handle, \
                mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return hash_bytes(memoryview(mapped))

    def payloads(self, metadata: dict[str, Any]) -> Payloads:
        """Reader of one capture's payloads, loose or packed (see :mod:`modulelens.repo.packs`).

        Example::

            payloads = repo.payloads(meta)
            weight = payloads.open_tensor(meta["tensors"]["t0"], torch.float32)
        """
        return Payloads(self, metadata)

    # ---------------------------------------------------------------------------------- names

    def _name_dir(self, name: str) -> Path:
        return self.root / "names" / quote(validate_name(name), safe="")

    def _version_dir(self, name: str, version: int) -> Path:
        return self._name_dir(name) / "versions" / str(version)

    def _index(self, name: str, name_dir: str | None = None) -> NameIndex:
        return NameIndex(name_dir or f"{self.root}/names/{quote(validate_name(name), safe='')}",
                         lambda v: self.read_metadata(name, v),
                         lambda target, data: self._atomic_write(target, data, flush=False))

    def _summary(self, name: str, fresh: dict[int, dict[str, Any]] | None = None, *,
                 persist: bool = False) -> dict[str, Any]:
        """The name's summary (repo/index.py), kept in memory while the folders do not change;
        written back to ``summary.json`` only with ``persist`` (by operations that write)."""
        return self._summary_in(name, None, fresh, persist=persist)

    def _summary_in(self, name: str, name_dir: str | None, fresh: dict[int, dict[str, Any]] | None = None, *,
                    persist: bool = False, keep: bool = True) -> dict[str, Any]:
        """:meth:`_summary`, given the name's folder when a listing found it (so the name is not
        validated and quoted again: a tenth of a listing's time). ``keep=False``: not kept in
        memory (a walk over every name keeps nothing it will not ask for again; keeping 2,000
        versions' summaries alive made the garbage collector a sixth of a listing)."""
        if "_summaries" not in self.__dict__:
            self._summaries = {}
        summary = self._index(name, name_dir).read(self._summaries.get(name), fresh, persist=persist)
        if keep:
            self._summaries[name] = summary
        return summary

    def rebuild_summary(self, name: str) -> None:
        """Rebuild ``name``'s ``summary.json`` from its folders, ignoring the stored one (fsck --repair)."""
        self.__dict__.setdefault("_summaries", {}).pop(name, None)
        self._summaries[name] = self._index(name).read(rebuild=True, persist=True)

    def fsck(self, *, repair: bool = False) -> FsckReport:
        """Check every version's metadata and payloads, aliases, summaries and the layout; with
        ``repair``, move what is broken into ``quarantine/`` (docs/repo-layout.md, "fsck").

        Args:
            repair: quarantine broken versions, payloads, foreign entries and dangling aliases,
                and rebuild the summaries; nothing is deleted.

        Returns:
            A :class:`~modulelens.repo.fsck.FsckReport` (``report.clean``, ``report.problems``).

        Example::

            report = modulelens.Repo().fsck()
            assert report.clean, [p.detail for p in report.problems]
        """
        from modulelens.repo.fsck import fsck

        return fsck(self, repair=repair)

    def _quoted_names(self) -> list[str]:
        try:
            with os.scandir(self.root / "names") as found:
                return [entry.name for entry in found if entry.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return []

    def _name_summaries(self, *, persist: bool = False) -> Iterator[tuple[str, str | None, dict[str, Any]]]:
        """``(name, folder, summary)`` of every name folder, in name order (what list, names and gc
        walk; ``persist``: gc, a writer, stores summaries it had to rebuild)."""
        names_dir = f"{self.root}/names"
        for name, quoted in sorted((_unquote_name(q), q) for q in self._quoted_names()):
            name_dir = f"{names_dir}/{quoted}"
            yield name, name_dir, self._summary_in(name, name_dir, persist=persist, keep=False)

    def names(self) -> list[str]:
        return [name for name, _, summary in self._name_summaries() if summary["versions"]]

    @staticmethod
    def _version_numbers(name_dir: Path) -> list[int]:
        versions = name_dir / "versions"
        if not versions.exists():
            return []
        return sorted(int(p.name) for p in versions.iterdir() if p.name.isdigit())

    @staticmethod
    def _highest_used(versions_dir: Path) -> int:
        """The highest version number ever used: visible versions and tombstones of removed ones."""
        used = [int(p.name.removesuffix(_TOMBSTONE)) for p in versions_dir.iterdir()
                if p.name.removesuffix(_TOMBSTONE).isdigit()]
        return max(used, default=0)

    def version_numbers(self, name: str) -> list[int]:
        return [int(v) for v in self._summary(name)["versions"]]

    def save_version(self, name: str, metadata: dict[str, Any], payloads: dict[str, memoryview]) -> VersionInfo:
        """Store a capture: hash and write its payloads (``tensor id -> bytes``; blobs already
        present are skipped), fill the hashes into ``metadata["tensors"]``, then make the version
        visible in one atomic rename."""
        validate_name(name)
        with self._lock(exclusive=False):
            self._store_payloads(metadata, payloads)
            return self._commit(name, metadata, seal=capture_sealer(self.root))  # yours: signed (repo/trust.py)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold off gc while blobs are copied in and then committed (push/pull): gc must not take
        a blob written here for garbage before the version that references it exists. Here the
        repo lock, shared (as a save holds it); a remote repo holds a lease."""
        with self._lock(exclusive=False):
            yield

    def commit_version(self, name: str, metadata: dict[str, Any]) -> VersionInfo:
        """Make a new version of ``name`` whose payloads are all already stored (push/pull).

        Raises:
            CorruptCaptureError: a payload the metadata names is not in this repo.
        """
        validate_name(name)
        with self._lock(exclusive=False):
            for digest in referenced_blobs(metadata):
                if not self.has_blob(digest):
                    raise CorruptCaptureError(f"payload {digest} is missing from {self.root}")
            if metadata.get("packs"):
                self._upgrade_layout()
            return self._commit(name, metadata)

    def _commit(self, name: str, metadata: dict[str, Any],
                seal: Callable[[list[str]], dict[str, Any]] | None = None) -> VersionInfo:
        staging = self._tmp_path(".version")
        staging.mkdir()
        (staging / "reports").mkdir()
        versions_dir = self._versions_folder(name)
        for _attempt in range(1000):
            version = self._highest_used(versions_dir) + 1
            metadata["version"] = version
            metadata["name"] = name
            capture_file = staging / CAPTURE_FILE
            capture_file.unlink(missing_ok=True)
            write_new_file(capture_file, capture_json(metadata, seal), mode=0o644)
            flush_file(capture_file)
            flush_folder(staging)
            try:
                os.rename(staging, versions_dir / str(version))
            except OSError as error:
                if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    continue  # another writer took this number; take the next one
                raise
            flush_folder(versions_dir)  # the rename itself is what makes the version exist
            entry = version_entry(metadata)
            summary = self._summary(name, fresh={version: entry}, persist=True)
            if str(version) not in summary["versions"]:  # removed by a concurrent rm meanwhile: still saved
                summary = {"versions": {str(version): entry}, "aliases": {}}
            return self._infos(name, summary, [version])[0]
        raise RepoError(f"could not allocate a version for {name!r} after 1000 attempts")

    def _versions_folder(self, name: str) -> Path:
        """``names/<name>/versions``, created durably on a name's first save."""
        versions_dir = self._name_dir(name) / "versions"
        if not versions_dir.is_dir():
            versions_dir.mkdir(parents=True, exist_ok=True)
            for folder in (versions_dir.parent, versions_dir.parent.parent):
                flush_folder(folder)
        return versions_dir

    def _store_payloads(self, metadata: dict[str, Any], payloads: dict[str, memoryview]) -> None:
        """Hash and store every payload: small ones into packs, large ones as their own blobs."""
        views = {tid: memoryview(data).cast("B") if memoryview(data).format != "B" else memoryview(data)
                 for tid, data in payloads.items()}
        small = {tid: data for tid, data in views.items() if len(data) < PACK_BELOW}
        self._write_payloads(metadata["tensors"], {t: d for t, d in views.items() if t not in small})
        if small:
            self._upgrade_layout()
            store_packs(self, metadata, small)

    def _write_payloads(self, entries: dict[str, dict[str, Any]], payloads: dict[str, memoryview]) -> None:
        # A pipeline of three threads: the hashing thread hashes payload k+1 (blake3 itself uses
        # every core for large payloads) while this thread writes payload k and the flushing thread
        # waits for the disk to take payload k-1. All three release the GIL, so a save costs about
        # the slowest of hashing, writing and flushing rather than their sum
        # (benchmarks/bench_save_load.py).
        from concurrent.futures import ThreadPoolExecutor  # here: listing a repo does not need threads

        items = list(payloads.items())
        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="modulelens-hash") as hasher, \
                    ThreadPoolExecutor(max_workers=1, thread_name_prefix="modulelens-flush") as flusher:
                fingerprints = [hasher.submit(_fingerprint, data) for _, data in items]
                published: dict[str, Future[Path | None]] = {}
                for (tid, data), fingerprint in zip(items, fingerprints, strict=True):
                    digest, chunks = fingerprint.result()
                    entries[tid]["payload"] = digest
                    if digest not in published and not self.has_blob(digest):
                        published[digest] = flusher.submit(self._publish_blob, self._stage_blob(data), digest, chunks,
                                                           flush_folder_now=False)
                paths = [future.result() for future in published.values()]
                folders = {path.parent for path in paths if path is not None}
        except RuntimeError as error:
            # A save from an atexit handler (`modulelens run` saving what a job recorded before it
            # ended) runs after concurrent.futures has shut down: "cannot schedule new futures
            # after interpreter shutdown". Do each step in this thread instead.
            if "interpreter shutdown" not in str(error):
                raise
            for tid, data in items:
                entries[tid]["payload"], chunks = _fingerprint(data)
                self.write_blob(entries[tid]["payload"], data, chunks=chunks)
            return
        for folder in folders:
            flush_folder(folder)

    def resolve(self, ref: str | Ref) -> tuple[str, int]:
        """``"name"``, ``"name:v3"``, ``"name:alias"`` -> ``(name, 3)``."""
        parsed = parse_ref(ref) if isinstance(ref, str) else ref
        versions = self.version_numbers(parsed.name)
        if not versions:
            raise CaptureNotFoundError(f"no capture named {parsed.name!r} in {self.root}")
        if parsed.selector in (None, LATEST):
            return parsed.name, versions[-1]
        if parsed.version is not None:
            if parsed.version not in versions:
                raise CaptureNotFoundError(
                    f"{parsed.name} has no version v{parsed.version} (versions: "
                    + ", ".join(f"v{v}" for v in versions) + ")"
                )
            return parsed.name, parsed.version
        aliases = self.aliases(parsed.name)
        if parsed.selector not in aliases:
            raise CaptureNotFoundError(f"{parsed.name} has no alias {parsed.selector!r}")
        return parsed.name, aliases[parsed.selector]

    def version_path(self, name: str, version: int) -> Path:
        path = self._version_dir(name, version)
        try:
            require_dir(path)  # a linked version folder is refused, never read through
        except FileNotFoundError:
            raise CaptureNotFoundError(f"{name}:v{version} does not exist in {self.root}") from None
        return path

    def read_metadata(self, name: str, version: int) -> dict[str, Any]:
        path = self.version_path(name, version) / CAPTURE_FILE
        try:
            text = read_regular(path)  # json.loads decodes; undecodable bytes are a ValueError there
        except FileNotFoundError:
            raise CorruptCaptureError(f"{path} is missing") from None
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as error:
            raise CorruptCaptureError(f"{path} is not valid JSON (truncated or damaged): {error}") from None
        from modulelens.format.validate import validate_capture  # here: `ls` starts without the validator

        validate_capture(data, str(path))
        return data

    def info(self, name: str, version: int) -> VersionInfo:
        summary = self._summary(name)
        if str(version) not in summary["versions"]:
            raise CaptureNotFoundError(f"{name}:v{version} does not exist in {self.location}")
        return self._infos(name, summary, [version])[0]

    def _infos(self, name: str, summary: dict[str, Any], versions: list[int] | None = None, *,
               name_dir: str | None = None) -> list[VersionInfo]:
        """VersionInfos of ``versions`` (default: all) of ``name``, from its summary (``name_dir``:
        its folder, when the caller knows it)."""
        entries = summary["versions"]
        by_version: dict[int, tuple[str, ...]] = {}
        for alias, number in sorted(summary["aliases"].items()):
            by_version[number] = (*by_version.get(number, ()), alias)
        latest = next(reversed(entries), None)
        if latest is not None:
            by_version[int(latest)] = (LATEST, *by_version.get(int(latest), ()))
        # Where the version lives, as its repo is named: a path, or for a remote repo its URL
        # (never the local mirror that caches its capture.json).
        folder = f"{name_dir or f'{self.location.rstrip(chr(47))}/names/' + quote(name, safe='')}/versions/"
        chosen = entries.items() if versions is None else [(str(v), entries[str(v)]) for v in versions]
        aliases_of = by_version.get
        # The hot loop of a listing, one VersionInfo per version: a comprehension with the lookups
        # bound once, and no tuple built for the usual empty tags (a third of this function's time).
        return [VersionInfo(name, number, folder + key, entry["created"], tuple(tags) if (tags := entry["tags"]) else (),
                            aliases_of(number, ()), entry["nbytes"], entry["module_class"], entry["calls"],
                            entry.get("problem"))
                for key, entry in chosen for number in (int(key),)]

    def list(self, name: str | None = None) -> list[VersionInfo]:
        if name:
            return self._infos(name, self._summary(name))
        return [info for name, name_dir, summary in self._name_summaries()
                for info in self._infos(name, summary, name_dir=name_dir)]

    # ---------------------------------------------------------------------------------- aliases

    def aliases(self, name: str) -> dict[str, int]:
        return dict(self._summary(name)["aliases"])

    def set_alias(self, ref: str, alias: str) -> VersionInfo:
        """Point ``alias`` at the version ``ref`` resolves to (aliases are movable)."""
        validate_alias(alias)
        if alias == LATEST:
            raise InvalidNameError("'latest' is maintained automatically and cannot be set")
        name, version = self.resolve(ref)
        folder = self._name_dir(name) / "aliases"
        folder.mkdir(exist_ok=True)
        require_dir(folder)
        self._atomic_write(folder / alias, str(version).encode())
        self._summary(name, persist=True)  # the folder changed, so the summary is brought up to date
        return self.info(name, version)

    def push(self, ref: str, to: str | os.PathLike[str] | Repo, *, aliases: bool = False) -> TransferReport:
        """Copy ``ref`` (one version, or every version of a bare name) to another repo.

        Args:
            ref: ``name``, ``name:v3``, ``name:alias``.
            to: the target repo or its path/URL (created if missing).
            aliases: also set the source's aliases of the copied versions in the target.

        Returns:
            What was copied; only payloads the target lacked were uploaded.

        Example::

            modulelens.Repo().push("ranker/top_mlp:golden", "s3://team-bucket/captures", aliases=True)
        """
        from modulelens.repo.transfer import copy_versions

        return copy_versions(self, to if isinstance(to, Repo) else Repo(to), ref, aliases=aliases)

    def pull(self, source: str | os.PathLike[str] | Repo, ref: str, *, aliases: bool = False) -> TransferReport:
        """Copy ``ref`` from another repo into this one (see :meth:`push`)."""
        from modulelens.repo.transfer import copy_versions

        return copy_versions(source if isinstance(source, Repo) else Repo(source, create=False), self, ref,
                             aliases=aliases)

    def remove_alias(self, name: str, alias: str) -> None:
        path = self._name_dir(name) / "aliases" / validate_alias(alias)
        try:
            path.unlink()  # a link there is removed as a link
        except FileNotFoundError:  # never there, or removed meanwhile by a concurrent rm
            raise CaptureNotFoundError(f"{name} has no alias {alias!r}") from None
        self._summary(name, persist=True)

    # ---------------------------------------------------------------------------------- removal

    def remove(self, ref: str) -> list[str]:
        """Remove one version (``name:v2`` / ``name:alias``) or, for a bare name, every version.
        Payloads stay until :meth:`gc`."""
        parsed = parse_ref(ref)
        if parsed.selector is None:
            targets = self.version_numbers(parsed.name)
            if not targets:
                raise CaptureNotFoundError(f"no capture named {parsed.name!r} in {self.root}")
        else:
            targets = [self.resolve(parsed)[1]]
        removed = []
        for version in targets:
            if self._remove_version(parsed.name, version):
                removed.append(f"{parsed.name}:v{version}")
        for alias, version in self._summary(parsed.name, persist=True)["aliases"].items():
            if version in targets:
                with contextlib.suppress(CaptureNotFoundError):  # a concurrent rm removed it first
                    self.remove_alias(parsed.name, alias)
        if not removed:
            raise CaptureNotFoundError(f"{ref} was removed meanwhile by another process")
        return removed

    def _remove_version(self, name: str, version: int) -> bool:
        """Move one version out of sight and delete it; False when another rm got there first."""
        folder = self._version_dir(name, version)
        # A tombstone keeps the number used, so a later save never gets a removed version's
        # number (a ref someone noted down never silently means a different capture).
        with contextlib.suppress(FileExistsError):
            write_new_file(folder.with_name(f"{version}{_TOMBSTONE}"), b"", mode=0o644)
        flush_folder(folder.parent)
        trash = self._tmp_path(".trash")
        try:
            os.rename(folder, trash)  # disappears atomically; a link there is moved as a link
        except FileNotFoundError:
            return False
        if os.path.islink(trash):
            os.unlink(trash)
        else:
            shutil.rmtree(trash, ignore_errors=True)
        return True

    def gc(self, *, dry_run: bool = False, tmp_age_s: float = 3600.0) -> GcReport:
        """Delete payloads no version references, and stale staging files."""
        report = GcReport(dry_run=dry_run)
        with self._lock(exclusive=True):
            referenced: set[str] = set()
            for _name, _dir, summary in self._name_summaries(persist=True):
                for entry in summary["versions"].values():
                    referenced.update(entry["blobs"])
            referenced_hex = {digest.partition(":")[2] for digest in referenced}
            for blob in self._blob_files():
                if blob.name in referenced_hex:
                    report.kept_blobs += 1
                    continue
                with contextlib.suppress(FileNotFoundError):  # another gc or a repair got there first
                    size = blob.stat(follow_symlinks=False).st_size
                    if not dry_run:
                        os.unlink(blob.path)
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(blob.path + ".ok")
                    report.removed_blobs += 1
                    report.freed_bytes += size
                    report.removed.append(blob.name)
            self._remove_stale_staging(report, time.time() - tmp_age_s, dry_run)
        return report

    def _remove_stale_staging(self, report: GcReport, cutoff: float, dry_run: bool) -> None:
        """Staging entries older than ``cutoff``. Never follows a symlink (a link placed in ``tmp/``
        is removed as a link, never the tree it points to), an entry a concurrent ``rm`` or save
        removes meanwhile is simply gone, and the staging of a writer still running on this machine
        (``tmp/<pid>-...``) is left alone however old, so even ``tmp_age_s=0`` breaks no save."""
        with contextlib.suppress(FileNotFoundError), os.scandir(self.root / "tmp") as entries:
            for entry in list(entries):
                with contextlib.suppress(FileNotFoundError):
                    if entry.stat(follow_symlinks=False).st_mtime >= cutoff or writer_alive(entry.name):
                        continue
                    report.removed_tmp += 1
                    if dry_run:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path)
                    else:
                        os.unlink(entry.path)

    def _blob_files(self) -> Iterator[os.DirEntry[str]]:
        """Every blob file (payloads and packs), found with scandir (pathlib's glob took most of a
        gc --dry-run). Only real shard folders and regular files count: gc never follows a
        symlink placed in ``blobs/``, so it can never delete a file outside the repo."""
        with contextlib.suppress(FileNotFoundError), os.scandir(self.root / "blobs") as shards:
            for shard in shards:
                if not shard.is_dir(follow_symlinks=False):
                    continue
                with os.scandir(shard.path) as blobs:
                    yield from [b for b in blobs if not b.name.endswith(".ok") and b.is_file(follow_symlinks=False)]

    # ---------------------------------------------------------------------------------- reports

    def add_report(self, ref: str, kind: str, data: dict[str, Any]) -> Path:
        """Store a tool's report (profile, verify, ...) with the version it was made on."""
        name, version = self.resolve(ref)
        folder = self.version_path(name, version) / "reports"
        folder.mkdir(exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = folder / f"{kind}-{stamp}-{uuid.uuid4().hex[:8]}.json"
        self._atomic_write(target, json.dumps({"kind": kind, "created": stamp, **data}, indent=1, default=str).encode())
        return target

    def report_files(self, name: str, version: int) -> dict[str, bytes]:
        """A version's report files by file name (for copying them to another repo)."""
        folder = self.version_path(name, version) / "reports"
        # read_regular: a report planted as a link is refused, never copied from outside the repo
        return {p.name: read_regular(p) for p in sorted(folder.glob("*.json"))} if folder.exists() else {}

    def put_report(self, name: str, version: int, filename: str, data: bytes) -> None:
        """Store a report file under its original name (push/pull)."""
        folder = self.version_path(name, version) / "reports"
        folder.mkdir(exist_ok=True)
        self._atomic_write(folder / validate_report_file(filename), data)

    def reports(self, ref: str, kind: str | None = None) -> list[dict[str, Any]]:
        name, version = self.resolve(ref)
        folder = self.version_path(name, version) / "reports"
        if not folder.exists():
            return []
        found = []
        for path in sorted(folder.glob("*.json")):
            if kind is None or path.name.startswith(kind + "-"):
                with contextlib.suppress(ValueError, OSError, CorruptCaptureError):  # a linked report is skipped
                    found.append({"path": str(path), **json.loads(read_regular(path))})
        return found


def _unquote_name(quoted: str) -> str:
    """The name of a ``names/`` folder. A valid name quotes to letters, digits, ``._-`` and ``%2F``
    (its slashes), so a plain replace does; ``unquote`` only for anything else."""
    plain = quoted.replace("%2F", "/")
    return plain if "%" not in plain else unquote(quoted)


def _fingerprint(data: memoryview) -> tuple[str, ChunkDigests | None]:
    """A payload's content hash, and its marker's chunk hashes when it gets a marker."""
    view = memoryview(data).cast("B") if memoryview(data).format != "B" else memoryview(data)
    return hash_bytes(view), chunk_digests(view) if len(view) >= MARK_MIN_BYTES else None


def _is_regular(path: Path) -> bool:
    """Whether ``path`` is a regular file (``lstat``: a link is not)."""
    try:
        return S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def writer_alive(staging_name: str) -> bool:
    """Whether the process that made ``tmp/<pid>-<uuid>...`` still runs on this machine."""
    pid, _, rest = staging_name.partition("-")
    if not pid.isdigit() or not rest:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, owned by another user
        return True
    return True
