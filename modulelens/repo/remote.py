"""A repo at an fsspec URL (``s3://bucket/prefix``, ``memory://name``, ...) with a local cache.

The layout is the local repo's (docs/repo-layout.md); what differs is how a change becomes
visible, because object stores have no rename and no lock:

* a version is its ``capture.json``: payloads are uploaded first, then ``versions/<N>/capture.json``
  is created with a conditional write (``If-None-Match: *``). Of two savers racing for ``N`` the
  server lets exactly one create it; the other takes ``N+1``.
* an alias moves with compare-and-swap (``If-Match`` on the ETag read).
* saves hold a lease object under ``locks/`` and ``gc`` holds ``locks/gc``; each writes its own
  object before looking for the other's, so at least one of two racing parties sees the other
  (S3 is strongly consistent), and gc only deletes unreferenced blobs older than a grace period.

Reads go through a content-addressed cache (``$MODULELENS_CACHE``, default
``~/.cache/modulelens/cache``): payloads are downloaded once, hash-checked and memory-mapped from
there; ``capture.json`` files (immutable) and the last listing of each name are kept too, so
``MODULELENS_OFFLINE=1`` (or an unreachable server) works from the cache alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from modulelens.errors import (
    CaptureNotFoundError,
    CorruptCaptureError,
    InvalidNameError,
    ModulelensWarning,
    RemoteRepoError,
    RepoBusyError,
)
from modulelens.repo._store import ObjectStore, is_network_error
from modulelens.repo.index import summarize, version_entry
from modulelens.repo.local import _MARKER, CAPTURE_FILE, LAYOUT_VERSION, GcReport, Repo, VersionInfo, capture_json
from modulelens.repo.markers import MARK_MIN_BYTES, ChunkDigests, write_marker
from modulelens.repo.names import LATEST, Ref, parse_ref, validate_alias, validate_name, validate_report_file
from modulelens.repo.packs import referenced_blobs

_REMOVED = "removed"  # tombstone key in versions/<N>/: the number stays used after `rm`
# A lease (or gc lock) is rewritten every TTL/4 s while its holder runs, so one not rewritten for
# a TTL belongs to a process that died: gc waits at most this long for a crashed saver.
_LEASE_TTL_S = 120.0
_CHUNK = 16 << 20  # download granularity (resume point, progress step)
_WORKERS = 8
_SMALL_BLOB = 256 << 10


def cache_root() -> Path:
    """``$MODULELENS_CACHE``, else ``$XDG_CACHE_HOME/modulelens/cache`` (``~/.cache/...``)."""
    env = os.environ.get("MODULELENS_CACHE")
    if env:
        return Path(env).expanduser().absolute()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "modulelens" / "cache"


def lease_ttl() -> float:
    """Seconds after its last renewal that a lease counts as left by a crashed process
    (``MODULELENS_LEASE_TTL_S``, default 120; every party of one repo must use the same value)."""
    try:
        return max(1.0, float(os.environ.get("MODULELENS_LEASE_TTL_S", _LEASE_TTL_S)))
    except ValueError:
        return _LEASE_TTL_S


def offline() -> bool:
    """``MODULELENS_OFFLINE=1``: never contact a remote repo; read from the cache only."""
    return os.environ.get("MODULELENS_OFFLINE", "") not in ("", "0", "false", "no")


class RemoteRepo(Repo):
    """A repo in object storage. ``Repo("s3://...")`` returns one; see the module docstring.

    Args:
        path: the fsspec URL.
        create: create the repo (its marker object) when there is none.
        storage_options: fsspec options (endpoint, credentials) for URLs that need them.
        trust_source: run the source stored with its captures by default (docs/security.md). Off
            unless given: a shared store holds captures written by other people, and the setting
            is never persisted for a remote repo (it lives only in this object).

    Raises:
        CaptureNotFoundError: ``create=False`` and there is no repo at the URL.
        RemoteRepoError: the server cannot be reached and the cache has nothing for it.

    Example::

        repo = modulelens.Repo("s3://team-bucket/captures")
        cap = modulelens.load("ranker/top_mlp:golden", repo=repo)   # downloads into the cache once
    """

    is_remote = True

    def __init__(self, path: str | os.PathLike[str] | None = None, *, create: bool = True,
                 storage_options: dict[str, Any] | None = None, trust_source: bool = False) -> None:
        from modulelens.repo.local import default_repo_location

        self.url = str(path) if path is not None else default_repo_location()
        self._trust_source = trust_source
        self.store = ObjectStore(self.url, storage_options)
        self.cache = Repo(cache_root())  # a local repo holding only blobs: same checks, same mmap
        self.mirror = cache_root() / "remotes" / quote(self.url.rstrip("/"), safe="")
        self.root = self.mirror  # local paths (version folders) of this repo live in its mirror
        if offline():
            if not self.mirror.exists():
                raise RemoteRepoError(f"MODULELENS_OFFLINE is set and the cache has nothing from {self.url}")
            return
        self._open_marker(create)

    def _open_marker(self, create: bool) -> None:
        try:
            data = self.store.read(self.store.key(_MARKER))
        except Exception as error:  # any failure to reach the server: fall back to the cache
            if not is_network_error(error) or not self.mirror.exists():
                raise
            warnings.warn(f"modulelens: {self.url} unreachable ({error}); using the local cache", ModulelensWarning,
                          stacklevel=3)
            self._unreachable = True
            return
        if data is None:
            if not create:
                raise CaptureNotFoundError(f"no modulelens repo at {self.url}")
            try:
                self.store.fs.makedirs(self.store.base, exist_ok=True)  # an S3 bucket may need creating
                self.store.create(self.store.key(_MARKER), json.dumps({"layout_version": LAYOUT_VERSION}).encode())
            except OSError as error:
                raise RemoteRepoError(f"cannot create a modulelens repo at {self.url}: {error}") from None
        else:
            try:
                layout = json.loads(data)["layout_version"]
            except (ValueError, KeyError) as error:
                raise CorruptCaptureError(f"{self.url}/{_MARKER}: unreadable repo marker ({error})") from None
            if layout > LAYOUT_VERSION:
                raise RemoteRepoError(f"repo {self.url} has layout {layout}; this modulelens reads up to {LAYOUT_VERSION}")
        self.mirror.mkdir(parents=True, exist_ok=True)

    _unreachable = False

    @property
    def _held_leases(self) -> threading.local:
        """The lease this thread holds, if any (see :meth:`_lease`)."""
        local = self.__dict__.get("_lease_local")
        if local is None:
            local = self.__dict__.setdefault("_lease_local", threading.local())
        return local

    def __repr__(self) -> str:
        return f"Repo({self.url!r})"

    def __fspath__(self) -> str:
        raise TypeError(f"{self.url} is not a local path")

    @property
    def trust_source(self) -> bool:
        """Whether loads run stored source by default: only if this object was made with
        ``trust_source=True`` (never from a file: the local cache is not where trust is decided)."""
        return self._trust_source

    @trust_source.setter
    def trust_source(self, value: bool) -> None:
        if value:
            raise RemoteRepoError(f"{self.url} cannot be marked trusted for later loads (a shared store holds other "
                                  "people's captures); pass trust_source=True (--trust-source) to one load instead")
        self._trust_source = False

    @property
    def location(self) -> str:
        return self.url

    @property
    def _online(self) -> bool:
        return not (offline() or self._unreachable)

    # ---------------------------------------------------------------------------------- blobs

    def _blob_key(self, digest: str) -> str:
        hexdigest = self.cache.blob_path(digest).name  # validates the digest
        return self.store.key("blobs", hexdigest[:2], hexdigest)

    def blob_path(self, digest: str) -> Path:
        """Where the payload is (or will be) in the local cache."""
        return self.cache.blob_path(digest)

    def has_blob(self, digest: str) -> bool:
        return self.store.exists(self._blob_key(digest))

    def write_blob(self, digest: str, data: memoryview | bytes, *, chunks: ChunkDigests | None = None) -> bool:
        key = self._blob_key(digest)
        # A small payload is simply written again (same bytes): one request instead of a HEAD
        # and a PUT, which halves the round trips of a typical save.
        if len(data) > _SMALL_BLOB and self.store.exists(key):
            return False
        self.store.upload_bytes(memoryview(data).cast("B"), key)
        return True

    # A save's pipeline (Repo._write_payloads): nothing to stage locally; "publishing" a payload is
    # its upload, which then overlaps with hashing the next one. Object stores make a finished PUT
    # durable themselves.
    def _stage_blob(self, data: memoryview | bytes) -> tuple[Path | None, memoryview]:
        return None, memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)

    def _publish_blob(self, staged: tuple[Path | None, memoryview], digest: str, chunks: ChunkDigests | None,
                      *, flush_folder_now: bool = True) -> Path | None:
        self.store.upload_bytes(staged[1], self._blob_key(digest))
        return None

    def put_blob_file(self, digest: str, source: Path, *, verified: bool = False) -> int:
        key = self._blob_key(digest)
        if self.store.exists(key):
            return 0
        self.store.upload_file(source, key)
        return os.path.getsize(source)

    def check_blob(self, digest: str, nbytes: int, *, full: bool = False) -> Path:
        """Local path of a payload, downloaded into the cache first if needed, then checked like a
        local blob (size always, hash when new or changed)."""
        if not self.cache.blob_path(digest).exists():
            self._download(digest, nbytes)
        return self.cache.check_blob(digest, nbytes, full=full)

    def fetch_version(self, name: str, version: int) -> None:
        """Download every payload of a version that the cache lacks, in parallel, with a progress
        bar on a terminal."""
        self.download(referenced_blobs(self.read_metadata(name, version)), label=f"{name}:v{version}")

    def download(self, blobs: dict[str, int], *, label: str = "") -> int:
        """Fetch ``{digest: nbytes}`` into the cache (only missing ones); returns bytes downloaded."""
        missing = {d: n for d, n in blobs.items() if not self.cache.blob_path(d).exists()}
        if not missing:
            return 0
        if not self._online:
            raise RemoteRepoError(f"{len(missing)} payload(s) of {label or self.url} are not in the cache "
                                  f"({cache_root()}) and {self.url} is offline")
        with _progress(sum(missing.values()), f"downloading {label}") as advance, \
                ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="modulelens-get") as pool:
            futures = [pool.submit(self._download, d, n, advance) for d, n in missing.items()]
            return sum(f.result() for f in futures)

    def _download(self, digest: str, nbytes: int, advance: Any = None) -> int:
        """One payload into the cache: appended to ``tmp/<hash>.part`` (so an interrupted download
        resumes where it stopped), hash-checked, then renamed into place."""
        target = self.cache.blob_path(digest)
        if not self._online:
            raise RemoteRepoError(f"payload {digest} is not in the cache ({cache_root()}) and {self.url} is offline")
        part = self.cache.root / "tmp" / f"{target.name}.part"
        part.parent.mkdir(exist_ok=True)
        with open(part, "ab") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # another process may be fetching it too
            if target.exists():
                return 0
            offset = handle.seek(0, os.SEEK_END)
            if offset > nbytes:
                handle.truncate(0)
                offset = handle.seek(0)
            resumed_at = offset
            key = self._blob_key(digest)
            while offset < nbytes:
                chunk = self.store.read_range(key, offset, min(offset + _CHUNK, nbytes))
                if not chunk:
                    raise CorruptCaptureError(f"{key} ended at {offset} bytes, expected {nbytes}")
                handle.write(chunk)
                handle.flush()
                offset += len(chunk)
                if advance is not None:
                    advance(len(chunk))
            actual = Repo._hash_file(part, nbytes)
            if actual != digest:
                part.unlink()
                raise CorruptCaptureError(f"payload {key} is corrupted: its content hashes to {actual}")
            os.chmod(part, 0o444)
            target.parent.mkdir(exist_ok=True)
            os.replace(part, target)
        if nbytes >= MARK_MIN_BYTES:
            write_marker(target)
        return nbytes - resumed_at

    # ---------------------------------------------------------------------------------- names

    def _name_key(self, name: str) -> str:
        return "names/" + quote(validate_name(name), safe="")

    def _mirror_dir(self, name: str) -> Path:
        return self.mirror / self._name_key(name)

    def _version_dir(self, name: str, version: int) -> Path:
        return self._mirror_dir(name) / "versions" / str(version)

    def _listing(self, name: str) -> dict[str, Any]:
        """``{"versions": [visible], "used": max number ever used, "aliases": {alias: key}}`` from
        one LIST of the name's prefix; offline, the last listing saved in the cache."""
        index = self._mirror_dir(name) / "index.json"
        if self._online:
            try:
                return self._list_remote(name, index)
            except Exception as error:
                if not is_network_error(error):
                    raise
                warnings.warn(f"modulelens: {self.url} unreachable ({error}); using the local cache", ModulelensWarning,
                          stacklevel=3)
                self._unreachable = True
        try:
            return json.loads(index.read_text())
        except (OSError, ValueError):
            return {"versions": [], "used": 0, "aliases": {}}

    def _list_remote(self, name: str, index: Path) -> dict[str, Any]:
        objects = self.store.list(self._name_key(name))
        visible, used, alias_keys = set(), 0, {}
        for key in objects:
            parts = key.split("/")
            if len(parts) >= 5 and parts[2] == "versions" and parts[3].isdigit():
                used = max(used, int(parts[3]))
                if parts[4] == CAPTURE_FILE and len(parts) == 5:
                    visible.add(int(parts[3]))
            elif len(parts) == 4 and parts[2] == "aliases":
                alias_keys[parts[3]] = self.store.key(key)
        removed = {int(k.split("/")[3]) for k in objects if k.endswith("/" + _REMOVED)}
        contents = self.store.read_many(list(alias_keys.values()))
        aliases = {}
        for alias, key in alias_keys.items():
            with contextlib.suppress(KeyError, ValueError):
                aliases[alias] = int(contents[key].decode().strip())
        listing = {"versions": sorted(visible - removed), "used": used, "aliases": aliases}
        self._write_index(index, listing)
        return listing

    def names(self) -> list[str]:
        if self._online:
            try:
                keys = self.store.list("names")
            except Exception as error:
                if not is_network_error(error):
                    raise
                self._unreachable = True
            else:
                found = {k.split("/")[1] for k in keys if k.endswith("/" + CAPTURE_FILE)}
                return sorted(n for n in (unquote(q) for q in found) if self._is_valid_name(n)
                              and self.version_numbers(n))
        base = self.mirror / "names"
        if not base.exists():
            return []
        return sorted(unquote(p.name) for p in base.iterdir() if (p / "index.json").exists()
                      and self._is_valid_name(unquote(p.name)) and self.version_numbers(unquote(p.name)))

    @staticmethod
    def _is_valid_name(name: str) -> bool:
        try:
            validate_name(name)
        except InvalidNameError:
            return False
        return True

    def version_numbers(self, name: str) -> list[int]:
        return list(self._listing(name)["versions"])

    def aliases(self, name: str) -> dict[str, int]:
        return dict(self._listing(name)["aliases"])

    def _summary(self, name: str, fresh: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
        """No index is kept in object storage: built from one listing and the manifests (each
        downloaded once into the local mirror; versions are immutable)."""
        listing = self._listing(name)
        return summarize(listing["versions"], listing["aliases"], lambda v: self.read_metadata(name, v))

    def info(self, name: str, version: int) -> VersionInfo:
        listing = self._listing(name)  # one LIST for both the aliases and the latest version
        if version not in listing["versions"]:
            raise CaptureNotFoundError(f"{name}:v{version} does not exist in {self.url}")
        summary = {"versions": {str(v): version_entry(self.read_metadata(name, v)) if v == version else None
                                for v in listing["versions"]}, "aliases": listing["aliases"]}
        return self._infos(name, summary, [version])[0]

    def _name_summaries(self, *, persist: bool = False) -> Iterator[tuple[str, str | None, dict[str, Any]]]:
        """``(name, None, summary)`` of every name (``Repo.list`` walks these)."""
        for name in self.names():
            yield name, None, self._summary(name)

    def resolve(self, ref: str | Ref) -> tuple[str, int]:
        """As for a local repo; an explicit ``name:vN`` whose manifest is cached needs no request
        (versions are immutable), an alias one GET, and ``latest`` one LIST (it may have changed)."""
        parsed = parse_ref(ref) if isinstance(ref, str) else ref
        if parsed.version is not None and (self._version_dir(parsed.name, parsed.version) / CAPTURE_FILE).exists():
            return parsed.name, parsed.version
        if parsed.version is None and parsed.selector not in (None, LATEST) and self._online:
            found = self._read_alias(parsed.name, parsed.selector)
            if found is not None:
                return parsed.name, found
        return super().resolve(parsed)

    def _read_alias(self, name: str, alias: str) -> int | None:
        """An alias with one GET of its object instead of a LIST of the name and a GET (what the
        listing needs); ``None`` when it cannot say (no such alias, unreadable, server
        unreachable), and the caller falls back to the listing, which also gives the error.
        ``rm`` deletes the aliases of a version it removes, so an alias names a visible version
        (except while such an ``rm`` runs). The cached listing learns it, for offline use."""
        try:
            data = self.store.read(self.store.key(self._name_key(name), "aliases", validate_alias(alias)))
            version = int(data.decode().strip()) if data is not None else None
        except (ValueError, InvalidNameError):
            return None
        except Exception as error:
            if not is_network_error(error):
                raise
            return None
        if version is None:
            return None
        index = self._mirror_dir(name) / "index.json"
        try:
            listing = json.loads(index.read_text())
        except (OSError, ValueError):
            listing = {"versions": [], "used": 0, "aliases": {}}
        if listing["aliases"].get(alias) != version or version not in listing["versions"]:
            listing["aliases"][alias] = version
            listing["versions"] = sorted({*listing["versions"], version})
            listing["used"] = max(listing["used"], version)
            self._write_index(index, listing)
        return version

    @staticmethod
    def _write_index(index: Path, listing: dict[str, Any]) -> None:
        index.parent.mkdir(parents=True, exist_ok=True)
        tmp = index.with_name(f".index-{uuid.uuid4().hex}")
        tmp.write_text(json.dumps(listing))
        os.replace(tmp, index)

    def version_path(self, name: str, version: int) -> Path:
        """The version's folder in the local mirror (its ``capture.json``, once read)."""
        self.read_metadata(name, version)
        return self._version_dir(name, version)

    def read_metadata(self, name: str, version: int) -> dict[str, Any]:
        cached = self._version_dir(name, version) / CAPTURE_FILE
        if cached.exists():  # versions are immutable, so a cached copy never goes stale
            text = cached.read_text()
        else:
            if not self._online:
                raise CaptureNotFoundError(f"{name}:v{version} is not in the cache and {self.url} is offline")
            data = self.store.read(self.store.key(self._name_key(name), "versions", str(version), CAPTURE_FILE))
            if data is None:
                raise CaptureNotFoundError(f"{name}:v{version} does not exist in {self.url}")
            text = data.decode()
            self._cache_manifest(name, version, text)
        try:
            meta = json.loads(text)
        except ValueError as error:
            raise CorruptCaptureError(f"{self.url} {name}:v{version}: capture.json is not valid JSON: {error}") from None
        if not isinstance(meta, dict) or "format_version" not in meta:
            raise CorruptCaptureError(f"{self.url} {name}:v{version}: not a modulelens capture")
        return meta

    def _cache_manifest(self, name: str, version: int, text: str) -> None:
        cached = self._version_dir(name, version) / CAPTURE_FILE
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{CAPTURE_FILE}-{uuid.uuid4().hex}")
        tmp.write_text(text)
        os.replace(tmp, cached)

    # ---------------------------------------------------------------------------------- writes

    def _require_online(self, what: str) -> None:
        if not self._online:
            raise RemoteRepoError(f"cannot {what}: {self.url} is offline")

    def save_version(self, name: str, metadata: dict[str, Any], payloads: dict[str, memoryview]) -> VersionInfo:
        validate_name(name)
        self._require_online(f"save {name}")
        while True:
            with self._lease() as lease:
                self._store_payloads(metadata, payloads)
                if not lease.lapsed:
                    return self._commit(name, metadata)
                _renewable(lease, self.url)
            # The lease went unrenewed for half its TTL (a stalled process, a slow server): a gc
            # may have run and removed a blob this save found present. Take a new lease and check
            # again (blobs already there are skipped).

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """A lease for the whole of a push's copy (blobs, then the commit), so that gc waits for it
        instead of collecting its blobs before they are referenced (see :meth:`Repo.writing`)."""
        self._require_online("write")
        with self._lease():
            yield

    def commit_version(self, name: str, metadata: dict[str, Any]) -> VersionInfo:
        validate_name(name)
        self._require_online(f"save {name}")
        while True:
            with self._lease() as lease:
                for digest in referenced_blobs(metadata):
                    if not self.has_blob(digest):
                        raise CorruptCaptureError(f"payload {digest} is missing from {self.url}")
                if not lease.lapsed:  # else a gc may have run meanwhile: check again (see save_version)
                    return self._commit(name, metadata)
                _renewable(lease, self.url)

    def _commit(self, name: str, metadata: dict[str, Any]) -> VersionInfo:
        """Create ``versions/<N>/capture.json`` with a conditional write; the server lets one of
        several racing savers have ``N``, the others move on to ``N+1``."""
        version = self._listing(name)["used"] + 1
        for _attempt in range(10_000):
            metadata["version"] = version
            metadata["name"] = name
            key = self.store.key(self._name_key(name), "versions", str(version), CAPTURE_FILE)
            data = capture_json(metadata)
            if self.store.create(key, data):
                self._cache_manifest(name, version, data.decode())
                return self.info(name, version)
            version += 1
        raise RemoteRepoError(f"could not allocate a version for {name!r} in {self.url}")

    def set_alias(self, ref: str, alias: str) -> VersionInfo:
        """Point ``alias`` at the version ``ref`` resolves to, with compare-and-swap: if another
        writer moved the alias between our read and our write, nothing is written and this raises.

        Raises:
            RepoBusyError: the alias changed concurrently (run again to move it anyway).
        """
        validate_alias(alias)
        if alias == LATEST:
            raise InvalidNameError("'latest' is maintained automatically and cannot be set")
        self._require_online(f"set alias {alias}")
        name, version = self.resolve(ref)
        key = self.store.key(self._name_key(name), "aliases", alias)
        _, tag = self.store.read_tagged(key)
        if not self.store.replace(key, str(version).encode(), tag):
            raise RepoBusyError(f"alias {name}:{alias} was moved by another writer meanwhile; nothing changed")
        return self.info(name, version)

    def remove_alias(self, name: str, alias: str) -> None:
        self._require_online(f"remove alias {alias}")
        key = self.store.key(self._name_key(name), "aliases", validate_alias(alias))
        if not self.store.exists(key):
            raise CaptureNotFoundError(f"{name} has no alias {alias!r}")
        self.store.delete([key])

    def remove(self, ref: str) -> list[str]:
        """Remove versions: a tombstone first (the number is never reused), then the manifest (the
        version disappears), then its reports. Payloads stay until :meth:`gc`."""
        self._require_online(f"remove {ref}")
        parsed = parse_ref(ref)
        targets = self.version_numbers(parsed.name) if parsed.selector is None else [self.resolve(parsed)[1]]
        if not targets:
            raise CaptureNotFoundError(f"no capture named {parsed.name!r} in {self.url}")
        prefix = self._name_key(parsed.name)
        for version in targets:
            folder = f"{prefix}/versions/{version}"
            self.store.put(self.store.key(folder, _REMOVED), b"")
            self.store.delete([self.store.key(folder, CAPTURE_FILE)])
            self.store.delete([self.store.key(k) for k in self.store.list(f"{folder}/reports")])
        for alias, version in self.aliases(parsed.name).items():
            if version in targets:
                self.remove_alias(parsed.name, alias)
        return [f"{parsed.name}:v{v}" for v in targets]

    # ---------------------------------------------------------------------------------- reports

    def add_report(self, ref: str, kind: str, data: dict[str, Any]) -> str:  # type: ignore[override]
        name, version = self.resolve(ref)
        self._require_online("store a report")
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        key = self.store.key(self._name_key(name), "versions", str(version), "reports",
                             f"{kind}-{stamp}-{uuid.uuid4().hex[:8]}.json")
        self.store.put(key, json.dumps({"kind": kind, "created": stamp, **data}, indent=1, default=str).encode())
        return f"{self.store.protocol}://{key}"

    def put_report(self, name: str, version: int, filename: str, data: bytes) -> None:
        """Store a report file under its original name (push/pull)."""
        self.store.put(self.store.key(self._name_key(name), "versions", str(version), "reports",
                                      validate_report_file(filename)), data)

    def report_files(self, name: str, version: int) -> dict[str, bytes]:
        if not self._online:
            return {}
        prefix = f"{self._name_key(name)}/versions/{version}/reports"
        found = self.store.read_many([self.store.key(k) for k in self.store.list(prefix) if k.endswith(".json")])
        return {key.rsplit("/", 1)[1]: data for key, data in found.items()}

    def reports(self, ref: str, kind: str | None = None) -> list[dict[str, Any]]:
        name, version = self.resolve(ref)
        if not self._online:
            return []
        prefix = f"{self._name_key(name)}/versions/{version}/reports"
        keys = [self.store.key(k) for k in sorted(self.store.list(prefix))
                if k.endswith(".json") and (kind is None or k.rsplit("/", 1)[1].startswith(kind + "-"))]
        found = []
        for key, data in sorted(self.store.read_many(keys).items()):
            with contextlib.suppress(ValueError):
                found.append({"path": f"{self.store.protocol}://{key}", **json.loads(data)})
        return found

    # ---------------------------------------------------------------------------------- gc

    def gc(self, *, dry_run: bool = False, tmp_age_s: float = 3600.0, grace_s: float = 3600.0,
           wait_s: float = 600.0) -> GcReport:
        """Delete blobs no version references and older than ``grace_s`` (server time).

        gc holds ``locks/gc`` while it runs; saves hold leases and wait while gc runs, and gc waits
        for leases taken before it to end. ``tmp_age_s`` is accepted for the local signature (an
        object store has no staging area: nothing is visible before its single final write).

        Raises:
            RepoBusyError: another gc runs, or saves kept their leases longer than ``wait_s``.
        """
        self._require_online("gc")
        report = GcReport(dry_run=dry_run)
        with self._gc_lock(wait_s) as now:
            referenced = set()
            objects = self.store.list("names")
            manifests = [self.store.key(k) for k in objects if k.endswith("/" + CAPTURE_FILE)]
            for key, data in self.store.read_many(manifests).items():
                try:
                    meta = json.loads(data)
                except ValueError:
                    raise CorruptCaptureError(f"{key} is not valid JSON; gc stopped without deleting anything") from None
                referenced.update(digest.partition(":")[2] for digest in referenced_blobs(meta))
            doomed = []
            for key, info in self.store.list("blobs").items():
                hexdigest = key.rsplit("/", 1)[1]
                if hexdigest in referenced or self.store.mtime(info) > now - grace_s:
                    report.kept_blobs += 1
                    continue
                doomed.append(self.store.key(key))
                report.removed_blobs += 1
                report.freed_bytes += int(info.get("size", 0))
                report.removed.append(hexdigest)
            if not dry_run:
                self.store.delete(doomed)
        return report

    def _lock_time(self, key: str) -> float:
        """The server's clock, read as the modification time of an object we just wrote (so lock
        ages never depend on this machine's clock)."""
        info = self.store.info(key)
        return self.store.mtime(info) if info else time.time()

    @contextlib.contextmanager
    def _lease(self, wait_s: float = 600.0) -> Iterator[_Heartbeat]:
        """A save's lease: write ``locks/save-<id>``, then make sure no gc runs (else step back and
        wait). gc writes its lock before looking for leases, so one of the two always sees the other.
        The lease is rewritten every TTL/4 s until the save ends (see :class:`_Heartbeat`).
        Re-entrant per thread: a commit inside :meth:`writing` uses the lease already held (a
        second one would wait for a gc that itself waits for the first: a deadlock)."""
        held = getattr(self._held_leases, "current", None)
        if held is not None:
            held.outer = True
            yield held
            return
        key = self.store.key("locks", f"save-{uuid.uuid4().hex}")
        body = json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode()
        deadline = time.monotonic() + wait_s
        while True:
            self.store.put(key, body)
            gc_info = self.store.info(self.store.key("locks", "gc"))
            if gc_info is None or self.store.mtime(gc_info) < self._lock_time(key) - lease_ttl():
                break  # (the lease's own time is read only when there is a gc lock to compare)
            self.store.delete([key])
            if time.monotonic() > deadline:
                raise RepoBusyError(f"{self.url}: gc has been running for over {wait_s:.0f} s; try again later")
            time.sleep(0.2)
        heartbeat = _Heartbeat(self.store, key, body)
        self._held_leases.current = heartbeat
        try:
            yield heartbeat
        finally:
            self._held_leases.current = None
            heartbeat.stop()  # before the delete: a late renewal must not bring the lease back
            self.store.delete([key])

    @contextlib.contextmanager
    def _gc_lock(self, wait_s: float) -> Iterator[float]:
        """Hold ``locks/gc`` (renewed like a lease) and wait until no live lease is left; yields the
        server's time when gc started. A lease not renewed for a TTL is a crashed saver's."""
        key = self.store.key("locks", "gc")
        body = json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode()
        ttl = lease_ttl()
        if not self.store.create(key, body):
            info = self.store.info(key)
            probe = self.store.key("locks", f"probe-{uuid.uuid4().hex}")
            self.store.put(probe, b"")
            now = self._lock_time(probe)
            self.store.delete([probe])
            if info is not None and self.store.mtime(info) >= now - ttl:
                raise RepoBusyError(f"{self.url}: another gc is running (locks/gc); try again later")
            self.store.put(key, body)  # a crashed gc's lock
        heartbeat = _Heartbeat(self.store, key, body)
        try:
            start = self._lock_time(key)
            offset = start - time.time()  # the server's clock, as seen from here
            deadline = time.monotonic() + wait_s
            while True:
                now = time.time() + offset
                leases = {k: i for k, i in self.store.list("locks").items() if k.startswith("locks/save-")}
                if all(self.store.mtime(i) < now - ttl for i in leases.values()):
                    break
                if time.monotonic() > deadline:
                    raise RepoBusyError(f"{self.url}: saves still running after {wait_s:.0f} s; gc did nothing")
                time.sleep(0.2)
            yield start
        finally:
            heartbeat.stop()
            self.store.delete([key])


def _renewable(lease: _Heartbeat, url: str) -> None:
    """A lapsed lease is given up and taken anew, unless it is an outer one (:meth:`RemoteRepo.writing`)
    that this thread cannot give up here: then the write stops, with nothing committed."""
    if lease.outer:
        raise RemoteRepoError(f"{url}: the write lease went unrenewed (stalled process or server); a gc may "
                              "have run meanwhile, so nothing was committed; run the push again")


class _Heartbeat:
    """Rewrites a lock object every TTL/4 s from a thread, so that its age (by the server's clock)
    tells a live holder from a crashed one within one TTL.

    A holder that cannot renew (its process stalled, the server slow) finds out with
    :attr:`lapsed` and must re-check what a gc could have changed meanwhile before it commits.
    """

    def __init__(self, store: ObjectStore, key: str, body: bytes) -> None:
        self.store, self.key, self.body = store, key, body
        self.ttl = lease_ttl()
        self.renewed = time.monotonic()
        self.outer = False  # reused by a nested write (see _renewable)
        self._stop = threading.Event()
        # A daemon: it only renews, and stop() joins it; at exit an unrenewed lease just expires.
        self._thread = threading.Thread(target=self._run, name="modulelens-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                self.store.put(self.key, self.body)
            except Exception:  # a missed renewal shows as `lapsed`; the holder re-checks
                continue
            self.renewed = time.monotonic()

    @property
    def lapsed(self) -> bool:
        """Whether the lock went unrenewed for half its TTL (a gc may have taken it for dead)."""
        return time.monotonic() - self.renewed > self.ttl / 2

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def _progress(total: int, label: str) -> Iterator[Any]:
    """A rich progress bar on a terminal for transfers over 64 MiB; otherwise nothing is printed."""
    if total < (64 << 20) or not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda n: progress.advance(task, n)
