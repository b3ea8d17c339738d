"""``Repo``: captures as names, immutable numbered versions, aliases and reports, over any store.

``Repo(location)`` opens the store registered for the location's scheme
(:func:`~modulelens.repo.registry.open_store`) and holds everything a repo means once, in terms of
the keys of :mod:`modulelens.repo.layout`:
saving (payloads hashed and written in a pipeline, small ones packed, then the version published
in one step), listing from per-name summaries (:mod:`modulelens.repo.index`), resolving refs,
aliases, removal with tombstones, reports, gc, fsck (:mod:`modulelens.repo.fsck`) and push/pull
(:mod:`modulelens.repo.transfer`). How a key is kept, locked, cached or verified is the store's
(:class:`~modulelens.repo.store.Store`); the repo never asks which store it has.
"""

from __future__ import annotations

import builtins
import contextlib
import itertools
import json
import operator
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import modulelens.repo.aliases as stored_aliases
import modulelens.repo.reports as stored_reports
from modulelens.errors import (
    CaptureNotFoundError,
    CorruptCaptureError,
    InvalidNameError,
    RemoteRepoError,
    RepoBusyError,
    RepoError,
)
from modulelens.repo.collector import collector_paused
from modulelens.repo.garbage import GcReport, collect, retire
from modulelens.repo.index import NameIndex, Summaries, damaged_entry, listing_stamp, version_entry
from modulelens.repo.layout import (
    LAYOUT_VERSION,
    MARKER,
    alias_key,
    capture_key,
    marker_json,
    name_key,
    notes_key,
    unquote_name,
    version_key,
)
from modulelens.repo.names import LATEST, Ref, parse_ref, validate_name
from modulelens.repo.note_edits import edit_notes, with_edited_tags
from modulelens.repo.notes import VersionNotes, checked_notes, edited, parse_notes, same_description
from modulelens.repo.packs import Payloads, referenced_blobs
from modulelens.repo.payload_writes import store_payloads
from modulelens.repo.publish import publish
from modulelens.repo.registry import open_store
from modulelens.repo.store import BlobWriter, Hold, WrittenPayload
from modulelens.repo.trust import KeptSealer, TrustPolicy, set_trust_source, trusts_source
from modulelens.repo.versions import NameListing, VersionInfo

if TYPE_CHECKING:

    from modulelens.repo.fsck import FsckReport
    from modulelens.repo.markers import ChunkDigests
    from modulelens.repo.transfer import TransferReport


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
                 storage_options: Mapping[str, object] | None = None, trust_source: bool = False) -> None:
        self.store = open_store(path, storage_options=storage_options)
        self._trust_source = trust_source  # this object's own: never stored (see trust_source)
        self._summaries = Summaries(self.store, self._read_entries, self._upgrade_layout)
        self._layout_problem: str | None = None
        self._sealer = KeptSealer(self._directory())  # what signs a save here
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

    def _directory(self) -> Path | None:
        """The repo's directory on this machine, ``None`` for a store that is not one (an object
        store): where a trust setting and this user's signatures can be bound (repo/trust.py)."""
        try:
            return Path(os.fspath(self.store))
        except TypeError:
            return None

    @property
    def signs_captures(self) -> bool:
        """Whether captures saved here are signed as this user's own (docs/security.md, "Your own
        captures"): a local directory yes, an object store no (its captures always need trust)."""
        return self._directory() is not None

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
        directory = self._directory()
        return self._trust_source or (directory is not None and trusts_source(directory))

    @trust_source.setter
    def trust_source(self, value: bool) -> None:
        directory = self._directory()
        if directory is None:
            if value:
                raise RemoteRepoError(f"{self.location} cannot be marked trusted for later loads (a shared store "
                                      "holds other people's captures); pass trust_source=True (--trust-source) to "
                                      "one load instead")
        else:
            set_trust_source(directory, bool(value))
        self._trust_source = self._trust_source and bool(value)

    def trust_policy(self, trust_source: bool | None = None) -> TrustPolicy:
        """What loading a capture from this repo may run (repo/trust.py, docs/security.md):
        ``trust_source`` when given, else this repo's setting (:attr:`trust_source`); the user's own
        signed captures count as theirs only in a local directory."""
        return TrustPolicy(stored_source=self.trust_source if trust_source is None else bool(trust_source),
                           own_repo=self._directory())

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

    def put_blob_file(self, digest: str, source: Path, *, verified: bool = False, missing: bool = False) -> int:
        """Store a payload from a local file (push, pull, an import), hashing every byte copied
        (never a link to another repo's file); returns the bytes written (0 if present). ``missing``:
        the caller just found it absent, so it is not looked for again; ``verified``: only for this
        process's own staging file (:meth:`Store.put_blob_file <modulelens.repo.store.Store.put_blob_file>`).

        Raises:
            CorruptCaptureError: ``source`` does not hash to ``digest`` (nothing is stored).
        """
        return self.store.put_blob_file(digest, source, verified=verified, missing=missing)

    def check_blob(self, digest: str, nbytes: int, *, full: bool = False, pack: bool = False) -> Path:
        """Local path of a payload after checking it (downloaded into the cache first for a remote
        repo): size always; the full hash for small payloads, for large ones changed since their
        last check, or always with ``full``; otherwise a sampled hash (:mod:`modulelens.repo.markers`).
        ``pack``: the blob is a pack, whose members are checked against their hashes too."""
        return self.store.blob_file(digest, nbytes, full=full, pack=pack)

    def blob_writer(self, nbytes: int) -> BlobWriter:
        """Streams a payload of ``nbytes`` bytes into this repo before its save (tracing/weights.py);
        :meth:`save_version` takes what it seals and moves it in unread (``Store.blob_writer``)."""
        return self.store.blob_writer(nbytes)

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

    # ---------------------------------------------------------------------------------- indexes

    def _head(self, name: str) -> NameIndex:
        """The name's index head (repo/index.py): latest, aliases; entries not loaded."""
        return self._summaries.head(name, name_key(name))

    def _listing(self, name: str, *, fill: bool = True, persist: bool = False) -> NameIndex:
        """The name's index with every entry (``fill``: read where missing; ``persist``: a writer
        stores an index it had to rebuild)."""
        return self._summaries.listing(name, name_key(name), fill=fill, persist=persist)

    def _name_summaries(self, *, persist: bool = False, fill: bool = True,
                        strict: bool = False) -> Iterator[tuple[str, str, NameIndex]]:
        """``(name, its folder key, index)`` of every name folder, in name order (what list and gc
        walk; ``persist``: gc, a writer, stores indexes it had to rebuild; ``strict``: a damaged
        name raises instead of being left out)."""
        found = ((unquote_name(quoted), quoted) for quoted in self.store.names())
        named = sorted((name, f"names/{quoted}") for name, quoted in found if name is not None)
        # A name whose folders are damaged is left out of a listing (its own commands name the
        # damage, fsck reports it); gc (``strict``) stops instead: that name might reference any blob.
        yield from self._summaries.listings(named, fill=fill, persist=persist, skip_damaged=not strict)

    def _read_entries(self, name: str, versions: Iterable[int]) -> dict[int, dict[str, Any] | None]:
        """Index entries of ``versions`` from their ``capture.json`` (read together; a damaged one
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
        """Rebuild ``name``'s index from its folders, ignoring the stored one (fsck --repair)."""
        self._summaries.rebuild(name, name_key(name))

    def summary_problem(self, name: str) -> str | None:
        """Why ``name``'s stored index head is not used (damaged or forged: readers rebuild the
        index from the folders, writers store the rebuilt one), for fsck; ``None`` when it is used."""
        return self._summaries.head_problem(name_key(name))

    def stored_summary(self, name: str) -> tuple[dict[str, dict[str, Any]], bool] | None:
        """The entries of ``name`` that readers take from the stored index without reading capture
        files (what gc trusts) and whether they must list every version, for fsck to check;
        ``None`` when nothing stored is trusted."""
        return self._summaries.stored_entries(name, name_key(name))

    # ---------------------------------------------------------------------------------- reading

    def names(self) -> list[str]:
        """Names with at least one version (one index head read per name)."""
        found = ((unquote_name(quoted), quoted) for quoted in self.store.names())
        named = sorted((name, f"names/{quoted}") for name, quoted in found if name is not None)
        return [name for name, _, head in self._summaries.heads(named, skip_damaged=True) if head.latest]

    def version_numbers(self, name: str) -> list[int]:
        return self._listing(name, fill=False).numbers()

    def aliases(self, name: str) -> dict[str, int]:
        return dict(self._head(name).aliases)

    def index_entries(self, name: str) -> dict[int, dict[str, Any]]:
        """What the name's index keeps of each version (created, tags, payload bytes, module class,
        calls, blobs, and for a version committed by a push its ``content`` id), by number."""
        index = self._listing(name)
        return {number: {k: v for k, v in entry.items() if k != "v"} for number, entry in sorted((index.versions or {}).items())}

    def resolve(self, ref: str | Ref) -> tuple[str, int]:
        """``"name"``, ``"name:v3"``, ``"name:alias"`` -> ``(name, 3)``, at a cost that does not grow
        with the versions of the name: an explicit version is one look for its ``capture.json``
        (none when the store has it cached: versions are immutable), an alias one read of its
        file, ``latest`` one read of the name's index head."""
        parsed = parse_ref(ref) if isinstance(ref, str) else ref
        name = parsed.name
        if parsed.version is not None:
            if self.store.exists(capture_key(name, parsed.version)) or self.store.is_folder(version_key(name, parsed.version)):
                return name, parsed.version  # (a folder without its capture file: loading says it is damaged)
            versions = self.version_numbers(name)
            if not versions:
                raise CaptureNotFoundError(f"no capture named {name!r} in {self.location}")
            raise CaptureNotFoundError(f"{name} has no version v{parsed.version} (versions: "
                                       + ", ".join(f"v{v}" for v in versions) + ")")
        if parsed.selector not in (None, LATEST):
            found = self._read_alias(name, parsed.selector)
            if found is not None:
                return name, found
        head = self._head(name)
        if parsed.selector in (None, LATEST):
            if not head.latest:
                raise CaptureNotFoundError(f"no capture named {name!r} in {self.location}")
            return name, head.latest
        if parsed.selector in head.aliases:
            return name, head.aliases[parsed.selector]
        if not head.latest:
            raise CaptureNotFoundError(f"no capture named {name!r} in {self.location}")
        raise CaptureNotFoundError(f"{name} has no alias {parsed.selector!r}")

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

    def _parse(self, data: bytes, key: str, *, calls: bool = True) -> dict[str, Any]:
        where = str(self.store.where(key))
        from modulelens.format.validated import validated_capture  # here: `ls` starts without the validator

        # Parsing and checking make a few objects per call and tensor and no cycle: with the collector
        # on, the 45 MiB capture.json of 50,000 calls took 1.8 s to parse, 0.46 s paused (bench_ui.py --huge).
        with collector_paused():
            try:
                metadata = json.loads(data)
            except (ValueError, RecursionError) as error:
                raise CorruptCaptureError(f"{where} is not valid JSON (truncated or damaged): {error}") from None
            validated_capture(metadata, data, where, calls=calls)
        return metadata

    def read_metadata(self, name: str, version: int, *, calls: bool = True) -> dict[str, Any]:
        """A version's capture metadata, checked against the format.

        Args:
            calls: check every recorded call; ``False`` leaves each call to be checked with
                :func:`~modulelens.format.validate.validate_call` when it is used (a page of a few).

        Raises:
            CaptureNotFoundError: there is no such version.
            CorruptCaptureError: its ``capture.json`` is missing, damaged or not a capture.
        """
        return self._parse(self._capture(name, version), capture_key(name, version), calls=calls)

    def read_capture(self, name: str, version: int, *, calls: bool = True) -> tuple[dict[str, Any], bytes]:
        """:meth:`read_metadata`, with the bytes of ``capture.json`` it was parsed from (what a
        provenance check verifies as they are: :func:`modulelens.repo.trust.own_capture`).

        Raises:
            CaptureNotFoundError: there is no such version.
            CorruptCaptureError: its ``capture.json`` is missing, damaged or not a capture.
        """
        text = self._capture(name, version)
        return self._parse(text, capture_key(name, version), calls=calls), text

    def version_path(self, name: str, version: int) -> Path:
        """The version's folder on this machine (for a remote repo, its cached copy in the mirror)."""
        if not self.store.is_folder(version_key(name, version)):  # a linked version folder is refused
            self._capture(name, version)  # raises for a missing version; a store without folders caches it
        return self.store.local_path(capture_key(name, version)).parent

    def info(self, name: str, version: int, *, metadata: dict[str, Any] | None = None) -> VersionInfo:
        """One version as a listing describes it (its capture file and the name's index head: no
        listing of the name).

        Args:
            metadata: the version's metadata, when the caller has read it (:meth:`read_metadata`):
                it is not read and checked again (`show` read and checked it twice).

        Example::

            metadata = repo.read_metadata("mlp", 3)
            print(repo.info("mlp", 3, metadata=metadata).ref)
        """
        entry = version_entry(metadata) if metadata is not None else self._read_entries(name, [version]).get(version)
        if entry is None:
            raise CaptureNotFoundError(f"{name}:v{version} does not exist in {self.location}")
        head = self._head(name)
        index = NameIndex(latest=head.latest, aliases=head.aliases, versions={version: entry})
        return self._with_notes(self._infos(name, index))[0]

    def _infos(self, name: str, index: NameIndex, *, prefix: str | None = None) -> list[VersionInfo]:
        """VersionInfos of every version in ``index`` (entries filled), in version order
        (``prefix``: the name's folder key, when the caller knows it)."""
        entries = index.versions or {}
        by_version: dict[int, tuple[str, ...]] = {}
        for alias, number in sorted(index.aliases.items()):
            by_version[number] = (*by_version.get(number, ()), alias)
        if index.latest:
            by_version[index.latest] = (LATEST, *by_version.get(index.latest, ()))
        # Where the version lives, as its repo is named: a path, or for a remote repo its URL
        # (never the local mirror that caches its capture.json).
        folder = f"{self.location.rstrip('/')}/{prefix or name_key(name)}/versions/"
        # The hot loop of a listing, one VersionInfo per version: the object made and its three
        # slots set here, with no call per version (VersionInfo's docstring).
        shared = NameListing(name, folder, by_version, numbered=True)
        new, infos = VersionInfo.__new__, builtins.list[VersionInfo]()
        add = infos.append
        numbers = builtins.list(entries)
        # a log holds its versions in order but for concurrent writers' (checked in one C pass)
        in_order = entries.items() if all(map(operator.lt, numbers, itertools.islice(numbers, 1, None))) else \
            sorted(entries.items())
        for number, entry in in_order:
            info = new(VersionInfo)
            info.version, info._entry, info._of = number, entry, shared
            add(info)
        return infos

    def listing_stamp(self) -> str:
        """A digest of what :meth:`list` reads besides the version entries: the names, each one's
        index head (its versions, aliases and writes in progress) and notes (edited tags). It changes
        whenever the listing may, so a reader that keeps a listing (the web UI) lists again only
        then: one small read per name, where a listing of 100,000 versions took 0.2-0.8 s.

        Example::

            stamp = repo.listing_stamp()
            infos = repo.list()  # a stamp read before the listing: a change meanwhile changes the next stamp
        """
        return listing_stamp(self.store)

    def list(self, name: str | None = None) -> list[VersionInfo]:
        with collector_paused():  # a few objects per version, no cycle (repo/collector.py)
            if name:
                return self._with_notes(self._infos(name, self._listing(name)))
            infos: builtins.list[VersionInfo] = []
            for name, prefix, index in self._name_summaries():
                infos += self._infos(name, index, prefix=prefix)
            return self._with_notes(infos)

    # ---------------------------------------------------------------------------------- saving

    def save_version(self, name: str, metadata: dict[str, Any],
                     payloads: dict[str, memoryview | WrittenPayload]) -> VersionInfo:
        """Store a capture: hash and write its payloads (``tensor id -> bytes``, or a
        :class:`~modulelens.repo.store.WrittenPayload` already in a file; blobs already present are
        skipped), fill the hashes into ``metadata["tensors"]``, then make the version visible in
        one step (a rename, or a conditional create)."""
        validate_name(name)
        self._require_layout()
        while True:
            with self.store.writing() as hold:
                store_payloads(self.store, metadata, payloads, self._upgrade_layout)
                if hold.intact():
                    return self._commit(name, metadata, seal=self._sealer())  # yours: signed
            # The hold lapsed (a lease left unrenewed by a stalled process or a slow server): a gc
            # may have run and removed a blob this save found present. Take a new hold and check
            # again (blobs already there are skipped).

    @contextlib.contextmanager
    def writing(self) -> Iterator[Hold]:
        """Hold off gc while blobs are copied in and then committed (push/pull): gc must not take
        a blob written here for garbage before the version that references it exists. Yields the
        hold: ``hold.intact()`` says whether blobs checked under it are still safe to commit."""
        with self.store.writing() as hold:
            yield hold

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
                        # a directory counts a blob that does not hash to its name as absent (LocalStore.has_blob)
                        raise CorruptCaptureError(f"payload {digest} is missing from {self.location}, or stored "
                                                  "there with bytes that do not hash to it")
                if hold.intact():  # else a gc may have run meanwhile: check again (see save_version)
                    return self._commit(name, metadata)

    def commit_versions(self, name: str, metadatas: builtins.list[dict[str, Any]],
                        contents: builtins.list[str | None] | None = None) -> builtins.list[VersionInfo]:
        """Make new versions of ``name`` at once (a push of many versions: one reservation and one
        index update for all of them, then one conditional create each). The caller holds
        :meth:`writing` and has checked, under it, that every payload they name is stored.

        Args:
            metadatas: the versions' metadata, in the order they get their numbers.
            contents: each one's content id (``transfer.content_id``), kept in the index so that a
                later push finds it there without reading manifests.
        """
        validate_name(name)
        self._require_layout()
        if not metadatas:
            return []
        return publish(self, name, metadatas, None, contents or [None] * len(metadatas))

    def _commit(self, name: str, metadata: dict[str, Any],
                seal: Callable[[builtins.list[str]], dict[str, Any]] | None = None) -> VersionInfo:
        """Publish one new version of ``name`` (:func:`~modulelens.repo.publish.publish`)."""
        return publish(self, name, [metadata], seal, [None])[0]

    def _upgrade_layout(self) -> None:
        """Mark an older repo with this layout before writing anything only it reads (packs, the
        index of layout 3: docs/repo-layout.md, "Layout versions"); refused while the marker is
        damaged (:attr:`layout_problem`)."""
        self._require_layout()
        if self._layout < LAYOUT_VERSION:
            self.store.write(MARKER, marker_json())
            self._layout = LAYOUT_VERSION

    # ---------------------------------------------------------------------------------- aliases

    def set_alias(self, ref: str, alias: str) -> VersionInfo:
        """Point ``alias`` at the version ``ref`` resolves to (aliases are movable), with
        compare-and-swap: if another writer moved the alias between our read and our write,
        nothing is written and this raises.

        Raises:
            RepoBusyError: the alias changed concurrently (run again to move it anyway).
            RemoteRepoError: a remote backend without conditional writes (move aliases locally and push).
        """
        return stored_aliases.set_alias(self, ref, alias)

    def remove_alias(self, name: str, alias: str) -> None:
        """Remove the alias ``name:alias``.

        Raises:
            CaptureNotFoundError: ``name`` has no such alias.
        """
        stored_aliases.remove_alias(self, name, alias)

    # ---------------------------------------------------------------------------------- notes

    def notes(self, ref: str) -> VersionNotes:
        """The description and edited tags of the version ``ref`` resolves to (empty when nobody
        wrote any; docs/repo-layout.md, "Notes").

        Raises:
            CorruptCaptureError: the name's notes file is damaged (``modulelens fsck`` names it).

        Example::

            repo.describe("ranker/top_mlp:v3", "golden run before the refactor")
            repo.notes("ranker/top_mlp:v3").description   # 'golden run before the refactor'
        """
        name, version = self.resolve(ref)
        return self.name_notes(name).get(version, VersionNotes())

    def name_notes(self, name: str) -> dict[int, VersionNotes]:
        """The notes of every version of ``name`` that has some, by version number.

        Raises:
            CorruptCaptureError: the name's notes file is damaged.
        """
        key = notes_key(name)
        return parse_notes(self.store.read(key), str(self.store.where(key)))

    def describe(self, ref: str, text: str, *, expected: str | None = None) -> VersionNotes:
        """Set the description of the version ``ref`` resolves to (``""`` removes it).

        Args:
            text: plain text, at most 10,000 characters.
            expected: the description the caller last saw; when it has changed since (another
                editor), nothing is written and this raises, so no one's words are lost unseen.

        Raises:
            RepoBusyError: ``expected`` is not the stored description, or other writers kept
                changing the notes meanwhile.
            UsageError: the text is too long or holds control characters.
        """
        def change(current: VersionNotes, captured: tuple[str, ...]) -> VersionNotes:
            if expected is not None and not same_description(expected, current.description):
                raise RepoBusyError(f"{ref}: its description was changed by someone else meanwhile; "
                                    "nothing was written (read it again)")
            return edited(current, captured, description=text)
        return edit_notes(self, ref, change)

    def tag(self, ref: str, *tags: str) -> VersionNotes:
        """Add tags to the version ``ref`` resolves to (listing, ``ls --tag`` and the UI show them).

        Raises:
            InvalidNameError: a tag that is not a letter or digit and up to 63 of ``A-Za-z0-9._:+=/@-``.

        Example::

            repo.tag("ranker/top_mlp:v3", "reviewed")
            "reviewed" in repo.info("ranker/top_mlp", 3).tags   # True
        """
        return edit_notes(self, ref, lambda current, captured: edited(current, captured, add=tags))

    def untag(self, ref: str, *tags: str) -> VersionNotes:
        """Take tags off the version ``ref`` resolves to (a tag it was captured with too)."""
        return edit_notes(self, ref, lambda current, captured: edited(current, captured, remove=tags))

    def set_notes(self, ref: str, notes: VersionNotes, *, keep_existing: bool = False) -> VersionNotes:
        """Replace the notes of the version ``ref`` resolves to as they are (who wrote them and when
        included): push and pull copy a version's notes this way.

        Args:
            keep_existing: leave notes the version has already (returned instead).
        """
        given = checked_notes(notes, f"the notes given for {ref}")
        return edit_notes(self, ref, lambda current, _: current if keep_existing and not current.empty else given)

    def _with_notes(self, infos: builtins.list[VersionInfo]) -> builtins.list[VersionInfo]:
        """``infos`` with the tags people edited after capture (:func:`~modulelens.repo.note_edits.with_edited_tags`)."""
        return with_edited_tags(self.store, infos)

    # ---------------------------------------------------------------------------------- removal

    def remove(self, ref: str) -> builtins.list[str]:
        """Remove one version (``name:v2`` / ``name:alias``) or, for a bare name, every version.
        Each is marked in the index first (readers stop showing it), its aliases go, then it leaves
        a tombstone, so its number is never reused (a ref someone noted down never silently means a
        different capture), and its folder goes. Payloads stay until :meth:`gc`."""
        parsed = parse_ref(ref)
        self._require_layout()
        if parsed.selector is None:
            targets = self.version_numbers(parsed.name)
            if not targets:
                raise CaptureNotFoundError(f"no capture named {parsed.name!r} in {self.location}")
        else:
            targets = [self.resolve(parsed)[1]]
        removed = retire(self, parsed.name, targets)
        if not removed:
            raise CaptureNotFoundError(f"{ref} was removed meanwhile by another process")
        return [f"{parsed.name}:v{version}" for version in removed]

    def gc(self, *, dry_run: bool = False, tmp_age_s: float = 3600.0, grace_s: float | None = None,
           wait_s: float = 600.0) -> GcReport:
        """Delete payloads no version references, and stale staging files.

        Args:
            dry_run: only report what would be removed.
            tmp_age_s: staging older than this, left by writers that are gone, is removed.
            grace_s: keep unreferenced blobs younger than this (default: the store's; none in a
                local repo, where gc excludes every save; an hour by server time in a remote one).
            wait_s: how long gc waits for saves in progress (and, in a local repo, for the repo's
                locks: a process holding one longer is named in the error).

        Raises:
            RepoBusyError: another gc runs (remote), or saves kept their leases (remote) or the
                repo's locks (local) longer than ``wait_s``.
        """
        return collect(self, dry_run=dry_run, tmp_age_s=tmp_age_s, grace_s=grace_s, wait_s=wait_s)


    def exclusive_lock(self, wait_s: float = 600.0) -> contextlib.AbstractContextManager[float]:
        """Hold the repo against every save (what gc and ``fsck --repair`` do while they work).

        Raises:
            RepoBusyError: saves (or a process holding the repo's locks) kept it longer than ``wait_s``.
        """
        return self.store.exclusive(wait_s)

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

    def add_report(self, ref: str, kind: str, data: Mapping[str, object]) -> Path | str:
        """Store a tool's report (profile, verify, ...) with the version it was made on; returns
        where it is (a path, or a URL)."""
        return stored_reports.add_report(self, ref, kind, data)

    def put_report(self, name: str, version: int, filename: str, data: bytes) -> None:
        """Store a report file under its original name (push/pull), once it is checked like a
        capture's metadata (:func:`~modulelens.format.reports.validate_report`).

        Raises:
            CorruptCaptureError: the report is not JSON or not a report (nothing is written).
        """
        stored_reports.put_report(self, name, version, filename, data)

    def report_files(self, name: str, version: int) -> dict[str, bytes]:
        """A version's report files by file name (for copying them to another repo); a report that
        cannot be read safely (a link) is left out, never copied from outside the repo."""
        return stored_reports.report_files(self, name, version)

    def reports(self, ref: str, kind: str | None = None, *,
                problems: builtins.list[str] | None = None) -> builtins.list[dict[str, object]]:
        """The reports stored with ``ref`` (of ``kind`` only, when given), each with its ``path``.

        A report that cannot be read or is not a report (:func:`~modulelens.format.reports.validate_report`)
        is left out; ``problems``, when given, gets one line per report left out, naming it and why.
        """
        return stored_reports.reports(self, ref, kind, problems=problems)
