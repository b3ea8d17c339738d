"""``modulelens.capture``: the public entry point to the tracer."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from modulelens.errors import CaptureWarning
from modulelens.repo import Repo, VersionInfo
from modulelens.repo.names import validate_name
from modulelens.tracing.options import PayloadPolicy, Recording
from modulelens.tracing.records import ModuleRecord
from modulelens.tracing.save import save_captures
from modulelens.tracing.tracer import Tracer
from modulelens.tracing.upload import Destination, Upload


class capture:  # noqa: N801 - reads as a function: `with modulelens.capture(model, ...)`
    """Record calls of chosen submodules of ``model`` and save them to a repo.

    ``targets`` are qualified-name globs (``"encoder.layers.*.attn"``) or class names
    (``"LlamaMLP"``); ``""`` or ``"."`` (or the model's class name) target ``model`` itself. Per
    target, ``record.warmup`` calls are skipped and the next ``record.max_calls`` are recorded;
    then the hooks go away and ``on_complete(tracer)`` runs. Leaving the ``with`` block (or calling
    :meth:`save`) saves whatever was captured as ``<name>/<qualified name>`` (the model itself as
    ``<name>``).

    In a distributed job (torchrun, any ``torch.distributed`` launcher) ``record.ranks`` says which
    ranks record (``[0]`` by default); with several recording ranks the names are
    ``<name>/rank<k>/<qualified name>``. Sharded (DTensor) parameters, inputs and outputs are
    stored as full tensors (docs/distributed.md). Call ``capture`` on every rank alike.

    Args:
        model: the job's model (the root the target names are relative to).
        targets: target patterns (one string or several).
        repo: where to save (a :class:`Repo`, a path or a remote URL; default ``$MODULELENS_REPO``
            or the default path).
        name: the capture name prefix (default: the model's class name).
        record: which calls are recorded: ``warmup``, ``max_calls``, ``backward``, ``ranks``,
            ``sync_timeout`` (:class:`Recording`, docs/fidelity.md).
        payload: which tensors are stored shape-only: ``shape_only_over``, ``max_bytes``,
            ``shape_only_params`` (:class:`PayloadPolicy`; all payloads by default).
        tags: tags of the saved versions.
        metadata: JSON-able user metadata stored with each saved version.
        strict: raise on a capture or storage failure instead of warning (the tracer fails open
            by default: the job goes on).
        on_complete: called with the tracer once every target is recorded.

    Raises:
        InvalidNameError: ``name`` is not a valid capture name (checked here, before the job runs).
        UsageError: no target pattern, or no submodule matches the targets.

    Example::

        modulelens.track_init()                  # before the model is built
        model = build_model()
        with modulelens.capture(model, targets=["mlp", "blocks.*.attn"], name="ranker",
                                record=modulelens.Recording(warmup=2, max_calls=3)) as cap:
            train(model)
        print([v.ref for v in cap.saved])        # ['ranker/mlp:v1', 'ranker/blocks.0.attn:v1', ...]

    With a remote ``repo`` (``"s3://team/captures"``) the job does not wait for the upload: the
    captures are saved into a local staging repo and uploaded in the background
    (``cap.upload``); ``cap.wait()`` blocks until they are uploaded and returns their versions in
    the remote repo. A failed upload warns (:class:`CaptureWarning`) with the staged copy and the
    command that retries it; see docs/repo-layout.md ("Capturing into a remote repo").
    """

    def __init__(
        self,
        model: torch.nn.Module,
        targets: Sequence[str] | str,
        *,
        repo: Repo | str | os.PathLike[str] | None = None,
        name: str | None = None,
        record: Recording = Recording(),
        payload: PayloadPolicy = PayloadPolicy(),
        tags: Iterable[str] = (),
        metadata: Mapping[str, object] | None = None,
        strict: bool = False,
        on_complete: Callable[[Tracer], object] | None = None,
    ) -> None:
        if name is not None:
            validate_name(name)  # now, not when the job is over and the capture is saved
        self.policy = payload
        # Large weights are written to the repo while the job runs (tracing/weights.py), unless they
        # may go shape-only (then they are copied, and dropped if the budget says so).
        # The repo is converted once, for both (tracing/upload.py's Destination).
        self.destination = Destination(repo)
        self.tracer = Tracer(model, targets, record=record, on_complete=on_complete, strict=strict,
                             blob_sink=None if payload.shape_only_params else self.destination.blob_writer)
        self.repo = repo
        self.name = name
        self.tags = list(tags)
        self.metadata = metadata
        self.saved: list[VersionInfo] = []
        self.upload: Upload | None = None  # the background upload to a remote repo, once saved
        self._saved_once = False

    def __enter__(self) -> capture:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.tracer.stop()
        if self._saved_once:
            return
        try:
            self.save()
        except Exception as error:  # fail open: leaving the block never breaks the user's job
            if self.tracer.strict:
                raise
            warnings.warn(f"modulelens: saving the captures failed: {type(error).__name__}: {error}; they are "
                          "kept in memory (cap.save(repo=DIR) retries)", CaptureWarning, stacklevel=2)

    @property
    def complete(self) -> bool:
        return self.tracer.complete

    @property
    def records(self) -> dict[str, ModuleRecord]:
        return self.tracer.records

    def stop(self) -> None:
        self.tracer.stop()

    def save(self, repo: Repo | str | os.PathLike[str] | None = None) -> list[VersionInfo]:
        """Save what was captured so far (each call makes new versions).

        Args:
            repo: save there instead of the repo given to ``capture`` (e.g. to retry after a
                storage failure left the records in memory).

        Returns:
            The :class:`VersionInfo` of each saved capture. When the repo cannot be written, the
            captures go to a fallback repo named in a :class:`CaptureWarning` (``strict=True``:
            :class:`StorageError` instead). For a remote repo, the versions as staged locally;
            :meth:`wait` gives the uploaded ones.
        """
        self._saved_once = True
        self.saved, self.upload = save_captures(self.tracer, repo if repo is not None else self.destination, self.name,
                                                tags=self.tags, metadata=self.metadata, policy=self.policy)
        return self.saved

    def wait(self, timeout: float | None = None) -> list[VersionInfo]:
        """Block until the background upload to a remote repo ended; for a local repo, return at once.

        Args:
            timeout: wait at most this many seconds.

        Returns:
            The saved versions as named in the repo they were meant for: for a remote repo, the
            uploaded ones (fewer after a failed upload, which was warned about); else :attr:`saved`.

        Raises:
            StorageError: the upload failed and ``strict=True``.

        Example::

            with modulelens.capture(model, "mlp", repo="s3://team/captures", name="ranker") as cap:
                train(model)
            print([v.ref for v in cap.wait()])   # ['ranker/mlp:v7'], once it is in S3
        """
        return self.upload.wait(timeout) if self.upload is not None else list(self.saved)
