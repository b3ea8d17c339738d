"""The one interface between :class:`~modulelens.repo.repository.Repo` and where its files live.

``Repo`` holds what a repo *means* (names, versions, aliases, summaries, reports, save, gc, fsck,
push/pull) once, in terms of keys (:mod:`modulelens.repo.layout`); a ``Store`` holds how those keys
are kept, like httpx's ``BaseTransport`` under ``Client`` or fsspec's ``AbstractFileSystem``.
Two implement it:

* :class:`~modulelens.repo.local.LocalStore`: a directory. Files are published by rename, made
  durable with fsync, never opened through a symbolic link; locks are ``flock``; large blobs carry
  verification markers; summaries are trusted by two ``stat`` calls; fsck can quarantine.
* :class:`~modulelens.repo.remote.RemoteStore`: every operation written once over an object
  backend (:mod:`modulelens.repo.backend`: ``s3://``, ``memory://``, ``sqlite://``, any fsspec
  URL). No rename and no lock: a version appears with a conditional create, an alias moves with
  compare-and-swap, writers hold leases; reads go through a local cache and mirror, which also
  answer offline.

Every operation below is one the repo needs; where a store cannot do one (a compare-and-swap on a
backend without conditional writes, quarantine in a bucket) it raises a :class:`ModulelensError`
that says so. The repo never asks which store it has: a capability is a method or attribute here.
The abstract ones are what a store must implement; the others are written here once over them
(a store of keys, without folders, staging or links, needs none of them) and overridden where a
store does better (a directory hashes its blobs in ``verify_blobs``; an object store deletes many
blobs in one request).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from modulelens.errors import CorruptCaptureError, UsageError

if TYPE_CHECKING:
    from modulelens.repo.markers import ChunkDigests

#: A version folder's identity, or ``None`` where a version can never be replaced under its number.
Identity = list[int] | None


class Scan(NamedTuple):
    """One name's folder as it is now: visible versions (number -> identity), the highest number
    ever used (removed versions included: numbers are never reused), and the aliases."""

    versions: dict[int, Identity]
    used: int
    aliases: dict[str, int]


class BlobStat(NamedTuple):
    """A stored blob as a listing sees it: its key, size in bytes and modification time (seconds
    since the epoch, by the clock of whoever stamps the store's files)."""

    key: str
    size: int
    mtime: float


class Staged(NamedTuple):
    """A payload on its way into a store (:meth:`Store.stage_blob`): its staging file, if any."""

    path: Path | None
    view: memoryview


@dataclass
class WrittenPayload:
    """A payload its writer already put in a file and hashed (a captured weight streamed from the
    live tensor: tracing/weights.py), so a save moves the file in instead of writing and hashing
    the bytes again (``Repo.save_version`` takes it in place of the bytes).

    Attributes:
        path: where the bytes are now (a staging file; after a save, the blob it became).
        digest: their content hash (``blake3:<hex>``).
        nbytes: their size.
        chunks: the verification marker's chunk hashes, computed with the hash.
        staged: ``path`` is still the writer's own staging file, hashed as this process wrote it
            (only then may a store that copies it skip hashing it again); once saved it is a
            repo's blob, and a save into another repo hashes every byte it copies.
    """

    path: Path
    digest: str
    nbytes: int
    chunks: ChunkDigests | None = None
    staged: bool = True


class BlobWriter(ABC):
    """A payload streamed into a store in pieces (:meth:`Store.blob_writer`): each piece is written
    and hashed as it comes (the content hash and the verification marker's chunk hashes);
    :meth:`seal` makes the bytes durable and gives the :class:`WrittenPayload` that a save publishes
    as the blob (``Repo.save_version`` takes it in place of the bytes: moved in with a rename, or
    uploaded, never hashed again); :meth:`abort` removes what was written. One thread writes;
    :meth:`seal` may run on another once the last piece is written.

    Attributes:
        nbytes: the payload's size, announced when the writer was made.
        written: bytes written so far.
        chunk: the size of the pieces a writer hashes without copying (write whole multiples of it).

    Example::

        writer = repo.blob_writer(len(data))
        for start in range(0, len(data), writer.chunk):
            writer.write(data[start:start + writer.chunk])
        payload = writer.seal()    # durable; payload.digest names the blob
    """

    nbytes: int
    written: int

    @property
    @abstractmethod
    def chunk(self) -> int:
        """Pieces that are whole multiples of this many bytes are hashed where they are."""

    @abstractmethod
    def write(self, data: memoryview, *, beside: bool = True) -> None:
        """Append ``data`` and hash it. ``beside``: the writer may hash on a second thread while it
        writes (faster, one more core busy); ``False`` keeps the work on the calling thread, for a
        caller whose job needs the other cores meanwhile.

        Raises:
            OSError: the write failed (a full disk): :meth:`abort`, then copy the bytes instead.
            ValueError: more bytes than announced, or the writer is sealed.
        """

    @abstractmethod
    def seal(self) -> WrittenPayload:
        """Flush what was written to the disk (as a save does) and return it as a payload to save.

        Raises:
            OSError: the flush failed (the file is removed).
            ValueError: fewer bytes were written than announced (the file is removed).
        """

    @abstractmethod
    def abort(self) -> None:
        """Remove what was written (nothing is published); safe to call more than once."""


class Finding(NamedTuple):
    """An entry that is not part of the repo's layout (``foreign``) or a link (``symlink``)."""

    kind: str
    key: str
    detail: str


@dataclass
class Audit:
    """What :meth:`Store.audit` found beside the repo's own entries."""

    findings: list[Finding] = field(default_factory=list)
    stale_staging: int = 0  # staging left by writers that are gone (garbage for gc, not damage)


@dataclass
class BlobCheck:
    """What :meth:`Store.verify_blobs` found: ``damaged`` maps a digest to why ("missing" when
    absent), and how many blobs and bytes passed its checks; ``note`` says how deep it looked."""

    damaged: dict[str, str] = field(default_factory=dict)
    checked: int = 0
    bytes: int = 0
    note: str | None = None


class Hold(ABC):
    """What :meth:`Store.writing` holds: a shared lock, or a lease that has to be renewed."""

    @abstractmethod
    def intact(self) -> bool:
        """``True`` while nothing could have collected a blob checked under this hold; ``False``
        when it lapsed (a stalled process), so the caller must redo its checks under a new hold.

        Raises:
            RemoteRepoError: it lapsed and is an outer hold this caller cannot retake.
        """


class Quarantine(ABC):
    """Where ``fsck --repair`` moves what is broken (:meth:`Store.quarantine`)."""

    moved: set[str]  # keys moved aside so far
    location: str  # where they go (a folder of their own per run)

    def prepare(self) -> list[Finding]:
        """Move aside, before the repair locks the repo, what would keep it from locking or from
        quarantining (a lock file or quarantine folder that is a link or of the wrong kind);
        returns what was moved (nothing, where a store has no such entries)."""
        return []

    @abstractmethod
    def move(self, key: str) -> str | None:
        """Move the entry at ``key`` aside (with what belongs to it); returns where it went
        (relative to the repo's root), ``None`` when it was gone or already moved with its folder."""

    @abstractmethod
    def retire(self, prefix: str) -> str | None:
        """Move a version folder aside, leaving its number used (as :meth:`Store.retire`)."""

    @abstractmethod
    def finish(self, report: bytes) -> None:
        """Store the repair's report beside what was moved (nothing when nothing was)."""


class Store(ABC):
    """Where one repo's files live. Keys are ``/``-separated paths relative to the repo's root.

    Attributes:
        location: what ``Repo()`` takes to open the repo again: a path or a URL.
        root: the local folder of this repo's files on this machine (a directory's own root; an
            object store's mirror in the cache, where cached ``capture.json`` files are).
        is_remote: the store is reached over a network (captures for it are staged locally and
            uploaded in the background: tracing/upload.py).
        gc_grace_s: gc keeps unreferenced blobs younger than this by default.
        can_repair: ``fsck --repair`` can move damaged entries aside here.
        appends: :meth:`append` works (a directory): a name's index keeps its entries in a log
            that each save appends to, instead of in its head (repo/index.py).
    """

    location: str
    root: Path
    is_remote: bool = False
    gc_grace_s: float = 0.0
    can_repair: bool = False
    appends: bool = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"

    def __fspath__(self) -> str:
        """The repo's directory. Raises ``TypeError`` for a store that is not a local directory."""
        raise TypeError(f"{self.location} is not a local path")

    # ------------------------------------------------------------------------------ opening

    @abstractmethod
    def open(self, marker: str, initial: bytes, *, create: bool) -> bytes | None:
        """The layout marker's bytes, writing ``initial`` there first for a new repo (``create``).
        ``None`` when they cannot be read now and the repo is used from the cache (offline).

        Raises:
            CaptureNotFoundError: there is no repo here and ``create`` is false.
        """

    # ------------------------------------------------------------------------------ files by key

    @abstractmethod
    def read(self, key: str, *, immutable: bool = False) -> bytes | None:
        """The bytes at ``key``, ``None`` when there is nothing. ``immutable``: the caller knows the
        key never changes once written, so a store may answer from a cached copy.

        Raises:
            CorruptCaptureError: the entry is a link or not a regular file.
            CaptureNotFoundError: the store is offline and has no copy of ``key``.
        """

    def read_many(self, keys: Collection[str], *, immutable: bool = False) -> dict[str, bytes]:
        """Several small files at once (concurrently where that helps); missing and unreadable ones
        are left out. Here: one :meth:`read` each."""
        found = {}
        for key in keys:
            with contextlib.suppress(CorruptCaptureError):  # unreadable (a link, over its limit): left out
                data = self.read(key, immutable=immutable)
                if data is not None:
                    found[key] = data
        return found

    @abstractmethod
    def write(self, key: str, data: bytes, *, durable: bool = True) -> None:
        """Replace ``key`` atomically (readers see the old or the new bytes), creating its folder;
        ``durable=False`` for caches that are rebuilt when lost.

        Raises:
            FileNotFoundError: the folder above ``key``'s folder does not exist.
        """

    @abstractmethod
    def read_tagged(self, key: str) -> tuple[bytes | None, str | None]:
        """``key``'s bytes and the tag :meth:`swap` compares against (``None``: nothing there)."""

    @abstractmethod
    def swap(self, key: str, data: bytes, tag: str | None, *, durable: bool = True) -> str | None:
        """Write ``key`` only if it still has ``tag`` (``None``: only if nothing is there: a
        create-if-absent); returns the new tag (what a next swap compares against), ``None`` when
        another writer changed it meanwhile. ``durable=False`` for caches (a name's index head).

        Raises:
            RemoteRepoError: the backend has no conditional write.
        """

    def append(self, key: str, data: bytes) -> int:
        """Append ``data`` to the file ``key`` (created if missing; concurrent appends never
        interleave within one call's data); returns the offset just after it. Only where
        :attr:`appends` is true.

        Raises:
            UsageError: this store cannot append (object storage).
        """
        raise UsageError(f"{self.location} cannot append to {key}")

    def exists(self, key: str) -> bool:
        """Whether a file is at ``key`` (one ``lstat``, or one request, or the cached copy of an
        immutable key). Here: a :meth:`read` (the keys asked about are small files)."""
        return self.read(key) is not None

    @abstractmethod
    def remove(self, key: str) -> bool:
        """Delete ``key`` (a link as a link); ``False`` when nothing was there."""

    @abstractmethod
    def files(self, prefix: str) -> list[str]:
        """Names of the files directly in folder ``prefix``, sorted (links and folders left out)."""

    def is_folder(self, prefix: str) -> bool:
        """Whether ``prefix`` is a folder that exists on its own (here: never, as in an object
        store, where a version is its ``capture.json``).

        Raises:
            CorruptCaptureError: it is a link or not a folder.
        """
        return False

    @abstractmethod
    def local_path(self, key: str) -> Path:
        """Where ``key``'s bytes are on this machine (an object store's mirror copy, which a read
        with ``immutable=True`` keeps)."""

    def where(self, key: str) -> Path | str:
        """``key`` as users name it: a path, or a URL (here: the location, ``/``, the key)."""
        return f"{self.location.rstrip('/')}/{key}"

    # ------------------------------------------------------------------------------ names, versions

    @abstractmethod
    def names(self) -> list[str]:
        """The quoted names of the folders under ``names/`` that hold a name: an index head or a
        ``versions`` folder (offline: the ones cached). Other folders are left out at a cost that
        does not grow with them but for the listing itself (no read or request per folder: junk
        planted in a bucket must not cost a listing one request each, issue 35)."""

    @abstractmethod
    def scan(self, prefix: str, *, aliases: bool = True) -> Scan:
        """The versions and (with ``aliases``) aliases in the name folder ``prefix``."""

    @abstractmethod
    def publish(self, prefix: str, files: Mapping[str, bytes], *, folders: Collection[str] = (),
                unused: bool = False) -> bool:
        """Make the folder ``prefix`` appear with ``files`` (and the empty ``folders``) all at once,
        durably, only if it is free; ``False`` when it is taken or was removed (its tombstone).
        ``unused``: the caller knows the folder was never used (a number reserved in a name's
        index above every number used), so a store may skip looking for its tombstone."""

    @abstractmethod
    def retire(self, prefix: str) -> bool:
        """Remove the folder ``prefix`` and leave a tombstone, so that its name is never used again;
        ``False`` when it was gone already."""

    # ------------------------------------------------------------------------------ blobs

    @abstractmethod
    def blob_path(self, digest: str) -> Path:
        """Where the payload ``digest`` is (or will be) on this machine."""

    @abstractmethod
    def has_blob(self, digest: str) -> bool:
        """Whether the payload is stored as far as this store can tell cheaply: what a save may
        dedup against and a copy need not bring. A directory answers for verified blobs only (one
        that does not hash to its name counts as absent, so the next write replaces it); an object
        store for present ones (their hash is checked on download)."""

    @abstractmethod
    def write_blob(self, digest: str, data: memoryview | bytes | bytearray, *, chunks: ChunkDigests | None = None) -> bool:
        """Store a payload under its hash, durably; ``False`` when it was already there (dedup).
        ``chunks``: its marker's chunk hashes, when the caller computed them with the hash."""

    def stage_blob(self, data: memoryview | bytes | bytearray) -> Staged:
        """First half of a pipelined write (a save): the part that may run beside hashing. Here:
        nothing to stage (the bytes, as a view)."""
        return Staged(None, memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data))

    def publish_blob(self, staged: Staged, digest: str, chunks: ChunkDigests | None, *, flush: bool = True) -> None:
        """Second half: make a staged payload the blob ``digest``. ``flush=False`` leaves the
        flush of its folder to :meth:`flush_blobs` (once for many blobs). Here: :meth:`write_blob`."""
        self.write_blob(digest, staged.view, chunks=chunks)

    def flush_blobs(self, digests: Collection[str]) -> None:
        """Make the blobs published with ``flush=False`` durable (here: they are once written)."""
        return

    @abstractmethod
    def blob_writer(self, nbytes: int) -> BlobWriter:
        """A writer that streams a payload of ``nbytes`` bytes into this store's staging area (on the
        filesystem of its blobs, or of its local cache), hashing it as it goes; the save publishes
        what it sealed with :meth:`adopt_file` (repo/blob_writer.py).

        Raises:
            OSError: nothing can be staged here now (the caller copies the bytes instead).
        """

    def adopt_file(self, path: Path, digest: str, chunks: ChunkDigests | None, *, flush: bool = True) -> bool:
        """Make the staging file ``path`` (sealed by a :meth:`blob_writer` of this store: written,
        flushed and hashed to ``digest``) the blob ``digest``, durably; ``False`` when ``path`` is
        not this store's own staging file (then :meth:`put_blob_file` copies it). ``flush=False``
        leaves the flush of the blob's folder to :meth:`flush_blobs` (once for many blobs)."""
        return False

    @abstractmethod
    def put_blob_file(self, digest: str, source: Path, *, verified: bool = False, missing: bool = False) -> int:
        """Store a payload from a local file (push, pull, an import), hashing every byte it copies
        (never a link to ``source``); bytes written (0 if it was there). ``verified``: ``source`` is
        this process's own staging file, hashed as it was written (:meth:`adopt_file` could not
        take it), so a store may skip hashing it again; never for a file of another repo.
        ``missing``: the caller just found it absent (a store may skip looking again).

        Raises:
            CorruptCaptureError: ``source`` does not hash to ``digest`` (nothing is stored).
        """

    @abstractmethod
    def blob_file(self, digest: str, nbytes: int, *, full: bool = False, pack: bool = False) -> Path:
        """A local file of the payload, checked (size; hash as :mod:`~modulelens.repo.markers`
        decides, always with ``full``), downloaded first if the store keeps it elsewhere. ``pack``:
        the blob is a pack, whose members are checked against their hashes whenever its own hash is
        (:func:`~modulelens.repo.packs.check_members`).

        Raises:
            CorruptCaptureError: missing, truncated, a link, not matching its hash, or a pack member
                not matching its own.
        """

    def read_ahead(self, blobs: Mapping[str, int]) -> None:
        """A hint before :meth:`blob_file` is asked for each of ``blobs`` (``{digest: nbytes}``) in
        turn: start reading, all at once, what those checks will read. Checks nothing; here, does
        nothing."""
        return None  # a store whose checks read nothing ahead of time needs no hint

    @abstractmethod
    def fetch_blobs(self, wanted: Callable[[], Mapping[str, int]], *, label: str = "") -> int:
        """Make the blobs ``wanted()`` names (``{digest: nbytes}``) available on this machine;
        returns bytes downloaded. A callable: a directory has them already and never computes it."""

    @abstractmethod
    def blobs(self) -> dict[str, BlobStat]:
        """Every stored blob (payloads and packs, by file name); links are never listed."""

    def remove_blobs(self, keys: Collection[str]) -> None:
        """Delete blobs by key (what they carry with them, too); missing ones are skipped. Here:
        one :meth:`remove` each."""
        for key in keys:
            self.remove(key)

    def verify_blobs(self, blobs: Mapping[str, int], members: Mapping[str, Collection[tuple[str, int]]]) -> BlobCheck:
        """Check ``blobs`` (``{digest: nbytes}``) and the pack ``members`` (pack digest ->
        ``(member digest, nbytes)``) as deeply as this store can without downloading them. Here:
        presence and size of each blob from one listing (:meth:`blobs`); not their hashes (that
        would download everything: ``load(..., verify=True)`` hashes what it downloads), nor pack
        members."""
        sizes = {name: stat.size for name, stat in self.blobs().items()}
        check = BlobCheck(note="payload sizes checked from the listing of blobs, not their hashes")
        for digest, nbytes in sorted(blobs.items()):
            found = sizes.get(digest.partition(":")[2])
            if found is None:
                check.damaged[digest] = "missing"
            elif found != nbytes:
                check.damaged[digest] = f"{found} bytes, expected {nbytes}"
            else:
                check.checked += 1
                check.bytes += nbytes
        return check

    # ------------------------------------------------------------------------------ locks

    @abstractmethod
    def writing(self) -> contextlib.AbstractContextManager[Hold]:
        """Held by every writer while it writes blobs and commits the version that references them,
        so gc never collects a blob a writer found present. Re-entrant per thread."""

    @abstractmethod
    def exclusive(self, wait_s: float = 600.0) -> contextlib.AbstractContextManager[float]:
        """Held by gc (and repairs) alone: waits for writers to finish and keeps new ones out;
        yields when it started, by the store's clock.

        Raises:
            RepoBusyError: another gc holds it, or writers kept it longer than ``wait_s``.
        """

    # ------------------------------------------------------------------------------ upkeep

    def clean_staging(self, cutoff: float, *, dry_run: bool = False) -> int:
        """Remove staging older than ``cutoff`` left by writers that are gone; returns how many
        (here none: nothing is visible before its single final write, so there is no staging area)."""
        return 0

    def audit(self) -> Audit:
        """Entries that are not part of the repo's layout, and links (fsck). Here none are looked
        for: a store of keys has no links, and keys the layout does not name are not listed."""
        return Audit()

    def quarantine(self) -> Quarantine:
        """A new quarantine run for ``fsck --repair`` (where :attr:`can_repair`).

        Raises:
            UsageError: this store cannot move things aside (here: never).
        """
        raise UsageError(f"fsck --repair works on local repos only ({self.location}); pull what you need into "
                         "a local repo and repair that")

