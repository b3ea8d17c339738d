"""What the pages read from a repo: listings, one capture's checked metadata and memory-mapped
payloads, its reports. Every read goes through the public ``Repo`` API (here and nowhere else in
the UI), and nothing here imports a class, function or module that a capture names: browsing a
capture someone sent you runs none of its code, exactly like ``modulelens show``
(docs/security.md). Replay and profile, which must rebuild the module, run only as actions
(``--allow-run``) in a child process (:mod:`.actions`).

Versions are immutable (a removed version's number is never reused), so what is read of one is
kept: a bounded cache of opened captures and of tensor summaries, and the capturing job's facts
(host, command, git commit) for the repo page, which the listing summaries do not carry; a
background thread reads those once per version, so a repo page never reads a capture file.

Background work (that read, the server's warm-up) waits for the pages: it runs only once no page
has been served for :data:`QUIET_S` (:meth:`RepoView.serving` marks a page in flight). Sharing the
interpreter with it, a fresh server's first view of a 50,000-call capture took 2.5-4.3 s at load 1.3
instead of about 1 s: the read parsed that capture's 45 MiB and the warm-up imported matplotlib
while the page was made (benchmarks/bench_ui.py --huge, "first view in a fresh server").
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from modulelens.errors import CorruptCaptureError, ModulelensError, RestoreError
from modulelens.interfaces import session
from modulelens.interfaces.ui.shown import as_text
from modulelens.repo.files import open_regular
from modulelens.repo.reports import VersionReports

if TYPE_CHECKING:
    import torch

    from modulelens.repo import Repo, VersionInfo, VersionNotes

_OPEN_CAPTURES = 16
_SUMMARIES = 4096
_QUERIES = 8  # searches and orders of the repo page kept per listing (each a list of references)
QUIET_S = 1.0  # background work starts once no page has been served for this long...
_QUIET_WAIT_S = 10.0  # ...or after waiting this long for it (a busy UI does not starve the job column)


class Listing:
    """Every version as the repo lists them at one :meth:`~modulelens.Repo.listing_stamp`, and what
    the repo page shows of all of them (the classes and tags to filter by, the number of names),
    worked out once per stamp: at 100,000 versions listing took 0.2-0.8 s and sorting as much again,
    while a page shows 500 rows."""

    def __init__(self, stamp: str, infos: list[VersionInfo]) -> None:
        from modulelens.interfaces.value_text import short_class

        self.stamp = stamp
        self.infos = infos
        self.classes = sorted({short_class(i.module_class) for i in infos if i.module_class})
        self.tags = sorted({t for i in infos for t in i.tags})
        self.names = len({i.name for i in infos})
        self._chosen: OrderedDict[tuple[Any, ...], list[VersionInfo]] = OrderedDict()
        self._lock = threading.Lock()

    def chosen(self, key: tuple[Any, ...], choose: Callable[[list[VersionInfo]], list[VersionInfo]]) -> list[VersionInfo]:
        """``choose(infos)`` (a search in its order) once per ``key`` while this listing is current."""
        with self._lock:
            found = self._chosen.get(key)
            if found is not None:
                self._chosen.move_to_end(key)
                return found
        found = choose(self.infos)
        with self._lock:
            self._chosen[key] = found
            while len(self._chosen) > _QUERIES:
                self._chosen.popitem(last=False)
        return found


class StoredCapture:
    """One stored version, read for display: checked metadata and memory-mapped tensors.

    Satisfies :class:`~modulelens.tools.recorded.RecordedTensors`, so the tables of
    :mod:`modulelens.interfaces.tensor_info` and the weight comparison of
    :func:`modulelens.tools.diff.tensor_changes` work on it without a module being rebuilt.
    """

    def __init__(self, repo: Repo, name: str, version: int) -> None:
        self.repo = repo
        self.name = name
        self.version = version
        # Everything but the calls is checked now; a call when a page uses it (:meth:`call`): a page
        # shows at most 20 of them, and checking all 50,000 of a long job's took 0.55 s of a first view.
        self.metadata: dict[str, Any]
        self.metadata, self._text = repo.read_capture(name, version, calls=False)
        self.info: VersionInfo = repo.info(name, version, metadata=self.metadata)
        self._payloads: Any = None
        self._tensors: dict[str, torch.Tensor] = {}
        self._checked_calls: set[int] = set()
        self._lock = threading.Lock()

    @property
    def ref(self) -> str:
        return f"{self.name}:v{self.version}"

    @property
    def text(self) -> bytes:
        """The bytes of ``capture.json`` :attr:`metadata` was parsed from."""
        return self._text

    @property
    def call_count(self) -> int:
        return len(self.metadata["calls"])

    def call(self, position: int) -> dict[str, Any]:
        """Recorded call ``position`` (0-based), checked against the format on first use.

        Raises:
            IndexError: no such call (callers check against :attr:`call_count`).
            CorruptCaptureError: the call's record is damaged (naming its field).
        """
        from modulelens.format.validate import validate_call

        found: dict[str, Any] = self.metadata["calls"][position]
        if position not in self._checked_calls:
            validate_call(self.metadata, position, self.ref)
            with self._lock:
                self._checked_calls.add(position)
        return found

    def tensor(self, tid: str) -> torch.Tensor:
        """Recorded tensor ``tid``, memory-mapped (a view of another one shares its mapping).

        Raises:
            RestoreError: the tensor was stored shape-only (it has no values).
            CorruptCaptureError: its payload is missing or damaged.
        """
        with self._lock:
            cached = self._tensors.get(tid)
            if cached is None:
                cached = self._tensors[tid] = self._open(tid)
            return cached

    def _open(self, tid: str) -> torch.Tensor:
        from modulelens.format.tensors import dtype_from_name

        entry = self.metadata["tensors"][tid]
        if entry.get("shape_only"):
            raise RestoreError(f"{self.ref}: tensor {tid} was stored shape-only (no values)")
        if "view_of" in entry:
            base = self._tensors.get(entry["view_of"])
            if base is None:
                base = self._tensors[entry["view_of"]] = self._open(entry["view_of"])
            return base.as_strided(entry["shape"], entry["stride"], entry["storage_offset"])
        if self._payloads is None:
            self.repo.fetch_version(self.name, self.version)  # a remote repo: into its cache once
            self._payloads = self.repo.payloads(self.metadata)
        return self._payloads.open_tensor(entry, dtype_from_name(entry["dtype"]))

    def sample(self, tid: str, limit: int) -> torch.Tensor:
        """Recorded tensor ``tid``'s values, or the runs of them that
        :func:`~modulelens.interfaces.tensor_info.sample_runs` picks when there are more than ``limit``.

        A big stored payload is read run by run with ``pread`` after telling the kernel the reads are
        random (``POSIX_FADV_RANDOM``): through the memory map, each page fault also read ahead up to
        the device's readahead window (8 MiB here), and 64 runs 1 MiB apart read the whole 64 MiB
        weight (benchmarks/bench_ui.py measured a 1 GiB page adding 1.2 GiB of mapped file). Views,
        strided and packed payloads (packs hold only payloads under 1 MiB) go through :meth:`tensor`.
        """
        import torch

        from modulelens.format.tensors import contiguous_strides, dtype_from_name
        from modulelens.interfaces.tensor_info import sample_runs, value_sample

        entry = self.metadata["tensors"][tid]
        numel = 1
        for size in entry["shape"]:
            numel *= size
        stride = entry.get("stride")
        loose = "payload" in entry and "pack" not in entry and "view_of" not in entry and not entry.get("shape_only")
        if numel <= limit or not loose or (stride is not None and stride != contiguous_strides(entry["shape"])):
            return value_sample(self.tensor(tid), limit)
        dtype = dtype_from_name(entry["dtype"])
        size = torch.empty((), dtype=dtype).element_size()
        if self._payloads is None:
            self.repo.fetch_version(self.name, self.version)
            self._payloads = self.repo.payloads(self.metadata)
        path = self.repo.check_blob(entry["payload"], entry["nbytes"])  # size and sampled hashes, as a load does
        fd = open_regular(path)
        try:
            with contextlib.suppress(AttributeError, OSError):  # not on every platform: then it only reads more
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            parts = [bytearray(os.pread(fd, length * size, start * size)) for start, length in sample_runs(numel, limit)]
        finally:
            os.close(fd)
        return torch.cat([torch.frombuffer(part, dtype=dtype) for part in parts])

    def source_texts(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The source files stored with the capture (the first ``limit`` by module name):
        ``{"module", "file", "text", "classes"}``, text decoded from its payload (shown, never run)."""
        texts = []
        for module, entry in sorted((self.metadata.get("sources") or {}).items())[:limit]:
            text = entry.get("text")
            if not isinstance(text, str) and isinstance(entry.get("text_id"), str):
                try:
                    text = self.tensor(entry["text_id"]).numpy().tobytes().decode("utf-8", errors="replace")
                except ModulelensError as error:
                    text = f"(cannot read the stored source: {error})"
            texts.append({"module": module, "file": entry.get("file"), "text": text if isinstance(text, str) else "",
                          "classes": sorted((entry.get("classes") or {}).keys())})
        return texts


class RepoView:
    """The repo a UI serves, with the caches that make its pages fast.

    Args:
        repo: the open repo (local, remote through its cache, or a pulled W&B artifact).
        scan_jobs: read each version's capturing job in a background thread (the repo page's
            host/command/commit columns).
    """

    def __init__(self, repo: Repo, *, scan_jobs: bool = True) -> None:
        self.repo = repo
        self._lock = threading.Lock()
        self._captures: OrderedDict[tuple[str, int], StoredCapture] = OrderedDict()
        self._summaries: OrderedDict[tuple[str, int, str, int], dict[str, Any]] = OrderedDict()
        self._jobs: dict[str, dict[str, Any] | None] = {}
        self._drawn: OrderedDict[tuple[str, ...], Any] = OrderedDict()
        self._scan: threading.Thread | None = None
        self._listing: Listing | None = None
        self._pages_in_flight = 0
        self._last_page = time.monotonic()  # a server starting counts as busy: its first page is near
        self._quiet = threading.Condition()
        if scan_jobs:
            self.scan_jobs()

    @property
    def location(self) -> str:
        return self.repo.location

    # ---------------------------------------------------------------------------- pages and background work

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Mark a page in flight: background work (:meth:`wait_until_quiet`) waits for it."""
        with self._quiet:
            self._pages_in_flight += 1
        try:
            yield
        finally:
            with self._quiet:
                self._pages_in_flight -= 1
                self._last_page = time.monotonic()
                self._quiet.notify_all()

    def wait_until_quiet(self, most: float = _QUIET_WAIT_S) -> None:
        """Return once no page is in flight and none has been for :data:`QUIET_S` seconds; after
        ``most`` seconds, as soon as no page is in flight (what background work calls before each
        step: never in the middle of a page, where a first view of a 50,000-call capture's saved
        file took 10.4 s instead of 7 s at load 9 when the job read and the warm-up started in it)."""
        deadline = time.monotonic() + most
        with self._quiet:
            while True:
                now = time.monotonic()
                quiet_at = self._last_page + QUIET_S
                if self._pages_in_flight == 0 and (now >= quiet_at or now >= deadline):
                    return
                self._quiet.wait(max(min(deadline, quiet_at) - now, 0.05) if self._pages_in_flight == 0 else None)

    # ---------------------------------------------------------------------------- listings

    def versions(self) -> list[VersionInfo]:
        """Every version, from the per-name listing summaries (no capture file read)."""
        return self.listing().infos

    def listing(self) -> Listing:
        """Every version (:meth:`versions`), listed again only when the repo's listing stamp has
        changed (a save, rm, alias or tag edit by any process): one small read per name per request.

        Raises:
            ModulelensError: the repo cannot be listed.
        """
        stamp = self.repo.listing_stamp()  # before the listing: a change meanwhile changes the next one
        with self._lock:
            if self._listing is not None and self._listing.stamp == stamp:
                return self._listing
        found = Listing(stamp, self.repo.list())
        with self._lock:
            self._listing = found
        return found

    def resolve(self, ref: str) -> tuple[str, int]:
        """``NAME[:vN|:alias]`` -> ``(name, version)``.

        Raises:
            CaptureNotFoundError: no such ref (with the closest names), or a name that is not valid.
        """
        return session.resolve(self.repo, ref)

    def version_numbers(self, name: str) -> list[int]:
        return self.repo.version_numbers(name)

    def name_versions(self, name: str) -> list[VersionInfo]:
        """Every version of ``name`` as the listing has it now (aliases and edited tags change).

        Raises:
            CaptureNotFoundError: ``name`` has no version (with the closest names).
        """
        found = self.repo.list(name)
        if not found:
            session.resolve(self.repo, name)  # raises with "did you mean"
        return found

    def name_notes(self, name: str) -> tuple[dict[int, VersionNotes], str | None]:
        """The descriptions and edited tags of ``name``'s versions, and why they cannot be read
        (a damaged notes file: the pages show the rest and say so), read afresh each time."""
        try:
            return self.repo.name_notes(name), None
        except CorruptCaptureError as error:
            return {}, str(error)

    def provenance(self, capture: StoredCapture, *, settle: bool = True) -> tuple[bool, str] | None:
        """Whether ``capture`` is the current user's own, signed in this repo (docs/security.md,
        "Your own captures"), and why not. ``settle=False``: ``None`` when only encoding its whole
        metadata again could tell (a file that is not the lines that were signed: 0.4 s idle for a
        50,000-call capture), for a page that asks for it afterwards (:meth:`_Ui.provenance`)."""
        if self.repo.is_remote:
            return False, "in an object store: captures there are never taken as your own"
        from modulelens.repo.trust import own_capture

        key = ("provenance", capture.ref)
        with self._lock:  # (an HMAC over every field line: kept, a version never changes)
            if key in self._drawn:
                return cast("tuple[bool, str]", self._drawn[key])
        found = own_capture(self.repo.root, capture.name, capture.version, capture.metadata, text=capture.text,
                            encode=settle)
        if not found.settled:
            return None
        return cast("tuple[bool, str]", self.drawn(key, lambda: (found.own, found.why or "")))

    # ---------------------------------------------------------------------------- edits (--allow-write)

    def set_alias(self, ref: str, alias: str) -> None:
        self.repo.set_alias(ref, alias)

    def remove_alias(self, ref: str, alias: str) -> None:
        self.repo.remove_alias(self.resolve(ref)[0], alias)

    def describe(self, ref: str, text: str, expected: str) -> None:
        self.repo.describe(ref, text, expected=expected)

    def tag(self, ref: str, tag: str) -> None:
        self.repo.tag(ref, tag)

    def untag(self, ref: str, tag: str) -> None:
        self.repo.untag(ref, tag)

    # ---------------------------------------------------------------------------- captures

    def capture(self, name: str, version: int) -> StoredCapture:
        """The stored capture ``name:vN`` (kept open: versions never change).

        Raises:
            CaptureNotFoundError, CorruptCaptureError: no such version, or its metadata is damaged.
        """
        key = (name, version)
        with self._lock:
            found = self._captures.get(key)
            if found is not None:
                self._captures.move_to_end(key)
                return found
        found = StoredCapture(self.repo, name, version)
        with self._lock:
            self._captures[key] = found
            while len(self._captures) > _OPEN_CAPTURES:
                self._captures.popitem(last=False)
        self._remember_job(found.ref, found.metadata.get("environment"))
        return found

    def summary(self, capture: StoredCapture, tid: str, limit: int | None = None) -> dict[str, Any]:
        """:func:`~modulelens.interfaces.tensor_info.tensor_summary` of one tensor from a sample of
        at most ``limit`` values (default :data:`~modulelens.interfaces.tensor_info.SAMPLE_ELEMENTS`), kept."""
        from modulelens.interfaces.tensor_info import SAMPLE_ELEMENTS, tensor_summary

        limit = SAMPLE_ELEMENTS if limit is None else limit
        key = (capture.name, capture.version, tid, limit)
        with self._lock:
            found = self._summaries.get(key)
        if found is None:
            found = tensor_summary(capture, tid, limit=limit, sample=capture.sample)
            with self._lock:
                self._summaries[key] = found
                while len(self._summaries) > _SUMMARIES:
                    self._summaries.popitem(last=False)
        return found

    def drawn(self, key: tuple[str, ...], draw: Callable[[], Any]) -> Any:
        """``draw()`` once per ``key``: what is computed from data that never changes once written (a
        plot of stored reports, a version's provenance, two tensors' overlaid histograms)."""
        with self._lock:
            if key in self._drawn:
                return self._drawn[key]
        value = draw()
        with self._lock:
            self._drawn[key] = value
            while len(self._drawn) > _OPEN_CAPTURES * 8:
                self._drawn.popitem(last=False)
        return value

    def reports(self, name: str, version: int) -> VersionReports:
        """The reports stored with ``name:vN``, newest first, each read and checked when a page
        shows it (:class:`VersionReports`); none for a version removed meanwhile."""
        return VersionReports(self.repo, name, version)

    # ---------------------------------------------------------------------------- jobs

    def job(self, ref: str) -> dict[str, Any] | None:
        """The capturing job of ``name:vN`` (``host``, ``command``, ``git_commit``), once read;
        ``None`` while it is not (:meth:`job_pending`) or when its metadata cannot be read."""
        return self._jobs.get(ref)

    def job_pending(self, ref: str) -> bool:
        """Whether the capturing job of ``ref`` is still to be read. A version saved after the scan
        (the server was started before it) starts another scan, so its job does not stay unknown."""
        if ref in self._jobs:
            return False
        self.scan_jobs()
        return True

    def job_line(self, ref: str) -> dict[str, str] | None:
        """:meth:`job` as the pages show it: ``host``, ``command`` (its first 60 characters;
        ``command_full`` up to 200), ``commit`` (its first ten characters) as text."""
        job = self._jobs.get(ref)
        if job is None:
            return None
        command = as_text(job.get("command") or "-", 200)
        return {"host": as_text(job.get("host") or "-", 100), "command_full": command,
                "command": command if len(command) <= 60 else command[:59] + "…",  # the whole one in its title
                "commit": as_text(job.get("git_commit") or "-", 200)[:10]}  # a commit's first ten hex digits

    def scan_jobs(self) -> None:
        """Start reading every version's capturing job in a background thread (once at a time)."""
        if self._scan is not None and self._scan.is_alive():
            return
        self._scan = threading.Thread(target=self._scan_all, name="modulelens-ui-jobs", daemon=True)
        self._scan.start()

    def wait_for_jobs(self, timeout: float | None = None) -> None:
        """Wait for the background read of the capturing jobs (benchmarks and tests)."""
        if self._scan is not None:
            self._scan.join(timeout)

    def _scan_all(self) -> None:
        self.wait_until_quiet()
        for info in _safely(self.versions):
            if info.ref in self._jobs:
                continue
            if info.problem:  # damaged: nothing to read (the row says why)
                self._jobs[info.ref] = None
                continue
            self.wait_until_quiet()
            try:
                self._remember_job(info.ref, self._environment(info.name, info.version))
            except (ModulelensError, OSError):
                self._jobs[info.ref] = None

    def _environment(self, name: str, version: int) -> object:
        """The ``environment`` field of ``name:vN``'s metadata. A ``capture.json`` laid out as the repo
        writes it gives it from its own line (format.provenance.stored_field): parsing and checking
        the whole 45 MiB of a 50,000-call capture for it took 0.6 s idle; any other file is read and
        checked whole (its calls left to a page that shows them, as the capture page does)."""
        from modulelens.format.provenance import stored_field
        from modulelens.repo.layout import capture_key

        text = self.repo.store.read(capture_key(name, version), immutable=True)
        found = stored_field(text, "environment") if text is not None else None
        if found is not None:
            return found
        return self.repo.read_metadata(name, version, calls=False).get("environment")

    def _remember_job(self, ref: str, environment: object) -> None:
        env = environment if isinstance(environment, dict) else {}
        argv = env.get("argv")
        command = " ".join(str(a) for a in argv) if isinstance(argv, list) else None
        self._jobs[ref] = {"host": env.get("host"), "command": command, "git_commit": env.get("git_commit"),
                           "rank": env.get("rank"), "world_size": env.get("world_size")}


def _safely(listing: Callable[[], list[VersionInfo]]) -> Iterator[VersionInfo]:
    try:
        yield from listing()
    except (ModulelensError, OSError):
        return
