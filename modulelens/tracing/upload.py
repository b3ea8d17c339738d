"""Captures for a remote repo: committed to a local staging repo, then uploaded in the background.

A training job that captures into ``s3://...`` must not wait for the network. When the capture
stops, each capture is saved into a local repo, ``$MODULELENS_CACHE/staging/<quoted URL>`` (a
local disk write, like any save), and :class:`Upload` pushes those versions to the remote repo from
a thread while the job goes on. Payloads are streamed from the staged files (8 at a time, in
multipart parts), so memory stays bounded whatever the capture's size.

Why a thread and not a detached process: the staged copy is already on disk, so the upload only
needs to run *while the job runs*, and a thread does that without a second interpreter importing
torch on a busy training node (it mostly waits on the network, in s3fs's event loop, without the
GIL). A detached process would not outlive the job either where it matters: schedulers (SLURM,
Kubernetes) end every process of a finished job. When the main thread ends, a hook waits for
unfinished uploads at most ``MODULELENS_UPLOAD_EXIT_WAIT_S`` seconds (default 600); an upload
still running then is abandoned (a partial upload is invisible: the manifest goes last) and one
warning names the staged copy and the command that completes it.

A failed upload warns once (:class:`CaptureWarning`: the job goes on) with the same retry command,
``modulelens push NAME:vN --repo STAGING --to URL``; the staged copy is kept until an upload
succeeds, then removed from the staging repo.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401 - imported first so its shutdown hook runs after ours
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from urllib.parse import quote

from modulelens.errors import CaptureWarning, ModulelensError, StorageError
from modulelens.repo import Repo, VersionInfo
from modulelens.repo.store import BlobWriter

_EXIT_WAIT_S = 600.0
_pending: set[Upload] = set()
_pending_lock = threading.Lock()


def staging_repo(url: str) -> Repo:
    """The local repo where captures for ``url`` wait for their upload."""
    from modulelens.repo.location import cache_root

    return Repo(cache_root() / "staging" / quote(url.rstrip("/"), safe=""))


def exit_wait_s() -> float:
    """How long the interpreter waits at exit for unfinished uploads (``MODULELENS_UPLOAD_EXIT_WAIT_S``)."""
    try:
        return max(0.0, float(os.environ.get("MODULELENS_UPLOAD_EXIT_WAIT_S", _EXIT_WAIT_S)))
    except ValueError:
        return _EXIT_WAIT_S


class Upload:
    """Versions of a staging repo being pushed to a remote repo by a background thread.

    Args:
        staging: the local repo holding the staged versions.
        target: the remote repo (an object, or its URL: opened in the thread, so an unreachable
            server never delays the caller).
        refs: the staged versions (``name:vN`` in ``staging``).
        strict: :meth:`wait` raises :class:`StorageError` when the upload failed.

    Example::

        with modulelens.capture(model, "mlp", repo="s3://team/captures") as cap:
            train(model)                 # the upload starts when the capture stops
        print([v.ref for v in cap.wait()])   # blocks until uploaded: the refs in s3://team/captures
    """

    def __init__(self, staging: Repo, target: Repo | str, refs: list[str], *, strict: bool = False) -> None:
        self.staging = staging
        self.url = target.location if isinstance(target, Repo) else str(target)
        self.staged = list(refs)
        self.strict = strict
        self.uploaded: dict[str, VersionInfo] = {}  # staged ref -> the version in the remote repo
        self.error: BaseException | None = None
        self.seconds: float | None = None
        self._target = target
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="modulelens-upload", daemon=True)
        with _pending_lock:
            _pending.add(self)
        self._thread.start()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def retry_command(self) -> str:
        """The command that completes the upload from the staged copy (safe to run more than once:
        a version already in the target is not copied again)."""
        return " && ".join(f"modulelens push {ref} --repo {self.staging.location} --to {self.url}"
                           for ref in self.staged if ref not in self.uploaded)

    def wait(self, timeout: float | None = None) -> list[VersionInfo]:
        """Block until the upload ended (or ``timeout`` seconds passed).

        Returns:
            The uploaded versions, as named in the remote repo (all of them once it succeeded;
            fewer after a failure, which was warned about, or when ``timeout`` ran out first).

        Raises:
            StorageError: the upload failed and the capture was ``strict``.
        """
        self._done.wait(timeout)
        if self.error is not None and self.strict:
            raise StorageError(f"uploading captures to {self.url} failed: {self.error}; "
                               f"retry with: {self.retry_command}") from self.error
        return [self.uploaded[ref] for ref in self.staged if ref in self.uploaded]

    def _run(self) -> None:
        from modulelens.repo.transfer import copy_versions

        started = time.monotonic()
        try:
            target = self._target if isinstance(self._target, Repo) else Repo(self._target)
            for ref in self.staged:
                # A fresh capture (its `created` time is new) cannot be in the target already: skip
                # reading the name's every manifest there (200 versions made that the slow part).
                report = copy_versions(self.staging, target, ref, record_origin=False, find_existing=False)
                self.uploaded[ref] = report.versions[0]
            self._drop_staged()
        except Exception as error:  # fail open: warn once, keep the staged copy
            self.error = error
            warnings.warn(f"modulelens: uploading captures to {self.url} failed ({type(error).__name__}: {error}); "
                          f"they are kept in {self.staging.location}; retry with: {self.retry_command}",
                          CaptureWarning, stacklevel=1)
        finally:
            self.seconds = time.monotonic() - started
            with _pending_lock:
                _pending.discard(self)
            self._done.set()

    def _drop_staged(self) -> None:
        """Remove the uploaded versions from staging (and their payloads, unless a concurrent save
        into the staging repo holds it: then a later upload's cleanup frees them)."""
        for ref in self.staged:
            self.staging.remove(ref)
        try:
            self.staging.gc()
        except (OSError, ModulelensError):
            pass


def pending_uploads() -> list[Upload]:
    """Uploads of this process still running."""
    with _pending_lock:
        return list(_pending)


def at_main_thread_exit(func: Callable[[], object]) -> None:
    """Run ``func`` when the main thread ends, *before* Python's shutdown stops thread pools.

    A plain ``atexit`` handler runs too late for network work: by then ``concurrent.futures`` (and
    asyncio's default executor, which s3fs needs to open a connection) refuse new tasks ("cannot
    schedule new futures after interpreter shutdown", seen in the tests; CPython bpo-39812), so an
    upload still running would fail. ``threading._register_atexit`` hooks run first, in reverse
    order of registration; ``concurrent.futures.thread`` registered its own when imported, above.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(func)
            return
        except RuntimeError:  # already shutting down: atexit is all that is left
            pass
    atexit.register(func)


def _wait_at_exit() -> None:
    uploads = pending_uploads()
    if not uploads:
        return
    deadline = time.monotonic() + exit_wait_s()
    print(f"modulelens: waiting for {len(uploads)} capture upload(s) to finish (at most {exit_wait_s():.0f} s)",
          file=sys.stderr, flush=True)
    for upload in uploads:
        upload.wait(max(0.0, deadline - time.monotonic()))
        if not upload.done:
            print(f"modulelens: the upload to {upload.url} did not finish before exit; the captures are kept in "
                  f"{upload.staging.location}; complete it with: {upload.retry_command}", file=sys.stderr, flush=True)


class Destination:
    """Where a capture goes, from the ``repo`` argument of ``capture()`` (a :class:`Repo`, a path, a
    URL, or ``None`` for the default), converted once and shared by the two that write there: the
    weights streamed while the job runs (tracing/weights.py) and the save at its end. A remote repo
    is written through its local staging repo (:func:`stage`) and uploaded after the save.

    The repo is opened on first use (the first large weight recorded, or the save), not before;
    a failure to open it is not kept (each use tries again, so the save falls back as usual).

    Example::

        destination = Destination("s3://team/captures")
        local, remote = destination.open()   # the staging repo, and "s3://team/captures"
    """

    def __init__(self, repo: Repo | str | os.PathLike[str] | None) -> None:
        self.requested = repo
        self._lock = threading.Lock()
        self._opened: tuple[Repo, Repo | str | None] | None = None
        self._no_writer = False  # opening failed for a weight: the next weights are copied without trying again

    def open(self) -> tuple[Repo, Repo | str | None]:
        """The local repo captures are saved into, and for a remote repo the target they are then
        uploaded to (``None`` for a local repo).

        Raises:
            OSError, StorageError: the local repo cannot be opened or created.
        """
        with self._lock:
            if self._opened is None:
                staged = stage(self.requested)
                if staged is not None:
                    self._opened = staged
                else:
                    self._opened = (self.requested if isinstance(self.requested, Repo) else Repo(self.requested), None)
            return self._opened

    def blob_writer(self, nbytes: int) -> BlobWriter | None:
        """A blob writer of the repo saved into (:meth:`Repo.blob_writer`), for a weight streamed
        while the job runs; ``None`` when the repo cannot be opened (the weights are then copied,
        and the save falls back as usual: the tracer fails open)."""
        if self._no_writer:
            return None
        try:
            local, _ = self.open()
        except Exception:  # any failure here means "copy the weights", never a crash
            self._no_writer = True
            return None
        return local.blob_writer(nbytes)


def stage(repo: Repo | str | os.PathLike[str] | None) -> tuple[Repo, Repo | str] | None:
    """For a remote ``repo`` (a URL or a remote :class:`Repo`), the staging repo and the target;
    ``None`` for a local repo (saved directly).

    Whether a location is remote is the store registry's answer, not its spelling: a scheme
    registered for a local directory (``register_store("team", ...)``) is saved directly. Only the
    store is built here, which sends no request (the repo itself is opened in the upload's thread,
    so an unreachable server never delays the job); a location whose store cannot be built here
    (an unknown scheme, a missing backend, offline with nothing cached) is staged, so the capture
    is kept locally and the upload's warning names the failure, as for any failed upload.
    """
    from modulelens.repo.location import default_repo_location
    from modulelens.repo.registry import LOCAL_SCHEME, open_store, scheme_of

    if isinstance(repo, Repo):
        return (staging_repo(repo.location), repo) if repo.is_remote else None
    location = default_repo_location() if repo is None else os.fspath(repo)
    if scheme_of(location) == LOCAL_SCHEME:
        return None  # a directory path: no store to build to know that
    try:
        remote = open_store(location).is_remote
    except Exception:  # fail open: decided as remote, the upload reports why it cannot proceed
        remote = True
    return (staging_repo(location), location) if remote else None


at_main_thread_exit(_wait_at_exit)
