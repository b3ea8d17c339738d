"""Saving what a tracer recorded: encode each target's record and write it to a repo.

The tracer only records; this step turns records into capture metadata + payloads
(:func:`modulelens.tracing.encode.encode_record`) and hands them to the repo, so the tracer
itself never touches storage.

Saving fails open: when the repo cannot be written (disk full, quota, read-only, permission
denied, or a lock of it held past its deadline: repo/locks.py), the captures go to a fallback repo
in the temp directory instead, one warning names the cause, the fallback and the commands that copy
them back, and the user's job goes on. When even that fails, the records stay in memory
(``cap.save(repo=...)`` retries).
"""

from __future__ import annotations

import errno
import os
import shlex
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, cast

from modulelens.errors import CaptureWarning, InvalidNameError, RepoBusyError, RepoError, StorageError, UnsupportedValueError
from modulelens.format.spec import CaptureMetadata
from modulelens.repo import Repo, VersionInfo
from modulelens.repo.collector import collector_paused
from modulelens.repo.location import default_repo_location
from modulelens.repo.names import validate_name
from modulelens.repo.store import WrittenPayload
from modulelens.tracing.distributed import capture_metadata, several_recorders
from modulelens.tracing.encode import construction_fails, encode_record
from modulelens.tracing.environment import distributed_info
from modulelens.tracing.methods import target_capture_name
from modulelens.tracing.options import PayloadPolicy
from modulelens.tracing.records import ModuleRecord
from modulelens.tracing.targets import unwrap_model
from modulelens.tracing.tracer import Tracer
from modulelens.tracing.upload import Destination, Upload, stage


def save_records(
    tracer: Tracer,
    repo: Repo | str | os.PathLike[str] | None = None,
    name: str | None = None,
    *,
    tags: Iterable[str] = (),
    metadata: Mapping[str, object] | None = None,
    policy: PayloadPolicy | None = None,
    only: Iterable[str] | None = None,
) -> list[VersionInfo]:
    """Save every target of ``tracer`` that recorded at least one call; returns their versions.

    In a distributed job only recording ranks save (others return ``[]``); when several ranks
    record, names get a ``rank<k>`` segment: ``<name>/rank<k>/<qualified name>``. ``only`` limits
    the save to those qualified names. A remote repo is written here, synchronously; see
    :func:`save_captures` for the background upload a training job uses.
    """
    target = SaveTarget(repo, strict=tracer.strict)
    try:
        return _save_into(target, tracer, name, tags=tags, metadata=metadata, policy=policy, only=only)
    finally:
        target.finish()  # the warning of a fallback names the very versions saved there


def save_captures(
    tracer: Tracer,
    repo: Destination | Repo | str | os.PathLike[str] | None = None,
    name: str | None = None,
    *,
    tags: Iterable[str] = (),
    metadata: Mapping[str, object] | None = None,
    policy: PayloadPolicy | None = None,
    only: Iterable[str] | None = None,
) -> tuple[list[VersionInfo], Upload | None]:
    """:func:`save_records`, except that captures for a remote repo are saved into a local staging
    repo and uploaded by a background :class:`~modulelens.tracing.upload.Upload` (the job does not
    wait for the network; see ``modulelens/tracing/upload.py``).

    ``repo`` may be the :class:`~modulelens.tracing.upload.Destination` the tracer streamed its
    weights into: the repo is then the one already opened for them (converted once).

    Returns:
        The saved versions (for a remote repo: as staged locally) and the upload, or ``None`` when
        the repo is local or nothing was saved.
    """
    destination = repo if isinstance(repo, Destination) else Destination(repo)
    try:
        local, remote = destination.open()
    except (OSError, StorageError):
        if isinstance(destination.requested, Repo) or stage(destination.requested) is not None:
            raise  # a remote repo's staging repo cannot be made: nowhere to keep the captures locally
        # a local repo: SaveTarget tries once more, then falls back to a repo in the temp directory
        return save_records(tracer, destination.requested, name, tags=tags, metadata=metadata, policy=policy,
                            only=only), None
    if remote is None:
        return save_records(tracer, local, name, tags=tags, metadata=metadata, policy=policy, only=only), None
    staging = local
    target = SaveTarget(staging, strict=tracer.strict)
    try:
        infos = _save_into(target, tracer, name, tags=tags, metadata=metadata, policy=policy, only=only)
    finally:
        target.finish()
    if not infos or target.repo is None:
        return infos, None
    return infos, Upload(target.repo, remote, [info.ref for info in infos], strict=tracer.strict)


def _save_into(
    target: SaveTarget,
    tracer: Tracer,
    name: str | None,
    *,
    tags: Iterable[str],
    metadata: Mapping[str, object] | None,
    policy: PayloadPolicy | None,
    only: Iterable[str] | None,
) -> list[VersionInfo]:
    tracer.synchronize()
    if not tracer.recording:
        return []
    tracer.environment.update(distributed_info())
    prefix = name or type(unwrap_model(tracer.model)).__name__
    if tracer.world_size > 1 and several_recorders(tracer.ranks, tracer.world_size):
        prefix = f"{prefix}/rank{tracer.rank}"
    settings: dict[str, Any] = {"targets": tracer.patterns, "warmup": tracer.warmup, "max_calls": tracer.max_calls,
                                "backward": tracer.backward, "buffers_after": True,
                                "metric_states_after": True}
    if tracer.world_size > 1:
        settings["ranks"] = tracer.ranks
    wanted = None if only is None else set(only)
    saved = []
    for qualified, record in tracer.records.items():
        if (wanted is not None and qualified not in wanted) or not _has_calls(tracer, qualified, record):
            continue
        capture_name = target_capture_name(prefix, qualified)
        try:
            validate_name(capture_name)  # a module path no name can hold costs its own capture, not the others'
        except InvalidNameError as error:
            if tracer.strict:
                raise
            warnings.warn(f"modulelens: the capture of {qualified!r} is not saved: {error}", CaptureWarning, stacklevel=3)
            continue
        with collector_paused():  # encoding makes a few objects per tensor (repo/collector.py)
            meta, payloads = _encode_or_drop_construction(tracer, record, capture_name, settings, list(tags),
                                                          metadata, policy)
            distributed = capture_metadata(tracer, record, tracer.sharding(qualified),
                                           [*tracer.incidents(qualified), *([record.failed] if record.failed else [])])
            if distributed is not None:
                meta["distributed"] = distributed
                if distributed["incomplete"]:
                    meta["capture"]["complete"] = False
            info = target.save(capture_name, meta, payloads)
            del meta, payloads  # freed before the collector counts again
        if info is None:
            break  # nowhere to write: the records stay in memory (warned once)
        saved.append(info)
    return saved


def fallback_repo() -> Repo:
    """A new repo in the temp directory, for captures whose repo cannot be written."""
    return Repo(tempfile.mkdtemp(prefix="modulelens-fallback-"))


def copy_back_hint(fallback: Repo, original: object, refs: Iterable[str] = ()) -> str:
    """The command that moves captures from a fallback repo to the one they were meant for: one
    ``modulelens push`` per version of ``refs`` (safe to run again: a version already in the target
    is not copied twice), or, before anything was saved, the command with a placeholder."""
    where = f" --to {shlex.quote(str(original))}" if original is not None else " --to <your repo>"
    source = shlex.quote(str(fallback.root))
    if refs:
        return " && ".join(f"modulelens push {shlex.quote(ref)} --repo {source}{where}" for ref in refs)
    return f"modulelens push <name> --repo {source}{where} (for each name; see modulelens ls --repo {source})"


class SaveTarget:
    """Where captures are saved: the requested repo, or after a storage failure a fallback repo.

    Args:
        repo: the repo (or its path) the user asked for.
        strict: raise storage errors instead of falling back.
    """

    def __init__(self, repo: Repo | str | os.PathLike[str] | None, *, strict: bool = False) -> None:
        self.requested = repo.location if isinstance(repo, Repo) else repo
        self.strict = strict
        self.repo: Repo | None = None
        self.fell_back = False
        self._cause: str | None = None  # why the captures went to the fallback repo
        self._fallen_back: list[str] = []  # the versions saved there
        try:
            self.repo = repo if isinstance(repo, Repo) else Repo(repo)
        except (OSError, StorageError) as error:
            self._fall_back(error)

    def save(self, name: str, meta: CaptureMetadata,
             payloads: dict[str, memoryview | WrittenPayload]) -> VersionInfo | None:
        """Save one capture; ``None`` when neither the repo nor a fallback can take it."""
        while self.repo is not None:
            try:
                # cast: Repo.save_version still takes the document as a plain dict (repo/ is typed on its own)
                info = self.repo.save_version(name, cast(dict[str, Any], meta), payloads)
            except (OSError, StorageError, RepoBusyError) as error:  # RepoBusyError: a lock held past its deadline
                if self.fell_back:
                    self._give_up(error)
                    return None
                self._fall_back(error)
                continue
            if self.fell_back:
                self._fallen_back.append(info.ref)
            return info
        return None

    def finish(self) -> None:
        """Warn once where the captures went, when they went to the fallback repo, with the commands
        that copy those very versions back."""
        if self.fell_back and self.repo is not None and self._fallen_back:
            target = self.requested if self.requested is not None else default_repo_location()
            warnings.warn(f"modulelens: cannot write captures to {self.requested or 'the default repo'} ({self._cause}); "
                          f"saved {len(self._fallen_back)} to {self.repo.root} instead; copy them back with: "
                          f"{copy_back_hint(self.repo, target, self._fallen_back)}", CaptureWarning, stacklevel=4)
            self._fallen_back = []

    def _fall_back(self, error: BaseException) -> None:
        cause = describe_storage_error(error)
        if self.strict:
            if isinstance(error, RepoBusyError):
                raise error
            raise StorageError(f"cannot write captures to {self.requested or 'the default repo'}: {cause}",
                               getattr(error, "errno", None)) from error
        self.fell_back = True
        self._cause = cause
        try:
            self.repo = fallback_repo()
        except (OSError, RepoError) as second:
            self._give_up(second, first=cause)
            return

    def _give_up(self, error: BaseException, first: str | None = None) -> None:
        self.repo = None
        cause = describe_storage_error(error)
        warnings.warn(f"modulelens: cannot save captures ({first + '; fallback: ' if first else ''}{cause}); "
                      "they are kept in memory: call cap.save(repo=DIR) to retry", CaptureWarning, stacklevel=4)


def describe_storage_error(error: BaseException) -> str:
    """One line for a storage failure (``disk full``, ``read-only filesystem``...)."""
    names = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded", errno.EROFS: "read-only filesystem",
             errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
             errno.EFBIG: "file too large"}
    code = getattr(error, "errno", None)
    label = names.get(code) if code is not None else None
    return f"{label}: {error}" if label else f"{type(error).__name__}: {error}"


def _has_calls(tracer: Tracer, qualified: str, record: ModuleRecord) -> bool:
    """Whether ``record`` has calls to save; warns (once per target) why not."""
    if record.calls:
        return True
    if record.failed:
        return False  # warned when it failed
    rank = f"rank {tracer.rank}: " if tracer.world_size > 1 else ""
    warnings.warn(f"modulelens: {rank}{tracer.why_not_recorded(qualified)}; nothing saved", CaptureWarning,
                  stacklevel=3)
    return False


def _encode_or_drop_construction(tracer: Tracer, record: ModuleRecord, capture_name: str, settings: Mapping[str, object], tags: list[str],
            metadata: Mapping[str, object] | None,
            policy: PayloadPolicy | None) -> tuple[CaptureMetadata, dict[str, memoryview | WrittenPayload]]:
    """Encode ``record``; a constructor argument without an encoding drops the constructor record
    (with a warning, unless strict) rather than the whole capture."""
    try:
        meta, payloads = encode_record(record, environment=tracer.environment, settings=settings, tags=tags,
                                       metadata=metadata, policy=policy, by_attributes=not tracer.strict)
        _warn_unrecorded(capture_name, meta)
        _warn_by_attributes(capture_name, meta)
        return meta, payloads
    except UnsupportedValueError as error:
        if tracer.strict or not construction_fails(record):  # a state or value no constructor record can fix
            raise
        warnings.warn(f"modulelens: {capture_name}: constructor not recorded: {error}", CaptureWarning, stacklevel=3)
        meta, payloads = encode_record(record, environment=tracer.environment, settings=settings, tags=tags,
                                       metadata=metadata, policy=policy, with_construction=False)
        meta["module"]["construction_missing"] = str(error)
        _warn_unrecorded(capture_name, meta)  # (the call values of this capture were silent: found testing outward)
        return meta, payloads


def _warn_by_attributes(capture_name: str, meta: CaptureMetadata) -> None:
    """Modules recorded by their attributes because an argument of theirs cannot be stored are named:
    a load builds them without running their constructor (docs/fidelity.md, "Rebuilt from recorded
    attributes"); a strict capture raises instead."""
    # torch's containers (ModuleList, Sequential, ModuleDict...) hold nothing but their children: rebuilt
    # from the recorded tree they are what the constructor made (``nn.ModuleList(gen)`` is common)
    found = [entry for entry in meta["constructions"].values()
             if "state" in entry and not str(entry.get("class", "")).startswith("torch.nn.modules.container:")]
    if found:
        shown = "; ".join(f"{entry['class']} ({entry.get('why', '')})" for entry in found[:3])
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        warnings.warn(f"modulelens: {capture_name}: {len(found)} module(s) recorded by their attributes, not their "
                      f"constructor arguments, which cannot be stored; a load builds them without running their "
                      f"constructor: {shown}{more}", CaptureWarning, stacklevel=4)


def _warn_unrecorded(capture_name: str, meta: CaptureMetadata) -> None:
    """Call values stored as explicit "unrecorded" markers are named, never dropped in silence."""
    missing = meta.get("unrecorded") or []
    if missing:
        shown = "; ".join(u["reason"] if u["reason"].startswith(u["path"]) else f"{u['path']} ({u['type']}: {u['reason']})"
                          for u in missing[:3])  # (a reason names its path: it was said twice)
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        warnings.warn(f"modulelens: {capture_name}: {len(missing)} call value(s) not recorded, stored as "
                      f"'unrecorded' markers: {shown}{more}", CaptureWarning, stacklevel=4)
