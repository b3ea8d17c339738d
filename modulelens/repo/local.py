"""A repo in a local directory: the :class:`~modulelens.repo.store.Store` of the embedded default.

Layout (docs/repo-layout.md): the keys of :mod:`modulelens.repo.layout`, plus what only a
directory has::

    <root>/blobs/<2 hex>/<hash hex>.ok   the blob as it was when its hash was last checked, bound to this repo and user (markers.py)
    <root>/names/<quoted name>/versions/<N>.removed   tombstone: N was used by a version since removed
    <root>/names/<quoted name>/summary-<N>.log     the entries of the name's index (repo/index.py)
    <root>/tmp/                          staging area; everything becomes visible by rename
    <root>/lock, <root>/lock-gate        flock: shared by writers, exclusive for gc (behind a turnstile)
    <root>/trust.json                    the trust setting (repo/trust.py)
    <root>/quarantine/<time>-<id>/       what fsck --repair moved aside

A version directory appears in one ``rename`` of a fully written staging directory, so a crash
never leaves a half-visible version, and two writers racing for ``N`` both succeed: the loser of
the rename takes ``N+1``. A repo may come from someone else, so nothing inside it is followed if it
is a symbolic link (files.py); every folder on the way to a key, the top-level ones (``names``,
``blobs``, ``tmp``, ``quarantine``) included, is checked with ``lstat``, and the lock files are
opened without following a link. An entry of the wrong kind (a link, a file where a folder belongs)
is a one-line ``CorruptCaptureError`` naming it, which ``fsck --repair`` moves aside.

Its parts with a job of their own: the locks (local_locks.py), fsck's audit and quarantine
(local_audit.py), and the blob checks and copies that read every byte (local_blobs.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from modulelens.errors import CaptureNotFoundError, CorruptCaptureError, SigningKeyError
from modulelens.format.hashing import hash_bytes
from modulelens.format.provenance import user_key
from modulelens.repo.blob_writer import FileBlobWriter
from modulelens.repo.files import (
    flush_and_rename,
    flush_folder,
    hash_file,
    read_regular,
    require_dir,
    write_new_file,
)
from modulelens.repo.layout import (
    SUMMARY_FILE,
    blob_key,
    is_version_number,
    read_limit,
)
from modulelens.repo.local_audit import TOMBSTONE, LocalAuditor, LocalQuarantine, writer_alive
from modulelens.repo.local_blobs import copy_hashed, pack_members_damage
from modulelens.repo.local_locks import DirectoryLock
from modulelens.repo.locks import busy, lock_wait_s, wait_for
from modulelens.repo.markers import (
    MARK_MIN_BYTES,
    MARK_MIN_PACK_BYTES,
    MarkerKey,
    chunk_digests,
    read_ahead,
    sampled_check,
    write_marker,
)
from modulelens.repo.packs import check_members
from modulelens.repo.store import Audit, BlobCheck, BlobStat, BlobWriter, Hold, Quarantine, Scan, Staged, Store
from modulelens.repo.trust import repo_identity

if TYPE_CHECKING:
    from modulelens.repo.markers import ChunkDigests


class LocalStore(Store):
    """A repo's files in the directory ``root``.

    Args:
        root: the repo's directory (absolute).
    """

    is_remote = False
    appends = True  # a name's index appends each version's entry to its log (repo/index.py)
    gc_grace_s = 0.0  # gc holds the lock exclusively: no save is in flight, every unreferenced blob is garbage
    can_repair = True

    def __init__(self, root: Path) -> None:
        self.root = root
        self.location = str(root)
        self._lock = DirectoryLock(root)
        self._checked: set[str] = set()  # top-level folders found to be real folders
        self._marker_key: MarkerKey | None = None  # found once, then kept (markers.py)

    def __fspath__(self) -> str:
        return self.location

    def open(self, marker: str, initial: bytes, *, create: bool) -> bytes | None:
        try:
            return _read_key(self.root / marker, marker)
        except FileNotFoundError:
            if not create:
                raise CaptureNotFoundError(f"no modulelens repo at {self.root}") from None
        self.root.mkdir(parents=True, exist_ok=True)
        for sub in ("blobs", "names", "tmp"):
            self._folder(sub, create=True)  # a link or a file already there is refused, never written through
        self._atomic_write(self.root / marker, initial)
        return initial

    # ------------------------------------------------------------------------------ paths

    def _file(self, key: str, *, create_folder: bool = False) -> str:
        """The path of ``key`` after checking that each folder on the way is a real folder (a link
        planted anywhere in a repo is never followed). ``create_folder``: the folder holding the
        file is made when missing (the one above it must exist, unless it is a top-level folder:
        see :meth:`_folder`)."""
        folder, _, _ = key.rpartition("/")
        if folder:
            self._folder(folder, create=create_folder)
        return f"{self.location}/{key}"

    def _folder(self, prefix: str, *, create: bool = False, create_all: bool = False,
                checked: set[str] | None = None) -> str:
        """The path of the folder ``prefix`` after checking each folder on the way with ``lstat``.
        ``create``: make it when missing (the one above must exist), and a missing top-level
        folder too (``names/`` that ``fsck --repair`` moved aside: a name's index is written before
        its first version); ``create_all``: make every missing one, each inside a folder just
        checked (a name's first save), durably. ``checked``: folders a caller reading many keys
        found to be real ones already (not looked at again; those found here are added)."""
        parts = prefix.split("/")
        path = self.location
        for index, part in enumerate(parts):
            parent, path = path, f"{path}/{part}"
            if (index == 0 and part in self._checked) or (checked is not None and path in checked):
                continue
            try:
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    require_dir(path)  # raises, naming a link or another entry
            except FileNotFoundError:
                if not (create_all or (create and index in (0, len(parts) - 1))):
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(path)
                require_dir(path)
                if create_all:
                    flush_folder(Path(parent))  # the new folder's name is durable before anything is put in it
            if index == 0:
                # names/, blobs/: checked once per store object (a listing reads a file in each of
                # 200 name folders; re-checking names/ each time was a twentieth of it)
                self._checked.add(part)
            elif checked is not None:
                checked.add(path)
        return path

    def _tmp_path(self, suffix: str = "") -> Path:
        tmp = self._folder("tmp", create=True)  # staging through a linked tmp/ would write outside
        return Path(f"{tmp}/{os.getpid()}-{os.urandom(16).hex()}{suffix}")  # (uuid4().hex: the same, without a UUID object)

    def _shard(self, digest: str, *, create: bool = False) -> str:
        """The folder of blob ``digest`` (``blobs/<2 hex>``), after checking it and ``blobs/`` with
        ``lstat``: a link there would be read through, or written through by a save."""
        return self._folder(blob_key(digest).rpartition("/")[0], create_all=create)

    def _markers(self, *, create: bool = False) -> MarkerKey | None:
        """What binds this repo's verification markers to it and to the user (markers.py); ``None``
        without a usable signing key (then no marker is trusted or written, and every load hashes
        large blobs in full). Looked up until found. ``create``: make the key if there is none, when
        a marker is about to be written (a large blob was just hashed in full): a user who only ever
        loads (a teammate's captures, a remote repo's cache) would otherwise hash every large blob
        in full on every load (a 64 MiB blob: 92 ms instead of 0.21 ms, benchmarks/bench_markers.py).
        Creating it grants nothing: no capture is signed with a key made after it was saved."""
        if self._marker_key is None:
            try:
                self._marker_key = MarkerKey.derive(user_key(create=create), repo_identity(self.root))
            except (SigningKeyError, OSError):
                return None
        return self._marker_key

    def _atomic_write(self, target: str | Path, data: bytes | memoryview, *, flush: bool = True) -> None:
        """Replace ``target`` in one rename; ``flush=False`` for caches, which are rebuilt when lost."""
        tmp = self._tmp_path()
        write_new_file(tmp, data, mode=0o644)
        if flush:
            flush_and_rename(tmp, Path(target))
        else:
            os.replace(tmp, target)

    # ------------------------------------------------------------------------------ files by key

    def read(self, key: str, *, immutable: bool = False) -> bytes | None:
        try:
            return _read_key(self._file(key), key)  # json.loads decodes; undecodable bytes are a ValueError there
        except FileNotFoundError:
            return None

    def read_many(self, keys: Collection[str], *, immutable: bool = False) -> dict[str, bytes]:
        """Each folder on the way is checked once per call (the versions of a name share two: a gc
        reading every capture file made three ``lstat`` per version)."""
        found = {}
        checked: set[str] = set()
        for key in keys:
            with contextlib.suppress(OSError, CorruptCaptureError):  # a linked file is left out, never read
                folder, _, leaf = key.rpartition("/")
                path = f"{self._folder(folder, checked=checked)}/{leaf}" if folder else f"{self.location}/{key}"
                found[key] = _read_key(path, key)
        return found

    def write(self, key: str, data: bytes, *, durable: bool = True) -> None:
        self._atomic_write(self._file(key, create_folder=True), data, flush=durable)

    def read_tagged(self, key: str) -> tuple[bytes | None, str | None]:
        try:
            return self._tagged(self._file(key), key)
        except FileNotFoundError:
            return None, None

    @staticmethod
    def _tagged(path: str, key: str) -> tuple[bytes | None, str | None]:
        try:
            data = _read_key(path, key)  # O_NOFOLLOW and fstat: a link or other entry is refused unread
        except FileNotFoundError:
            return None, None
        except (CorruptCaptureError, OSError):  # (OSError: a socket there cannot be opened)
            info = os.lstat(path)  # (an lstat before every read was one system call in ten of a save)
            if stat.S_ISREG(info.st_mode):
                raise  # a regular file over its size limit, or unreadable
            # a link or other entry: replaced by the write, never written through
            return None, f"entry:{info.st_ino}:{info.st_mtime_ns}"
        return data, _content_tag(data)

    @staticmethod
    def _open_head(path: str, key: str) -> tuple[int, bytes] | None:
        """A descriptor open for reading and writing on the regular file ``path`` and its bytes, for
        the in-place rewrite of :meth:`swap` (one open for the compare and the write); ``None`` when
        it is anything else (missing, a link, not a regular file, not writable: :meth:`swap` then
        takes the path that handles each)."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            limit, _ = read_limit(key)
            if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
                os.close(fd)
                return None
            data = os.read(fd, info.st_size + 1)  # a regular file reads short only at its end
            while len(data) > info.st_size and len(data) <= limit and (more := os.read(fd, 1 << 16)):
                data += more  # it grew meanwhile: read on to the end
            if len(data) > limit:
                os.close(fd)
                return None
        except BaseException:
            os.close(fd)
            raise
        return fd, data

    def swap(self, key: str, data: bytes, tag: str | None, *, durable: bool = True) -> str | None:
        """Compare and write under an ``flock`` of the key's folder, so of two writers that read
        the same tag only the first writes.

        ``durable=False`` (a name's index head, rewritten by every save) overwrites an existing
        file in place, padded with spaces to its length: renaming a new file over an existing one
        makes ext4 flush the new file first (``auto_da_alloc``), 2-3.5 ms per rename on this
        machine against 8 us for the write. A reader may then see a torn write, which the caller's
        format must let it tell (the index head carries a checksum: repo/index.py)."""
        path = self._file(key, create_folder=True)
        folder = os.path.dirname(path)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            waited = lock_wait_s()
            if not wait_for(fd, exclusive=True, deadline=time.monotonic() + waited):
                raise busy(folder, fd, waited, f"writing {self.where(key)}")
            head = None if durable else self._open_head(path, key)
            if head is None:  # a durable write, or no regular file there we may rewrite in place
                current, current_tag = self._tagged(path, key)
                if current_tag != tag:
                    return None
                if durable or current is None:  # (a new file: its rename overwrites nothing)
                    self._atomic_write(path, data, flush=durable)
                    return _content_tag(data)
                target = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            else:
                target, current = head
                if _content_tag(current) != tag:
                    os.close(target)
                    return None
            try:
                data = data.ljust(len(current))
                written = 0
                while written < len(data):
                    written += os.pwrite(target, data[written:], written)
            finally:
                os.close(target)
            return _content_tag(data)
        finally:
            os.close(fd)

    def append(self, key: str, data: bytes) -> int:
        """One ``write`` to a file opened with ``O_APPEND``: the kernel places each call's data at
        the end as a whole, so appenders in several processes never interleave."""
        # O_NOFOLLOW: a link planted there is an error (the index then starts a new log), never
        # written through; O_NONBLOCK: a FIFO planted there fails instead of blocking the save
        fd = os.open(self._file(key), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                     | os.O_NONBLOCK, 0o644)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CorruptCaptureError(f"{self.root}/{key} is not a regular file")
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            return os.lseek(fd, 0, os.SEEK_CUR)
        finally:
            os.close(fd)

    def exists(self, key: str) -> bool:
        try:
            return stat.S_ISREG(os.lstat(self._file(key)).st_mode)
        except FileNotFoundError:
            return False

    def remove(self, key: str) -> bool:
        try:
            os.unlink(self._file(key))  # a link there is removed as a link
        except FileNotFoundError:  # never there, or removed meanwhile by a concurrent rm
            return False
        return True

    def files(self, prefix: str) -> list[str]:
        try:
            folder = self._folder(prefix)
        except FileNotFoundError:
            return []
        with os.scandir(folder) as found:
            return sorted(entry.name for entry in found if entry.is_file(follow_symlinks=False))

    def is_folder(self, prefix: str) -> bool:
        try:
            self._folder(prefix)
        except FileNotFoundError:
            return False
        return True

    def local_path(self, key: str) -> Path:
        return Path(f"{self.root}/{key}")

    def cached(self, key: str) -> bool:
        return False  # nothing is cached: reading is already local

    def where(self, key: str) -> Path:
        return Path(f"{self.root}/{key}")

    # ------------------------------------------------------------------------------ names, versions

    def names(self) -> list[str]:
        """One ``lstat`` per real name (its head), two per other folder: 100,000 empty folders
        planted in ``names/`` made a listing read and scan each (25 s; now ~0.5 s, issue 35).
        Raises ``CorruptCaptureError`` when ``names/`` is a link or not a folder."""
        try:
            with os.scandir(self._folder("names")) as found:
                return [entry.name for entry in found if entry.is_dir(follow_symlinks=False)
                        and (os.path.lexists(f"{entry.path}/{SUMMARY_FILE}") or os.path.lexists(f"{entry.path}/versions"))]
        except FileNotFoundError:
            return []

    def scan(self, prefix: str, *, aliases: bool = True) -> Scan:
        """A version's identity is its folder's inode and ctime, so a folder replaced under the
        same number (fsck --repair, a restore from backup) is never mistaken for the old one."""
        versions: dict[int, list[int] | None] = {}
        used = 0
        with contextlib.suppress(FileNotFoundError), os.scandir(self._folder(f"{prefix}/versions")) as found:
            for entry in found:
                number = entry.name.removesuffix(TOMBSTONE)
                if not is_version_number(number):
                    continue  # (fsck reports it)
                used = max(used, int(number))
                if number == entry.name:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed meanwhile
                    versions[int(number)] = [info.st_ino, info.st_ctime_ns]
        return Scan(dict(sorted(versions.items())), used, self._aliases(prefix) if aliases else {})

    def _aliases(self, prefix: str) -> dict[str, int]:
        result = {}
        # an aliases/ folder that is a link or a file lists no alias (fsck reports it; moving one fails naming it)
        with contextlib.suppress(FileNotFoundError, CorruptCaptureError), \
                os.scandir(self._folder(f"{prefix}/aliases")) as found:
            for entry in found:
                if not entry.name.startswith("."):  # a linked or odd alias is skipped here, reported by fsck
                    with contextlib.suppress(ValueError, OSError, CorruptCaptureError):
                        result[entry.name] = int(_read_key(entry.path, f"{prefix}/aliases/{entry.name}").decode().strip())
        return dict(sorted(result.items()))

    def publish(self, prefix: str, files: Mapping[str, bytes], *, folders: Collection[str] = (),
                unused: bool = False) -> bool:
        parent, _, leaf = prefix.rpartition("/")
        target = self._folder(parent, create_all=True)  # names/<name>/versions, on a name's first save
        if os.path.lexists(f"{target}/{leaf}{TOMBSTONE}"):
            return False  # once used: a ref someone noted down never silently means another capture
        staging = self._tmp_path(".version")
        staging.mkdir()
        renamed = False
        try:
            for folder in folders:
                (staging / folder).mkdir()
            for filename, data in files.items():
                write_new_file(staging / filename, data, mode=0o644, flush=True)
            flush_folder(staging)
            try:
                os.rename(staging, f"{target}/{leaf}")
            except OSError as error:
                if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    return False  # another writer took this number
                raise
            renamed = True
            flush_folder(Path(target))  # the rename itself is what makes the version exist
            return True
        finally:
            if not renamed:
                shutil.rmtree(staging, ignore_errors=True)

    def retire(self, prefix: str) -> bool:
        """A tombstone first (flushed), then the folder moves out of sight in one rename and is deleted."""
        folder = self._file(prefix)
        with contextlib.suppress(FileExistsError):
            write_new_file(Path(folder + TOMBSTONE), b"", mode=0o644)
        flush_folder(Path(os.path.dirname(folder)))
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

    # ------------------------------------------------------------------------------ blobs

    def blob_path(self, digest: str) -> Path:
        return Path(f"{self.root}/{blob_key(digest)}")

    def has_blob(self, digest: str) -> bool:
        """Whether a *verified* copy of ``digest`` is stored: what a save may skip writing (dedup) and
        a copy need not bring. A blob that does not hash to its name (it came with a received repo,
        or was damaged since) counts as absent, so the next write of those bytes replaces it: a save
        that skipped it would return success and leave a capture that cannot load (issue 21). Large
        blobs are vouched for by their marker (this repo's and user's, the file unchanged since its
        check) and its sampled chunks, the others hashed in full."""
        path = self.blob_path(digest)
        try:
            self._shard(digest)
            info = os.lstat(path)
        except (FileNotFoundError, CorruptCaptureError):  # (a shard that is a link or a file: the write names it)
            return False
        if not stat.S_ISREG(info.st_mode):
            return False
        if info.st_size >= MARK_MIN_BYTES and sampled_check(path, info, self._markers()):
            return True
        try:
            matches = hash_file(path) == digest
        except (FileNotFoundError, CorruptCaptureError):  # replaced or removed meanwhile
            return False
        if matches and info.st_size >= MARK_MIN_BYTES:
            write_marker(path, self._markers(create=True))
        return matches

    def write_blob(self, digest: str, data: memoryview | bytes | bytearray, *, chunks: ChunkDigests | None = None) -> bool:
        if self.has_blob(digest):
            return False
        self.publish_blob(self.stage_blob(data), digest, chunks)
        return True

    def stage_blob(self, data: memoryview | bytes | bytearray) -> Staged:
        view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
        tmp = self._tmp_path()
        write_new_file(tmp, view)
        return Staged(tmp, view)

    def publish_blob(self, staged: Staged, digest: str, chunks: ChunkDigests | None, *, flush: bool = True) -> None:
        """Flush a staged payload and rename it into ``blobs/`` (over a blob of that name that did
        not verify); then write its marker."""
        assert staged.path is not None
        self._publish_file(staged.path, digest, lambda: chunks or chunk_digests(staged.view), len(staged.view),
                           flush=flush)

    def _publish_file(self, staged: Path, digest: str, chunks: Callable[[], ChunkDigests | None], size: int, *,
                      flush: bool = True, sealed: bool = False) -> None:
        path = self.blob_path(digest)
        try:
            self._shard(digest, create=True)  # a shard folder planted as a link or a file is refused
            if sealed:  # flushed by its blob writer already: only the rename is left to flush
                os.replace(staged, path)
                if flush:
                    flush_folder(path.parent)
            else:
                flush_and_rename(staged, path, flush_target_folder=flush)
        except BaseException as error:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged)
            if isinstance(error, (IsADirectoryError, NotADirectoryError)) or getattr(error, "errno", None) == errno.ENOTEMPTY:
                raise CorruptCaptureError(f"{path} is not a regular file; `modulelens fsck --repair` moves it aside") from None
            raise
        if size >= MARK_MIN_BYTES:
            write_marker(path, self._markers(create=True), chunks())

    def flush_blobs(self, digests: Collection[str]) -> None:
        for folder in {self.blob_path(digest).parent for digest in digests}:
            flush_folder(folder)

    def blob_writer(self, nbytes: int) -> BlobWriter:
        return FileBlobWriter(self._tmp_path(".weight"), nbytes)  # tmp/<pid>-...: gc keeps it while we run

    def adopt_file(self, path: Path, digest: str, chunks: ChunkDigests | None, *, flush: bool = True) -> bool:
        """Rename this process's own staging file (sealed by :meth:`blob_writer`) into place as blob
        ``digest``, over a blob of that name that did not verify. Only a regular file directly in
        this repo's real ``tmp/`` is adopted; anything else (another repo's file) is copied, every
        byte hashed, by :meth:`put_blob_file`."""
        try:
            tmp = self._folder("tmp")  # a linked tmp/ is refused: its files are outside the repo
        except (FileNotFoundError, CorruptCaptureError):
            return False
        if str(path.parent) != tmp or not _is_regular(path):
            return False
        self._publish_file(path, digest, lambda: chunks, os.path.getsize(path), flush=flush, sealed=True)
        return True

    def put_blob_file(self, digest: str, source: Path, *, verified: bool = False, missing: bool = False) -> int:
        """Copy a payload from a file of another repo (push, pull, an import), hashing every byte as
        it is copied: what is renamed into place is exactly what was hashed, and never a hard link to
        the other repo's file (a push to another folder is a backup; a damaged byte in one repo must
        not show up in both). ``verified`` changes nothing here: a copy hashes what it writes, even
        for a file whose writer hashed it (the copy is the cheap half). ``missing``: the caller just
        found no verified copy (:meth:`has_blob`), so it is not looked for again.

        Raises:
            CorruptCaptureError: ``source`` does not hash to ``digest`` (nothing is stored).
        """
        if not missing and self.has_blob(digest):
            return 0
        staged = self._tmp_path()
        try:
            size, chunks = copy_hashed(source, staged, digest)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged)
            raise
        self._publish_file(staged, digest, lambda: chunks, size)
        return size

    def partial_path(self, digest: str) -> Path:
        """Where a download of ``digest`` into this store accumulates (repo/remote.py)."""
        return Path(f"{self._folder('tmp', create=True)}/{self.blob_path(digest).name}.part")

    def adopt_blob(self, digest: str, part: Path, nbytes: int) -> None:
        """Make the finished download ``part`` the blob ``digest`` after checking its hash.

        Raises:
            CorruptCaptureError: its content does not hash to ``digest`` (it is deleted).
        """
        actual = hash_file(part)
        if actual != digest:
            part.unlink()
            raise CorruptCaptureError(f"payload {digest} is corrupted: its content hashes to {actual}")
        os.chmod(part, 0o444)
        target = self.blob_path(digest)
        self._shard(digest, create=True)
        os.replace(part, target)
        if nbytes >= MARK_MIN_BYTES:
            write_marker(target, self._markers(create=True))

    def blob_file(self, digest: str, nbytes: int, *, full: bool = False, pack: bool = False) -> Path:
        """Size always; the full hash for small payloads, for large ones and packs without this
        repo's marker or changed since their last check, or always with ``full``; otherwise a
        sampled hash of a few chunks (coverage: :mod:`modulelens.repo.markers`). ``pack``: the blob
        is a pack, and every member is checked against its hash whenever the pack's own hash is."""
        path = self.blob_path(digest)
        try:
            self._shard(digest)
            info = os.lstat(path)
        except FileNotFoundError:
            raise CorruptCaptureError(f"payload {digest} is missing from {self.root}") from None
        if not stat.S_ISREG(info.st_mode):
            raise CorruptCaptureError(f"payload {path} is not a regular file (a link or other entry is never followed)")
        if info.st_size != nbytes:
            raise CorruptCaptureError(
                f"payload {digest} has {info.st_size} bytes, expected {nbytes} (truncated or damaged)"
            )
        marked = info.st_size >= (MARK_MIN_PACK_BYTES if pack else MARK_MIN_BYTES)
        sampled = sampled_check(path, info, self._markers(), pack=pack) if marked and not full else None
        if sampled is False:
            raise CorruptCaptureError(f"payload {path} is corrupted: a sampled chunk does not hash as recorded")
        if sampled is None:
            try:
                actual = hash_file(path)
                if actual != digest:
                    raise CorruptCaptureError(f"payload {path} is corrupted: its content hashes to {actual}")
                if pack:
                    check_members(path)
            except FileNotFoundError:  # freed meanwhile by a gc (after an rm of the version being loaded)
                raise CorruptCaptureError(f"payload {digest} is missing from {self.root}") from None
            if marked:
                write_marker(path, self._markers(create=True), pack=pack)
        return path

    def read_ahead(self, blobs: Mapping[str, int]) -> None:
        """The markers and sampled chunks of these blobs asked of the disk together
        (:func:`~modulelens.repo.markers.read_ahead`): a cold load of 16 weight files waited for 32
        small reads one after another."""
        for digest, nbytes in blobs.items():
            try:
                path = self.blob_path(digest)
            except (CorruptCaptureError, ValueError):
                continue  # a malformed name: its check says so
            read_ahead(path, nbytes)

    def fetch_blobs(self, wanted: Callable[[], Mapping[str, int]], *, label: str = "") -> int:
        return 0  # every blob of a directory is already here

    def blobs(self) -> dict[str, BlobStat]:
        """Found with scandir (pathlib's glob took most of a gc --dry-run). Only real shard folders
        and regular files count: gc never follows a symlink placed in ``blobs/``, so it can never
        delete a file outside the repo."""
        found = {}
        with contextlib.suppress(FileNotFoundError), os.scandir(self._folder("blobs")) as shards:
            for shard in shards:
                if not shard.is_dir(follow_symlinks=False):
                    continue
                with os.scandir(shard.path) as entries:
                    for entry in entries:
                        if entry.name.endswith(".ok") or not entry.is_file(follow_symlinks=False):
                            continue
                        with contextlib.suppress(FileNotFoundError):  # freed meanwhile
                            info = entry.stat(follow_symlinks=False)
                            found[entry.name] = BlobStat(f"blobs/{shard.name}/{entry.name}", info.st_size, info.st_mtime)
        return found

    def remove_blobs(self, keys: Collection[str]) -> None:
        for key in keys:
            with contextlib.suppress(FileNotFoundError):  # another gc or a repair got there first
                os.unlink(f"{self.root}/{key}")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.root}/{key}.ok")

    def verify_blobs(self, blobs: Mapping[str, int], members: Mapping[str, Collection[tuple[str, int]]]) -> BlobCheck:
        """The full hash of every blob (not the sampled check of a load), then each pack member's."""
        check = BlobCheck()
        for digest, nbytes in sorted(blobs.items()):
            why = self._verify_blob(digest, nbytes, check)
            if why:
                check.damaged[digest] = why
        for pack, wanted in sorted(members.items()):
            if pack not in check.damaged:
                why = pack_members_damage(self.blob_path(pack), set(wanted))
                if why:
                    check.damaged[pack] = why
        return check

    def _verify_blob(self, digest: str, nbytes: int, check: BlobCheck) -> str | None:
        try:
            path = self.blob_path(digest)
            self._shard(digest)
            info = os.lstat(path)
        except CorruptCaptureError as error:
            return str(error)
        except FileNotFoundError:
            return "missing"
        if not stat.S_ISREG(info.st_mode):
            return "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
        if info.st_size != nbytes:
            return f"{info.st_size} bytes, expected {nbytes}"
        check.checked += 1
        check.bytes += nbytes
        try:
            actual = hash_file(path)
        except FileNotFoundError:  # freed meanwhile by a gc after an rm of its last version
            return "missing"
        return f"content hashes to {actual}" if actual != digest else None

    # ------------------------------------------------------------------------------ locks

    def writing(self) -> contextlib.AbstractContextManager[Hold]:
        return self._lock.writing()

    def exclusive(self, wait_s: float = 600.0) -> contextlib.AbstractContextManager[float]:
        return self._lock.exclusive(wait_s)

    # ------------------------------------------------------------------------------ upkeep

    def clean_staging(self, cutoff: float, *, dry_run: bool = False) -> int:
        """Never follows a symlink (a link placed in ``tmp/`` is removed as a link, never the tree
        it points to), an entry a concurrent ``rm`` or save removes meanwhile is simply gone, and
        the staging of a writer still running on this machine (``tmp/<pid>-...``) is left alone
        however old, so even ``tmp_age_s=0`` breaks no save."""
        removed = 0
        with contextlib.suppress(FileNotFoundError), os.scandir(self._folder("tmp")) as entries:
            for entry in list(entries):
                with contextlib.suppress(FileNotFoundError):
                    if entry.stat(follow_symlinks=False).st_mtime >= cutoff or writer_alive(entry.name):
                        continue
                    removed += 1
                    if dry_run:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path)
                    else:
                        os.unlink(entry.path)
        return removed

    def audit(self) -> Audit:
        return LocalAuditor(self.root).run()

    def quarantine(self) -> Quarantine:
        return LocalQuarantine(self.root)


# ------------------------------------------------------------------------------------ helpers


def _read_key(path: str | Path, key: str) -> bytes:
    """The bytes of the file of ``key``, refused unread when it is larger than a file of its kind
    may be (layout.read_limit: a hostile capture.json of gigabytes costs a stat, not the memory)."""
    limit, hint = read_limit(key)
    return read_regular(path, limit=limit, hint=hint)


def _content_tag(data: bytes) -> str:
    return hash_bytes(data, threads=False)  # (an index head is kilobytes: one thread)


def _is_regular(path: Path) -> bool:
    """Whether ``path`` is a regular file (``lstat``: a link is not)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False
