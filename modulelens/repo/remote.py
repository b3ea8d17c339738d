"""A repo at an fsspec URL (``s3://bucket/prefix``, ``memory://name``, ...), read through a local cache.

The keys are the local repo's (docs/repo-layout.md); what differs is how a change becomes
visible, because object stores have no rename and no lock:

* a version is its ``capture.json``: payloads are uploaded first, then ``versions/<N>/capture.json``
  is created with a conditional write (``If-None-Match: *``). Of two savers racing for ``N`` the
  server lets exactly one create it; the other takes ``N+1``.
* a removed version leaves the tombstone object ``versions/<N>/removed``.
* an alias moves with compare-and-swap (``If-Match`` on the ETag read).
* writers hold leases and gc holds ``locks/gc`` (:mod:`modulelens.repo.leases`), and gc only deletes
  unreferenced blobs older than a grace period.

Reads go through a content-addressed cache (``$MODULELENS_CACHE``, default
``~/.cache/modulelens/cache``, itself a :class:`~modulelens.repo.local.LocalStore` holding blobs):
payloads are downloaded once, hash-checked and memory-mapped from there. A mirror of the repo's
small objects is kept beside it (``remotes/<quoted URL>/``): ``capture.json`` files (immutable),
the last listing of each name, and the last value read of anything else, so ``MODULELENS_OFFLINE=1``
(or an unreachable server) works from the cache alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from modulelens.errors import CaptureNotFoundError, CorruptCaptureError, ModulelensWarning, RemoteRepoError
from modulelens.repo.backend import ObjectBackend
from modulelens.repo.files import hash_file, too_large
from modulelens.repo.layout import CAPTURE_FILE, MARKER, SUMMARY_FILE, blob_key, is_version_number, marker_json, read_limit
from modulelens.repo.leases import Leases
from modulelens.repo.local import LocalStore
from modulelens.repo.location import cache_root, offline
from modulelens.repo.locks import busy, lock_wait_s, wait_for
from modulelens.repo.remote_errors import is_network_error
from modulelens.repo.store import BlobStat, BlobWriter, Hold, Scan, Staged, Store

if TYPE_CHECKING:
    from modulelens.repo.markers import ChunkDigests

REMOVED = "removed"  # tombstone key in versions/<N>/: the number stays used after `rm`
INDEX = "index.json"  # a name's last listing, in the mirror
_CHUNK = 16 << 20  # download granularity (resume point, progress step)
_WORKERS = 8
_SMALL_BLOB = 256 << 10


class RemoteStore(Store):
    """A repo's files in object storage, with a local cache. ``Repo("s3://...")`` opens one.

    Args:
        objects: the object backend the repo's keys are kept in (the store registry builds it from
            the URL: :class:`~modulelens.repo._objects_s3.S3Objects` for ``s3://``, one registered
            with :func:`~modulelens.repo.registry.object_store`, fsspec's generic
            :class:`~modulelens.repo._objects.FsspecObjects` otherwise).

    Raises:
        RemoteRepoError: ``MODULELENS_OFFLINE`` is set and the cache has nothing from the URL.
    """

    is_remote = True
    gc_grace_s = 3600.0  # a blob just uploaded by a writer whose lease were misjudged survives
    can_repair = False

    def __init__(self, objects: ObjectBackend) -> None:
        url = objects.url
        self.url = self.location = url
        self.objects = objects
        self.leases = Leases(self.objects, url)
        self.cache = LocalStore(cache_root())  # a local store holding only blobs: same checks, same mmap
        self.cache.open(MARKER, marker_json(), create=True)
        self.mirror = cache_root() / "remotes" / quote(url.rstrip("/"), safe="")
        self.root = self.mirror  # local paths (version folders) of this repo live in its mirror
        self._unreachable = False
        if offline() and not self.mirror.exists():
            raise RemoteRepoError(f"MODULELENS_OFFLINE is set and the cache has nothing from {url}")

    def open(self, marker: str, initial: bytes, *, create: bool) -> bytes | None:
        """The marker as the mirror last read it when that is ``initial`` (this modulelens's newest
        layout: a marker only ever changes to a newer layout, so this one cannot have changed and
        opening a cached repo by its URL costs no request); otherwise read from the server."""
        if not self._online or self._mirrored(marker) == initial:
            return self._mirrored(marker)
        try:
            data = self.objects.read(self.objects.key(marker), *read_limit(marker))
        except Exception as error:  # any failure to reach the server: fall back to the cache
            if not is_network_error(error) or not self.mirror.exists():
                raise
            self._went_unreachable(error)
            return self._mirrored(marker)
        if data is None:
            if not create:
                bucket = self.objects.missing_bucket()  # one more request, only on this failure
                if bucket is not None:
                    raise RemoteRepoError(f"the bucket of {self.url} ({bucket}) does not exist")
                raise CaptureNotFoundError(f"no modulelens repo at {self.url}")
            try:
                self.objects.make_base()  # an S3 bucket may need creating
                self.objects.create(self.objects.key(marker), initial)
            except OSError as error:
                raise RemoteRepoError(f"cannot create a modulelens repo at {self.url}: {error}") from None
            data = initial
        self.mirror.mkdir(parents=True, exist_ok=True)
        self._keep(marker, data)
        return data

    # ------------------------------------------------------------------------------ the server, the mirror

    @property
    def _online(self) -> bool:
        return not (offline() or self._unreachable)

    def _went_unreachable(self, error: BaseException) -> None:
        reason = str(error) if isinstance(error, RemoteRepoError) else f"{self.url} is unreachable ({error})"
        warnings.warn(f"modulelens: {reason}; using the local cache", ModulelensWarning, stacklevel=4)
        self._unreachable = True
        self._unreachable_reason = reason

    _unreachable_reason = ""

    def _require_online(self, what: str) -> None:
        if not self._online:
            why = self._unreachable_reason or f"{self.url} is offline (MODULELENS_OFFLINE)"
            raise RemoteRepoError(f"cannot {what}: {why}")

    def _mirrored(self, key: str) -> bytes | None:
        """The mirror's copy of ``key`` (kept after a read within its limit; a copy over the limit,
        kept when the limit was higher, is refused as the server's object would be)."""
        path = self.mirror / key
        try:
            size = path.stat().st_size
            limit, hint = read_limit(key)
            if size > limit:
                raise too_large(self.where(key), size, limit, hint)
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _keep(self, key: str, data: bytes) -> None:
        target = self.mirror / key
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}-{uuid.uuid4().hex}")
        tmp.write_bytes(data)
        os.replace(tmp, target)

    def _forget(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            (self.mirror / key).unlink()

    # ------------------------------------------------------------------------------ files by key

    def read(self, key: str, *, immutable: bool = False) -> bytes | None:
        if immutable and (kept := self._mirrored(key)) is not None:
            return kept  # never stale: the key never changes
        if self._online:
            try:
                data = self.objects.read(self.objects.key(key), *read_limit(key))
            except Exception as error:
                if not is_network_error(error):
                    raise
                self._went_unreachable(error)
            else:
                if data is None:
                    self._forget(key)
                else:
                    self._keep(key, data)  # for offline use: the last value read
                return data
        kept = self._mirrored(key)
        if kept is None:
            raise CaptureNotFoundError(f"{self.where(key)} is not in the cache and {self.url} is offline")
        return kept

    def read_many(self, keys: Collection[str], *, immutable: bool = False) -> dict[str, bytes]:
        found = {}
        if immutable:
            for key in keys:
                with contextlib.suppress(CorruptCaptureError):  # a copy over its limit: left out
                    if (data := self._mirrored(key)) is not None:
                        found[key] = data
        missing = [k for k in keys if k not in found]
        if missing and self._online:
            try:
                fetched = self.objects.read_many([self.objects.key(k) for k in missing], read_limit)
            except Exception as error:
                if not is_network_error(error):
                    raise
                self._went_unreachable(error)
            else:
                for full, data in fetched.items():
                    key = self.objects.relative(full)
                    found[key] = data
                    if immutable:
                        self._keep(key, data)
        return found

    def write(self, key: str, data: bytes, *, durable: bool = True) -> None:
        self._require_online(f"write {key}")
        self.objects.put(self.objects.key(key), data)  # a finished PUT is durable
        if (self.mirror / key).exists():
            self._keep(key, data)

    def read_tagged(self, key: str) -> tuple[bytes | None, str | None]:
        self._require_online(f"read {key} for a change")
        return self.objects.read_tagged(self.objects.key(key), *read_limit(key))

    def swap(self, key: str, data: bytes, tag: str | None, *, durable: bool = True) -> str | None:
        self._require_online(f"write {key}")
        new_tag = self.objects.replace(self.objects.key(key), data, tag)
        if new_tag is not None:
            self._keep(key, data)
        return new_tag

    def exists(self, key: str) -> bool:
        """From the mirror for a cached immutable key (a capture.json), else one HEAD."""
        if (self.mirror / key).is_file() and key.endswith("/" + CAPTURE_FILE):
            return True
        self._require_online(f"look for {key}")
        return self.objects.exists(self.objects.key(key))

    def remove(self, key: str) -> bool:
        self._require_online(f"remove {key}")
        full = self.objects.key(key)
        if not self.objects.exists(full):
            return False
        self.objects.delete([full])
        self._forget(key)
        return True

    def files(self, prefix: str) -> list[str]:
        if self._online:
            try:
                return sorted(name for name, kind in self.objects.ls(prefix).items() if kind != "directory")
            except Exception as error:
                if not is_network_error(error):
                    raise
                self._went_unreachable(error)
        return []  # offline: nothing beyond what is cached is listed

    def local_path(self, key: str) -> Path:
        if self._mirrored(key) is None and self.read(key, immutable=True) is None:
            raise FileNotFoundError(f"{self.where(key)} does not exist")
        return self.mirror / key

    # ------------------------------------------------------------------------------ names, versions

    def names(self) -> list[str]:
        if self._online:
            try:
                return self.objects.folders_holding("names", SUMMARY_FILE, "versions")
            except Exception as error:
                if not is_network_error(error):
                    raise
                self._went_unreachable(error)
        base = self.mirror / "names"
        return [p.name for p in base.iterdir() if (p / INDEX).exists() or (p / SUMMARY_FILE).exists()] \
            if base.is_dir() else []

    def scan(self, prefix: str, *, aliases: bool = True) -> Scan:
        """One LIST of the name's prefix (its aliases then read together); offline, the last
        listing, kept in the mirror's ``index.json``."""
        index = self.mirror / prefix / INDEX
        listing = None
        if self._online:
            try:
                listing = self._list(prefix)
            except Exception as error:
                if not is_network_error(error):
                    raise
                self._went_unreachable(error)
            else:
                index.parent.mkdir(parents=True, exist_ok=True)
                tmp = index.with_name(f".index-{uuid.uuid4().hex}")
                tmp.write_text(json.dumps(listing))
                os.replace(tmp, index)
        if listing is None:
            try:
                listing = json.loads(index.read_text())
            except (OSError, ValueError):
                listing = {"versions": [], "used": 0, "aliases": {}}
        return Scan(dict.fromkeys(listing["versions"]), listing["used"], dict(listing["aliases"]) if aliases else {})

    def _list(self, prefix: str) -> dict[str, Any]:
        objects = self.objects.list(prefix)
        visible, used, alias_keys = set(), 0, {}
        for key in objects:
            parts = key.split("/")
            if len(parts) >= 5 and parts[2] == "versions" and is_version_number(parts[3]):
                used = max(used, int(parts[3]))
                if parts[4] == CAPTURE_FILE and len(parts) == 5:
                    visible.add(int(parts[3]))
            elif len(parts) == 4 and parts[2] == "aliases":
                alias_keys[parts[3]] = self.objects.key(key)
        removed = {int(k.split("/")[3]) for k in objects if k.endswith("/" + REMOVED) and is_version_number(k.split("/")[3])}
        contents = self.objects.read_many(list(alias_keys.values()), read_limit)
        aliases = {}
        for alias, key in sorted(alias_keys.items()):
            with contextlib.suppress(KeyError, ValueError):
                aliases[alias] = int(contents[key].decode().strip())
        return {"versions": sorted(visible - removed), "used": used, "aliases": aliases}

    def publish(self, prefix: str, files: Mapping[str, bytes], *, folders: Collection[str] = (),
                unused: bool = False) -> bool:
        """The last file is written with a conditional create: the server lets one of several
        racing writers have ``prefix``; the others move on. A removed folder's tombstone is looked
        for first (unless the caller knows the number was never ``used``), so only a removal between
        that look and the create can let a number be reused."""
        self._require_online(f"save {prefix}")
        if not unused and self.objects.exists(self.objects.key(prefix, REMOVED)):
            return False  # once used (a saver that listed before it was removed): the next number
        items = list(files.items())
        for filename, data in items[:-1]:
            self.objects.put(self.objects.key(prefix, filename), data)
        filename, data = items[-1]
        if not self.objects.create(self.objects.key(prefix, filename), data):
            return False
        for filename, data in items:  # immutable from now on: cached
            self._keep(f"{prefix}/{filename}", data)
        return True

    def retire(self, prefix: str) -> bool:
        """A tombstone first (the number is never reused), then everything under ``prefix``."""
        self._require_online(f"remove {prefix}")
        tombstone = f"{prefix}/{REMOVED}"
        self.objects.put(self.objects.key(tombstone), b"")
        self.objects.delete([self.objects.key(k) for k in sorted(self.objects.list(prefix)) if k != tombstone])
        shutil.rmtree(self.mirror / prefix, ignore_errors=True)
        return True

    # ------------------------------------------------------------------------------ blobs

    def _blob_key(self, digest: str) -> str:
        return self.objects.key(blob_key(digest))

    def blob_path(self, digest: str) -> Path:
        """Where the payload is (or will be) in the local cache."""
        return self.cache.blob_path(digest)

    def has_blob(self, digest: str) -> bool:
        return self.objects.exists(self._blob_key(digest))

    def write_blob(self, digest: str, data: memoryview | bytes | bytearray, *, chunks: ChunkDigests | None = None) -> bool:
        self._require_online("save")
        key = self._blob_key(digest)
        # A small payload is simply written again (same bytes): one request instead of a HEAD
        # and a PUT, which halves the round trips of a typical save.
        if len(data) > _SMALL_BLOB and self.objects.exists(key):
            return False
        self.objects.upload_bytes(memoryview(data).cast("B"), key)
        return True

    # A save's pipeline: nothing to stage locally (Store.stage_blob); "publishing" a payload is its
    # upload, which then overlaps with hashing the next one. A finished PUT is durable.
    def publish_blob(self, staged: Staged, digest: str, chunks: ChunkDigests | None, *, flush: bool = True) -> None:
        self.objects.upload_bytes(staged.view, self._blob_key(digest))

    def blob_writer(self, nbytes: int) -> BlobWriter:
        """Streamed into the local cache's staging area: :meth:`adopt_file` uploads it at the save
        (in multipart parts, as any file) and keeps it as the cached copy."""
        return self.cache.blob_writer(nbytes)

    def adopt_file(self, path: Path, digest: str, chunks: ChunkDigests | None, *, flush: bool = True) -> bool:
        """Upload a file sealed by :meth:`blob_writer` (hashed as it was written), unless the blob is
        there already, then move it into the cache as the blob's local copy; ``False`` for any other
        file (then :meth:`put_blob_file` hashes it as it uploads it)."""
        if path.parent != self.cache.root / "tmp" or not path.name.startswith(f"{os.getpid()}-"):
            return False
        self._require_online("save")
        key = self._blob_key(digest)
        if not self.objects.exists(key):
            self.objects.upload_file(path, key)
        if not self.cache.adopt_file(path, digest, chunks, flush=False):  # (the cache's tmp/ replaced meanwhile)
            path.unlink(missing_ok=True)
        return True

    def put_blob_file(self, digest: str, source: Path, *, verified: bool = False, missing: bool = False) -> int:
        key = self._blob_key(digest)
        if not missing and self.objects.exists(key):
            return 0
        # every byte uploaded is hashed first (the source is a local file), unless it is this
        # process's own staging file, hashed as it was written (``verified``: Store.put_blob_file)
        actual = digest if verified else hash_file(source)
        if actual != digest:
            raise CorruptCaptureError(f"{source} does not hash to {digest} (its content hashes to {actual}); "
                                      "nothing was uploaded")
        self.objects.upload_file(source, key)
        return os.path.getsize(source)

    def blob_file(self, digest: str, nbytes: int, *, full: bool = False, pack: bool = False) -> Path:
        """The payload in the local cache, downloaded first if needed, then checked like a local
        blob (size always, hash when new or changed)."""
        if not self.cache.blob_path(digest).exists():
            self._download(digest, nbytes)
        return self.cache.blob_file(digest, nbytes, full=full, pack=pack)

    def read_ahead(self, blobs: Mapping[str, int]) -> None:
        self.cache.read_ahead(blobs)  # those already in the cache; a download reads the rest anyway

    def fetch_blobs(self, wanted: Callable[[], Mapping[str, int]], *, label: str = "") -> int:
        """Download what the cache lacks, 8 at a time, with a progress bar on a terminal."""
        missing = {d: n for d, n in wanted().items() if not self.cache.blob_path(d).exists()}
        if not missing:
            return 0
        if not self._online:
            raise RemoteRepoError(f"{len(missing)} payload(s) of {label or self.url} are not in the cache "
                                  f"({cache_root()}) and {self.url} is offline")
        with _progress(sum(missing.values()), f"downloading {label}") as advance, \
                ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="modulelens-get") as pool:
            futures = [pool.submit(self._download, d, n, advance) for d, n in missing.items()]
            return sum(f.result() for f in futures)

    def _download(self, digest: str, nbytes: int, advance: Callable[[int], None] | None = None) -> int:
        """One payload into the cache: appended to ``tmp/<hash>.part`` (so an interrupted download
        resumes where it stopped), hash-checked, then renamed into place."""
        target = self.cache.blob_path(digest)
        if not self._online:
            raise RemoteRepoError(f"payload {digest} is not in the cache ({cache_root()}) and {self.url} is offline")
        part = self.cache.partial_path(digest)
        with open(part, "ab") as handle:
            _lock_while_it_grows(handle.fileno(), part)  # another process may be fetching it too
            if target.exists():
                return 0
            offset = handle.seek(0, os.SEEK_END)
            if offset > nbytes:
                handle.truncate(0)
                offset = handle.seek(0)
            resumed_at = offset
            key = self._blob_key(digest)
            while offset < nbytes:
                chunk = self.objects.read_range(key, offset, min(offset + _CHUNK, nbytes))
                if not chunk:
                    raise CorruptCaptureError(f"{key} ended at {offset} bytes, expected {nbytes}")
                handle.write(chunk)
                handle.flush()
                offset += len(chunk)
                if advance is not None:
                    advance(len(chunk))
            self.cache.adopt_blob(digest, part, nbytes)
        return nbytes - resumed_at

    def blobs(self) -> dict[str, BlobStat]:
        self._require_online("list blobs")
        return {key.rsplit("/", 1)[1]: BlobStat(key, info.size, info.mtime) for key, info in self.objects.list("blobs").items()}

    def remove_blobs(self, keys: Collection[str]) -> None:
        self._require_online("delete blobs")
        self.objects.delete([self.objects.key(k) for k in keys])

    # ------------------------------------------------------------------------------ locks, upkeep

    def writing(self) -> contextlib.AbstractContextManager[Hold]:
        self._require_online("write")
        return self.leases.writer()

    def exclusive(self, wait_s: float = 600.0) -> contextlib.AbstractContextManager[float]:
        self._require_online("gc")
        return self.leases.gc(wait_s)


@contextlib.contextmanager
def _progress(total: int, label: str) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on a terminal for transfers over 64 MiB; otherwise nothing is printed."""
    if total < (64 << 20) or not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda n: progress.advance(task, n)


def _lock_while_it_grows(fd: int, part: Path) -> None:
    """Take the lock of the download ``part`` (open as ``fd``). Another process fetching the same
    payload holds it for as long as its download takes, which no fixed deadline fits; so wait while
    the file grows, and give up with a one-line error naming the holder once it has not grown for
    ``MODULELENS_LOCK_WAIT_S`` seconds (a stuck or stopped fetcher, or a reader holding the lock,
    would otherwise hang every load of this payload with no message: issue 35)."""
    stalled_after = lock_wait_s()
    size, grew_at = -1, time.monotonic()
    while not wait_for(fd, exclusive=True, deadline=time.monotonic() + min(1.0, stalled_after)):
        now, current = time.monotonic(), os.fstat(fd).st_size
        if current != size:
            size, grew_at = current, now
        elif now - grew_at >= stalled_after:
            raise busy(str(part), fd, now - grew_at, "downloading a payload into the cache (it stopped growing)")
