"""``Repo``: captures as names, immutable numbered versions, aliases and reports, over any store.

``Repo(location)`` opens the store a location names (:func:`open_store`: a directory, or an fsspec
URL) and holds everything a repo means once, in terms of the keys of :mod:`modulelens.repo.layout`:
saving (payloads hashed and written in a pipeline, small ones packed, then the version published
in one step), listing from per-name summaries (:mod:`modulelens.repo.index`), resolving refs,
aliases, removal with tombstones, reports, gc, fsck (:mod:`modulelens.repo.fsck`) and push/pull
(:mod:`modulelens.repo.transfer`). How a key is kept, locked, cached or verified is the store's
(:class:`~modulelens.repo.store.Store`); the repo never asks which store it has.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modulelens.errors import (
    CaptureNotFoundError,
    CorruptCaptureError,
    InvalidNameError,
    RemoteRepoError,
    RepoBusyError,
    RepoError,
    UsageError,
)
from modulelens.format.hashing import hash_bytes
from modulelens.repo.index import Summaries, damaged_entry, version_entry
from modulelens.repo.layout import (
    CAPTURE_FILE,
    LAYOUT_VERSION,
    MARKER,
    REPORTS,
    alias_key,
    capture_json,
    capture_key,
    marker_json,
    name_key,
    reports_key,
    unquote_name,
    version_key,
)
from modulelens.repo.local import LocalStore
from modulelens.repo.location import default_repo_location, is_url
from modulelens.repo.markers import MARK_MIN_BYTES, chunk_digests
from modulelens.repo.names import LATEST, Ref, parse_ref, validate_alias, validate_name, validate_report_file
from modulelens.repo.packs import PACK_BELOW, Payloads, pack_payloads, referenced_blobs
from modulelens.repo.store import Store

if TYPE_CHECKING:
    from concurrent.futures import Future

    from modulelens.repo.fsck import FsckReport
    from modulelens.repo.markers import ChunkDigests
    from modulelens.repo.transfer import TransferReport


def open_store(location: str | os.PathLike[str] | None = None, *, storage_options: dict[str, Any] | None = None,
               trust_source: bool = False) -> Store:
    """The store a repo location names: an fsspec URL (``s3://``, ``memory://``, ``gs://``...) is a
    :class:`~modulelens.repo.remote.RemoteStore`; a path or ``file://`` URL a
    :class:`~modulelens.repo.local.LocalStore`. ``None``: ``$MODULELENS_REPO`` or the default.

    Raises:
        UsageError: ``storage_options`` for a local directory.
        MissingDependencyError: a URL whose fsspec backend is not installed.
    """
    text = default_repo_location() if location is None else os.fspath(location)
    if is_url(text):
        from modulelens.repo.remote import RemoteStore  # here: listing a local repo needs no fsspec

        return RemoteStore(text, storage_options=storage_options, trust_source=trust_source)
    if storage_options:
        raise UsageError(f"storage_options apply to repos at URLs, not to the directory {text}")
    text = text.removeprefix("file://")
    return LocalStore(Path(text).expanduser().absolute(), trust_source=trust_source)


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
    ``memory://x``, ``gs://...``), whose files a :class:`~modulelens.repo.store.Store` keeps.

    Args:
        path: a directory, a ``file://`` or other fsspec URL; ``None`` means ``$MODULELENS_REPO``
            or ``~/.cache/modulelens/repo``.
        create: create the repo when it does not exist (readers pass ``False``).
        storage_options: fsspec options (endpoint, credentials) for URLs that need them.
        trust_source: run the source stored with its captures by default, for loads through this
            object (docs/security.md); a local repo may also keep the setting (:attr:`trust_source`).

    Raises:
        CaptureNotFoundError: ``create=False`` and there is no repo there.
        RemoteRepoError: the server cannot be reached and the cache has nothing for it.

    Example::

        repo = modulelens.Repo("/data/captures")   # or Repo() for $MODULELENS_REPO / the default
        for info in repo.list():
            print(info.ref, info.module_class)
        team = modulelens.Repo("s3://team-bucket/captures")   # downloads into the cache once per blob
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, create: bool = True,
                 storage_options: dict[str, Any] | None = None, trust_source: bool = False) -> None:
        self.store = open_store(path, storage_options=storage_options, trust_source=trust_source)
        self._summaries = Summaries(self.store, self._read_entries)
        self._layout_problem: str | None = None
        try:
            marker = self.store.open(MARKER, marker_json(), create=create)
            self._layout = LAYOUT_VERSION if marker is None else self._layout_of(marker)
        except CorruptCaptureError as error:  # one damaged file: the repo is still read (see layout_problem)
            self._layout, self._layout_problem = LAYOUT_VERSION, str(error)

    def _layout_of(self, marker: bytes) -> int:
        try:
            data = json.loads(marker)
            layout = data["layout_version"] if isinstance(data, dict) else None
            if not isinstance(layout, int) or isinstance(layout, bool):
                raise TypeError(f"layout_version is {str(layout)[:40]!r}")
        except (ValueError, KeyError, TypeError, RecursionError) as error:
            raise CorruptCaptureError(f"{self.store.where(MARKER)}: unreadable repo marker ({str(error)[:200]})") from None
        if layout > LAYOUT_VERSION:
            raise RepoError(f"repo {self.location} has layout {layout}; this modulelens reads up to {LAYOUT_VERSION}")
        return layout

    def __repr__(self) -> str:
        return f"Repo({self.location!r})"

    def __fspath__(self) -> str:
        return os.fspath(self.store)

    @property
    def location(self) -> str:
        """What to pass to ``Repo()`` (or ``--repo``) to open this repo again: a path or a URL."""
        return self.store.location

    @property
    def layout_problem(self) -> str | None:
        """Why the repo's layout marker (``modulelens-repo.json``) cannot be read, or ``None``. Such
        a repo is still read, as the newest layout this modulelens knows; writing to it is refused
        (its layout is unknown) until ``modulelens fsck --repair`` writes the marker again."""
        return self._layout_problem

    def rewrite_layout_marker(self) -> None:
        """Write the layout marker afresh (``fsck --repair``, after moving the damaged one aside)."""
        self.store.write(MARKER, marker_json())
        self._layout, self._layout_problem = LAYOUT_VERSION, None

    def _require_layout(self) -> None:
        """Refuse to write into a repo whose layout marker is damaged (see :attr:`layout_problem`)."""
        if self._layout_problem is not None:
            raise CorruptCaptureError(f"{self._layout_problem}; nothing is written to this repo until "
                                      "`modulelens fsck --repair` writes it again")

    @property
    def root(self) -> Path:
        """The local folder of this repo's files: the repo's directory, or for a remote repo its
        mirror in the cache (where cached ``capture.json`` files are)."""
        return self.store.root

    @property
    def signs_captures(self) -> bool:
        """Whether captures saved here are signed as this user's own (docs/security.md, "Your own
        captures"): a local directory yes, an object store no (its captures always need trust)."""
        return self.store.signs_captures

    @property
    def is_remote(self) -> bool:
        """Whether the repo is reached over a network (captures for it are staged locally first)."""
        return self.store.is_remote

    @property
    def trust_source(self) -> bool:
        """Whether loading this repo's captures runs their stored source by default.

        Off unless you set it on your own local repo (``repo.trust_source = True`` or
        ``modulelens trust --repo DIR``, bound to that directory and user, so a copied or
        downloaded repo never arrives trusted) or opened it with ``trust_source=True``; a remote
        repo is never marked trusted for later loads (docs/security.md)."""
        return self.store.trust_source

    @trust_source.setter
    def trust_source(self, value: bool) -> None:
        self.store.trust_source = value

    # ---------------------------------------------------------------------------------- blobs

    def blob_path(self, digest: str) -> Path:
        """Where the payload ``digest`` is (or will be) on this machine."""
        return self.store.blob_path(digest)

    def has_blob(self, digest: str) -> bool:
        """Whether the payload is stored (in a local repo: stored and verified, see :meth:`Store.has_blob
        <modulelens.repo.store.Store.has_blob>`)."""
        return self.store.has_blob(digest)

    def write_blob(self, digest: str, data: memoryview | bytes | bytearray, *, chunks: ChunkDigests | None = None) -> bool:
        """Store a payload under its hash, durably; returns False when it was already there (dedup)."""
        return self.store.write_blob(digest, data, chunks=chunks)

    def put_blob_file(self, digest: str, source: Path) -> int:
        """Store a payload from a local file (push/pull), hashing every byte copied; returns the
        bytes written (0 if present).

        Raises:
            CorruptCaptureError: ``source`` does not hash to ``digest`` (nothing is stored).
        """
        return self.store.put_blob_file(digest, source)

    def check_blob(self, digest: str, nbytes: int, *, full: bool = False, pack: bool = False) -> Path:
        """Local path of a payload after checking it (downloaded into the cache first for a remote
        repo): size always; the full hash for small payloads, for large ones changed since their
        last check, or always with ``full``; otherwise a sampled hash (:mod:`modulelens.repo.markers`).
        ``pack``: the blob is a pack, whose members are checked against their hashes too."""
        return self.store.blob_file(digest, nbytes, full=full, pack=pack)

    def download(self, blobs: dict[str, int], *, label: str = "") -> int:
        """Make ``{digest: nbytes}`` available locally; returns bytes downloaded (0 for a local repo)."""
        return self.store.fetch_blobs(lambda: blobs, label=label)

    def fetch_version(self, name: str, version: int) -> None:
        """Make every payload of a version available locally (a remote repo downloads what its
        cache lacks, in parallel, with a progress bar on a terminal)."""
        self.store.fetch_blobs(lambda: referenced_blobs(self.read_metadata(name, version)), label=f"{name}:v{version}")

    def payloads(self, metadata: dict[str, Any]) -> Payloads:
        """Reader of one capture's payloads, loose or packed (see :mod:`modulelens.repo.packs`).

        Example::

            payloads = repo.payloads(meta)
            weight = payloads.open_tensor(meta["tensors"]["t0"], torch.float32)
        """
        return Payloads(self.store, metadata)

    # ---------------------------------------------------------------------------------- summaries

    def _summary(self, name: str, *, fresh: dict[int, dict[str, Any]] | None = None, persist: bool = False,
                 complete: bool = False) -> dict[str, Any]:
        """The name's summary (repo/index.py), kept in memory while its folders do not change;
        stored only with ``persist`` (by operations that write)."""
        return self._summaries.get(name, name_key(name), fresh=fresh, persist=persist, complete=complete)

    def _name_summaries(self, *, persist: bool = False,
                        complete: bool = False) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """``(name, its folder key, summary)`` of every name folder, in name order (what list, names
        and gc walk; ``persist``: gc, a writer, stores summaries it had to rebuild)."""
        found = ((unquote_name(quoted), quoted) for quoted in self.store.names())
        for name, quoted in sorted((name, quoted) for name, quoted in found if name is not None):
            prefix = f"names/{quoted}"
            try:
                summary = self._summaries.get(name, prefix, persist=persist, keep=False, complete=complete)
            except CorruptCaptureError:
                if persist:
                    raise  # gc: a name it cannot read might reference any blob
                continue  # a listing goes on without it; its own commands name the damage, fsck reports it
            yield name, prefix, summary

    def _read_entries(self, name: str, versions: Iterable[int]) -> dict[int, dict[str, Any] | None]:
        """Summary entries of ``versions`` from their ``capture.json`` (read together; a damaged one
        still lists, with its problem; ``None`` for one removed meanwhile)."""
        keys = {version: capture_key(name, version) for version in versions}
        found = self.store.read_many(list(keys.values()), immutable=True)
        entries: dict[int, dict[str, Any] | None] = {}
        for version, key in keys.items():
            raw = found.get(key)
            try:
                entries[version] = version_entry(self._parse(raw if raw is not None else self._capture(name, version), key))
            except CaptureNotFoundError:
                entries[version] = None  # removed meanwhile
            except CorruptCaptureError as error:  # one damaged version never hides the others
                entries[version] = damaged_entry(raw or b"", str(error))
        return entries

    def rebuild_summary(self, name: str) -> None:
        """Rebuild ``name``'s summary from its folders, ignoring the stored one (fsck --repair)."""
        self._summaries.forget(name)
        self._summaries.get(name, name_key(name), rebuild=True, persist=True)

    # ---------------------------------------------------------------------------------- reading

    def names(self) -> list[str]:
        return [name for name, _, summary in self._name_summaries() if summary["versions"]]

    def version_numbers(self, name: str) -> list[int]:
        return [int(v) for v in self._summary(name)["versions"]]

    def aliases(self, name: str) -> dict[str, int]:
        return dict(self._summary(name)["aliases"])

    def resolve(self, ref: str | Ref) -> tuple[str, int]:
        """``"name"``, ``"name:v3"``, ``"name:alias"`` -> ``(name, 3)``. An explicit version whose
        ``capture.json`` the store has cached needs no request (versions are immutable), an alias
        one read, and ``latest`` a listing (it may have changed)."""
        parsed = parse_ref(ref) if isinstance(ref, str) else ref
        if parsed.version is not None and self.store.cached(capture_key(parsed.name, parsed.version)):
            return parsed.name, parsed.version
        if parsed.version is None and parsed.selector not in (None, LATEST):
            found = self._read_alias(parsed.name, parsed.selector)
            if found is not None:
                return parsed.name, found
        versions = self.version_numbers(parsed.name)
        if not versions:
            raise CaptureNotFoundError(f"no capture named {parsed.name!r} in {self.location}")
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

    def _read_alias(self, name: str, alias: str) -> int | None:
        """An alias from its own file, without listing the name; ``None`` when that cannot say (no
        such alias, unreadable, offline without a copy), and the caller falls back to the listing,
        which also gives the error. ``rm`` removes the aliases of a version it removes, so an alias
        names a visible version (except while such an ``rm`` runs)."""
        try:
            data = self.store.read(alias_key(name, alias))
            return int(data.decode().strip()) if data is not None else None
        except (ValueError, InvalidNameError, CaptureNotFoundError, CorruptCaptureError, RemoteRepoError):
            return None

    def _capture(self, name: str, version: int) -> bytes:
        """The bytes of a version's ``capture.json``.

        Raises:
            CaptureNotFoundError: there is no such version.
            CorruptCaptureError: its folder is there without it, or it is a link.
        """
        key = capture_key(name, version)
        data = self.store.read(key, immutable=True)
        if data is None:
            if self.store.is_folder(version_key(name, version)):
                raise CorruptCaptureError(f"{self.store.where(key)} is missing")
            raise CaptureNotFoundError(f"{name}:v{version} does not exist in {self.location}")
        return data

    def _parse(self, data: bytes, key: str) -> dict[str, Any]:
        where = str(self.store.where(key))
        try:
            metadata = json.loads(data)
        except (ValueError, RecursionError) as error:
            raise CorruptCaptureError(f"{where} is not valid JSON (truncated or damaged): {error}") from None
        from modulelens.format.validate import validate_capture  # here: `ls` starts without the validator

        validate_capture(metadata, where)
        return metadata

    def read_metadata(self, name: str, version: int) -> dict[str, Any]:
        """A version's capture metadata, checked against the format.

        Raises:
            CaptureNotFoundError: there is no such version.
            CorruptCaptureError: its ``capture.json`` is missing, damaged or not a capture.
        """
        return self._parse(self._capture(name, version), capture_key(name, version))

    def version_path(self, name: str, version: int) -> Path:
        """The version's folder on this machine (for a remote repo, its cached copy in the mirror)."""
        if not self.store.is_folder(version_key(name, version)):  # a linked version folder is refused
            self._capture(name, version)  # raises for a missing version; a store without folders caches it
        return self.store.local_path(capture_key(name, version)).parent

    def info(self, name: str, version: int) -> VersionInfo:
        summary = self._summary(name)
        self._summaries.fill(name, summary, [version])
        if str(version) not in summary["versions"]:
            raise CaptureNotFoundError(f"{name}:v{version} does not exist in {self.location}")
        return self._infos(name, summary, [version])[0]

    def _infos(self, name: str, summary: dict[str, Any], versions: list[int] | None = None, *,
               prefix: str | None = None) -> list[VersionInfo]:
        """VersionInfos of ``versions`` (default: all) of ``name``, from its (filled) summary
        (``prefix``: its folder key, when the caller knows it)."""
        entries = summary["versions"]
        by_version: dict[int, tuple[str, ...]] = {}
        for alias, number in sorted(summary["aliases"].items()):
            by_version[number] = (*by_version.get(number, ()), alias)
        latest = next(reversed(entries), None)
        if latest is not None:
            by_version[int(latest)] = (LATEST, *by_version.get(int(latest), ()))
        # Where the version lives, as its repo is named: a path, or for a remote repo its URL
        # (never the local mirror that caches its capture.json).
        folder = f"{self.location.rstrip('/')}/{prefix or name_key(name)}/versions/"
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
            return self._infos(name, self._summary(name, complete=True))
        return [info for name, prefix, summary in self._name_summaries(complete=True)
                for info in self._infos(name, summary, prefix=prefix)]

    # ---------------------------------------------------------------------------------- saving

    def save_version(self, name: str, metadata: dict[str, Any], payloads: dict[str, memoryview]) -> VersionInfo:
        """Store a capture: hash and write its payloads (``tensor id -> bytes``; blobs already
        present are skipped), fill the hashes into ``metadata["tensors"]``, then make the version
        visible in one step (a rename, or a conditional create)."""
        validate_name(name)
        self._require_layout()
        while True:
            with self.store.writing() as hold:
                self._store_payloads(metadata, payloads)
                if hold.intact():
                    return self._commit(name, metadata, seal=self.store.sealer())  # yours: signed (repo/trust.py)
            # The hold lapsed (a lease left unrenewed by a stalled process or a slow server): a gc
            # may have run and removed a blob this save found present. Take a new hold and check
            # again (blobs already there are skipped).

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold off gc while blobs are copied in and then committed (push/pull): gc must not take
        a blob written here for garbage before the version that references it exists."""
        with self.store.writing():
            yield

    def commit_version(self, name: str, metadata: dict[str, Any]) -> VersionInfo:
        """Make a new version of ``name`` whose payloads are all already stored (push/pull).

        Raises:
            CorruptCaptureError: a payload the metadata names is not in this repo.
        """
        validate_name(name)
        self._require_layout()
        while True:
            with self.store.writing() as hold:
                for digest in referenced_blobs(metadata):
                    if not self.store.has_blob(digest):
                        raise CorruptCaptureError(f"payload {digest} is missing from {self.location}")
                if metadata.get("packs"):
                    self._upgrade_layout()
                if hold.intact():  # else a gc may have run meanwhile: check again (see save_version)
                    return self._commit(name, metadata)

    def _commit(self, name: str, metadata: dict[str, Any],
                seal: Callable[[list[str]], dict[str, Any]] | None = None) -> VersionInfo:
        """Publish ``versions/<N>`` with ``N`` one past the highest number ever used; of writers
        racing for ``N`` one gets it, the others try the next free number."""
        prefix = name_key(name)
        version = self.store.scan(prefix, aliases=False).used + 1
        for _attempt in range(10_000):
            metadata["version"] = version
            metadata["name"] = name
            if self.store.publish(version_key(name, version), {CAPTURE_FILE: capture_json(metadata, seal)},
                                  folders=(REPORTS,)):
                break
            version = max(version + 1, self.store.scan(prefix, aliases=False).used + 1)
        else:
            raise RepoError(f"could not allocate a version for {name!r} in {self.location} after 10000 attempts")
        entry = version_entry(metadata)
        summary = self._summary(name, fresh={version: entry}, persist=True)
        if str(version) not in summary["versions"]:  # removed by a concurrent rm meanwhile: still saved
            summary = {"versions": {str(version): entry}, "aliases": {}}
        return self._infos(name, summary, [version])[0]

    def _upgrade_layout(self) -> None:
        """Mark a layout-1 repo as layout 2 before writing anything only layout 2 can read."""
        if self._layout < LAYOUT_VERSION:
            self.store.write(MARKER, marker_json())
            self._layout = LAYOUT_VERSION

    def _store_payloads(self, metadata: dict[str, Any], payloads: dict[str, memoryview]) -> None:
        """Hash and store every payload: small ones into packs, large ones as their own blobs."""
        views = {tid: memoryview(data).cast("B") if memoryview(data).format != "B" else memoryview(data)
                 for tid, data in payloads.items()}
        small = {tid: data for tid, data in views.items() if len(data) < PACK_BELOW}
        self._write_payloads(metadata["tensors"], {t: d for t, d in views.items() if t not in small})
        if small:
            self._upgrade_layout()
            for digest, pack in pack_payloads(metadata, small):
                self.store.write_blob(digest, pack)

    def _write_payloads(self, entries: dict[str, dict[str, Any]], payloads: dict[str, memoryview]) -> None:
        # A pipeline of three threads: the hashing thread hashes payload k+1 (blake3 itself uses
        # every core for large payloads) while this thread stages payload k and the publishing
        # thread waits for the disk (or the network) to take payload k-1. All three release the
        # GIL, so a save costs about the slowest of hashing, writing and flushing rather than their
        # sum (benchmarks/bench_save_load.py).
        from concurrent.futures import ThreadPoolExecutor  # here: listing a repo does not need threads

        store = self.store
        items = list(payloads.items())
        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="modulelens-hash") as hasher, \
                    ThreadPoolExecutor(max_workers=1, thread_name_prefix="modulelens-flush") as flusher:
                fingerprints = [hasher.submit(_fingerprint, data) for _, data in items]
                published: dict[str, Future[None]] = {}
                for (tid, data), fingerprint in zip(items, fingerprints, strict=True):
                    digest, chunks = fingerprint.result()
                    entries[tid]["payload"] = digest
                    if digest not in published and not store.has_blob(digest):
                        published[digest] = flusher.submit(store.publish_blob, store.stage_blob(data), digest, chunks,
                                                           flush=False)
                for future in published.values():
                    future.result()
        except RuntimeError as error:
            # A save from an atexit handler (`modulelens run` saving what a job recorded before it
            # ended) runs after concurrent.futures has shut down: "cannot schedule new futures
            # after interpreter shutdown". Do each step in this thread instead.
            if "interpreter shutdown" not in str(error):
                raise
            for tid, data in items:
                entries[tid]["payload"], chunks = _fingerprint(data)
                store.write_blob(entries[tid]["payload"], data, chunks=chunks)
            return
        store.flush_blobs(published)

    # ---------------------------------------------------------------------------------- aliases

    def set_alias(self, ref: str, alias: str) -> VersionInfo:
        """Point ``alias`` at the version ``ref`` resolves to (aliases are movable), with
        compare-and-swap: if another writer moved the alias between our read and our write,
        nothing is written and this raises.

        Raises:
            RepoBusyError: the alias changed concurrently (run again to move it anyway).
            RemoteRepoError: a remote backend without conditional writes (move aliases locally and push).
        """
        validate_alias(alias)
        self._require_layout()
        if alias == LATEST:
            raise InvalidNameError("'latest' is maintained automatically and cannot be set")
        name, version = self.resolve(ref)
        key = alias_key(name, alias)
        _, tag = self.store.read_tagged(key)
        if not self.store.swap(key, str(version).encode(), tag):
            raise RepoBusyError(f"alias {name}:{alias} was moved by another writer meanwhile; nothing changed")
        self._summary(name, persist=True)  # the folder changed, so the summary is brought up to date
        return self.info(name, version)

    def remove_alias(self, name: str, alias: str) -> None:
        self._require_layout()
        if not self.store.remove(alias_key(name, alias)):  # never there, or removed meanwhile by a concurrent rm
            raise CaptureNotFoundError(f"{name} has no alias {alias!r}")
        self._summary(name, persist=True)

    # ---------------------------------------------------------------------------------- removal

    def remove(self, ref: str) -> builtins.list[str]:
        """Remove one version (``name:v2`` / ``name:alias``) or, for a bare name, every version.
        Each leaves a tombstone first, so its number is never reused (a ref someone noted down
        never silently means a different capture); then its aliases go. Payloads stay until :meth:`gc`."""
        parsed = parse_ref(ref)
        self._require_layout()
        if parsed.selector is None:
            targets = self.version_numbers(parsed.name)
            if not targets:
                raise CaptureNotFoundError(f"no capture named {parsed.name!r} in {self.location}")
        else:
            targets = [self.resolve(parsed)[1]]
        removed = [f"{parsed.name}:v{version}" for version in targets
                   if self.store.retire(version_key(parsed.name, version))]
        for alias, version in self._summary(parsed.name, persist=True)["aliases"].items():
            if version in targets:
                with contextlib.suppress(CaptureNotFoundError):  # a concurrent rm removed it first
                    self.remove_alias(parsed.name, alias)
        if not removed:
            raise CaptureNotFoundError(f"{ref} was removed meanwhile by another process")
        return removed

    def gc(self, *, dry_run: bool = False, tmp_age_s: float = 3600.0, grace_s: float | None = None,
           wait_s: float = 600.0) -> GcReport:
        """Delete payloads no version references, and stale staging files.

        Args:
            dry_run: only report what would be removed.
            tmp_age_s: staging older than this, left by writers that are gone, is removed.
            grace_s: keep unreferenced blobs younger than this (default: the store's; none in a
                local repo, where gc excludes every save; an hour by server time in a remote one).
            wait_s: how long a remote gc waits for saves in progress.

        Raises:
            RepoBusyError: (remote) another gc runs, or saves kept their leases longer than ``wait_s``.
        """
        grace = self.store.gc_grace_s if grace_s is None else grace_s
        if not dry_run:
            self._require_layout()  # (an unknown layout might reference blobs in ways this one cannot see)
        report = GcReport(dry_run=dry_run)
        with self.store.exclusive(wait_s) as started:
            referenced: set[str] = set()
            for _name, _prefix, summary in self._name_summaries(persist=True, complete=True):
                for entry in summary["versions"].values():
                    referenced.update(digest.partition(":")[2] for digest in entry["blobs"])
            doomed = []
            for hexdigest, blob in self.store.blobs().items():
                if hexdigest in referenced or (grace > 0 and blob.mtime > started - grace):
                    report.kept_blobs += 1
                    continue
                doomed.append(blob.key)
                report.removed_blobs += 1
                report.freed_bytes += blob.size
                report.removed.append(hexdigest)
            if not dry_run:
                self.store.remove_blobs(doomed)
            report.removed_tmp = self.store.clean_staging(time.time() - tmp_age_s, dry_run=dry_run)
        return report

    def exclusive_lock(self) -> contextlib.AbstractContextManager[float]:
        """Hold the repo against every save (what gc and ``fsck --repair`` do while they work)."""
        return self.store.exclusive()

    def fsck(self, *, repair: bool = False) -> FsckReport:
        """Check every version's metadata and payloads, aliases, summaries and the layout; with
        ``repair`` (a local repo), move what is broken into ``quarantine/`` (docs/repo-layout.md, "fsck").

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

    # ---------------------------------------------------------------------------------- transfer

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

    # ---------------------------------------------------------------------------------- reports

    def add_report(self, ref: str, kind: str, data: dict[str, Any]) -> Path | str:
        """Store a tool's report (profile, verify, ...) with the version it was made on; returns
        where it is (a path, or a URL)."""
        name, version = self.resolve(ref)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        key = f"{reports_key(name, version)}/{kind}-{stamp}-{uuid.uuid4().hex[:8]}.json"
        self._write_report(name, version, key,
                           json.dumps({"kind": kind, "created": stamp, **data}, indent=1, default=str).encode())
        return self.store.where(key)

    def put_report(self, name: str, version: int, filename: str, data: bytes) -> None:
        """Store a report file under its original name (push/pull)."""
        self._write_report(name, version, f"{reports_key(name, version)}/{validate_report_file(filename)}", data)

    def _write_report(self, name: str, version: int, key: str, data: bytes) -> None:
        self._require_layout()
        try:
            self.store.write(key, data)
        except FileNotFoundError:  # the version's folder is gone (removed meanwhile)
            raise CaptureNotFoundError(f"{name}:v{version} does not exist in {self.location}") from None

    def report_files(self, name: str, version: int) -> dict[str, bytes]:
        """A version's report files by file name (for copying them to another repo); a report that
        cannot be read safely (a link) is left out, never copied from outside the repo."""
        folder = reports_key(name, version)
        try:
            files = self.store.files(folder)
        except CorruptCaptureError:
            return {}  # reports/ is a link or not a folder: never copied from outside the repo (fsck reports it)
        found = self.store.read_many([f"{folder}/{f}" for f in files if f.endswith(".json")])
        return {key.rsplit("/", 1)[1]: data for key, data in sorted(found.items())}

    def reports(self, ref: str, kind: str | None = None) -> builtins.list[dict[str, Any]]:
        name, version = self.resolve(ref)
        folder = reports_key(name, version)
        try:
            files = self.store.files(folder)
        except CorruptCaptureError:
            return []  # reports/ is a link or not a folder: skipped like an unreadable report (fsck reports it)
        keys = [f"{folder}/{f}" for f in files if f.endswith(".json") and (kind is None or f.startswith(kind + "-"))]
        found = self.store.read_many(keys)
        reports = []
        for key in keys:
            if key in found:
                with contextlib.suppress(ValueError, TypeError, RecursionError):  # an unreadable report is skipped
                    reports.append({"path": str(self.store.where(key)), **json.loads(found[key])})
        return reports


def _fingerprint(data: memoryview) -> tuple[str, ChunkDigests | None]:
    """A payload's content hash, and its marker's chunk hashes when it gets a marker."""
    view = memoryview(data).cast("B") if memoryview(data).format != "B" else memoryview(data)
    return hash_bytes(view), chunk_digests(view) if len(view) >= MARK_MIN_BYTES else None
