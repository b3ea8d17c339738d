"""``modulelens.capture``: the public entry point to the tracer."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from modulelens.errors import CaptureWarning
from modulelens.repo.names import validate_name
from modulelens.tracing.budget import PayloadPolicy
from modulelens.tracing.save import save_captures
from modulelens.tracing.tracer import Tracer
from modulelens.tracing.upload import Upload


class capture:  # noqa: N801 - reads as a function: `with modulelens.capture(model, ...)`
    """Record calls of chosen submodules of ``model`` and save them to a repo.

    ``targets`` are qualified-name globs (``"encoder.layers.*.attn"``) or class names
    (``"LlamaMLP"``); ``""`` or ``"."`` (or the model's class name) target ``model`` itself. Per
    target, ``warmup`` calls are skipped and the next ``max_calls`` are recorded; then the hooks go
    away and ``on_complete(tracer)`` runs. Leaving the ``with`` block (or calling :meth:`save`)
    saves whatever was captured as ``<name>/<qualified name>`` (the model itself as ``<name>``).

    Fidelity options (docs/fidelity.md): ``backward=True`` also records each recorded call's
    backward (output gradients in, input and parameter gradients out). ``shape_only_over`` (bytes)
    stores bigger call tensors shape-only (dtype, shape, statistics; no payload) and ``max_bytes``
    caps a capture's payload bytes by storing its largest call tensors shape-only; parameters and
    buffers keep their payload unless ``shape_only_params=True``.

    In a distributed job (torchrun, any ``torch.distributed`` launcher) ``ranks`` says which ranks
    record: ``[0]`` (default), a list, or ``"all"``; with several recording ranks the names are
    ``<name>/rank<k>/<qualified name>``. Sharded (DTensor) parameters, inputs and outputs are
    stored as full tensors, gathered on every rank of their mesh once those ranks agreed within
    ``sync_timeout`` seconds; otherwise the capture stops incomplete and the job goes on. Call
    ``capture`` on every rank alike. See docs/distributed.md.

    Example::

        modulelens.track_init()                  # before the model is built
        model = build_model()
        with modulelens.capture(model, targets=["mlp", "blocks.*.attn"], name="ranker") as cap:
            train(model)
        print([v.ref for v in cap.saved])        # ['ranker/mlp:v1', 'ranker/blocks.0.attn:v1', ...]

    With a remote ``repo`` (``"s3://team/captures"``) the job does not wait for the upload: the
    captures are saved into a local staging repo and uploaded in the background
    (``cap.upload``); ``cap.wait()`` blocks until they are uploaded and returns their versions in
    the remote repo. A failed upload warns (:class:`CaptureWarning`) with the staged copy and the
    command that retries it; see docs/repo-layout.md ("Capturing into a remote repo").

    Raises:
        InvalidNameError: ``name`` is not a valid capture name (checked here, before the job runs).
        UsageError: no target pattern, no submodule matches the targets, or bad ``warmup``/``max_calls``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        targets: Sequence[str] | str,
        *,
        repo: Any = None,
        name: str | None = None,
        warmup: int = 0,
        max_calls: int = 1,
        on_complete: Callable[[Tracer], Any] | None = None,
        strict: bool = False,
        tags: Iterable[str] = (),
        metadata: dict[str, Any] | None = None,
        backward: bool = False,
        shape_only_over: int | None = None,
        max_bytes: int | None = None,
        shape_only_params: bool = False,
        ranks: Sequence[int] | int | str = (0,),
        sync_timeout: float = 60.0,
    ) -> None:
        if name is not None:
            validate_name(name)  # now, not when the job is over and the capture is saved
        self.policy = PayloadPolicy(shape_only_over=shape_only_over, max_bytes=max_bytes,
                                    shape_only_params=shape_only_params)
        self.tracer = Tracer(model, targets, warmup=warmup, max_calls=max_calls,
                             on_complete=on_complete, strict=strict, backward=backward, ranks=ranks,
                             sync_timeout=sync_timeout)
        self.repo = repo
        self.name = name
        self.tags = list(tags)
        self.metadata = metadata
        self.saved: list[Any] = []
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
    def records(self) -> dict[str, Any]:
        return self.tracer.records

    def stop(self) -> None:
        self.tracer.stop()

    def save(self, repo: Any = None) -> list[Any]:
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
        self.saved, self.upload = save_captures(self.tracer, repo if repo is not None else self.repo, self.name,
                                                tags=self.tags, metadata=self.metadata, policy=self.policy)
        return self.saved

    def wait(self, timeout: float | None = None) -> list[Any]:
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
