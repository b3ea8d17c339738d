"""Saving what a tracer recorded: encode each target's record and write it to a repo.

The tracer only records; this step turns records into capture metadata + payloads
(:func:`modulelens.tracing.encode.encode_record`) and hands them to the repo, so the tracer
itself never touches storage.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from modulelens.errors import CaptureWarning, UnsupportedValueError
from modulelens.repo.local import Repo, VersionInfo
from modulelens.tracing.budget import PayloadPolicy
from modulelens.tracing.distributed import capture_metadata, several_recorders
from modulelens.tracing.encode import encode_record
from modulelens.tracing.environment import distributed_info
from modulelens.tracing.records import ModuleRecord
from modulelens.tracing.tracer import Tracer, unwrap_model


def save_records(
    tracer: Tracer,
    repo: Repo | str | None = None,
    name: str | None = None,
    *,
    tags: Iterable[str] = (),
    metadata: dict[str, Any] | None = None,
    policy: PayloadPolicy | None = None,
) -> list[VersionInfo]:
    """Save every target of ``tracer`` that recorded at least one call; returns their versions.

    In a distributed job only recording ranks save (others return ``[]``); when several ranks
    record, names get a ``rank<k>`` segment: ``<name>/rank<k>/<qualified name>``.
    """
    tracer.synchronize()
    if not tracer.recording:
        return []
    tracer.environment.update(distributed_info())
    repo = repo if isinstance(repo, Repo) else Repo(repo)
    prefix = name or type(unwrap_model(tracer.model)).__name__
    if tracer.world_size > 1 and several_recorders(tracer.ranks, tracer.world_size):
        prefix = f"{prefix}/rank{tracer.rank}"
    settings: dict[str, Any] = {"targets": tracer.patterns, "warmup": tracer.warmup, "max_calls": tracer.max_calls,
                                "backward": tracer.backward}
    if tracer.world_size > 1:
        settings["ranks"] = tracer.ranks
    saved = []
    for qualified, record in tracer.records.items():
        if not _has_calls(tracer, qualified, record):
            continue
        capture_name = f"{prefix}/{qualified}" if qualified else prefix
        meta, payloads = _encode_or_drop_construction(tracer, record, capture_name, settings, list(tags), metadata, policy)
        distributed = capture_metadata(tracer, record, tracer.sharding(qualified),
                                       [*tracer.incidents(qualified), *([record.failed] if record.failed else [])])
        if distributed is not None:
            meta["distributed"] = distributed
            if distributed["incomplete"]:
                meta["capture"]["complete"] = False
        saved.append(repo.save_version(capture_name, meta, payloads))
    return saved


def _has_calls(tracer: Tracer, qualified: str, record: ModuleRecord) -> bool:
    """Whether ``record`` has calls to save; warns (once per target) why not."""
    if record.calls:
        return True
    incidents = tracer.incidents(qualified)
    if record.failed:
        return False
    if incidents:
        warnings.warn(f"modulelens: rank {tracer.rank}: {qualified or '<root>'} recorded no complete call "
                      f"({incidents[-1]}); nothing saved", CaptureWarning, stacklevel=3)
    else:
        warnings.warn(f"modulelens: {qualified or '<root>'} was never called after warm-up; nothing saved",
                      CaptureWarning, stacklevel=3)
    return False


def _encode_or_drop_construction(tracer: Tracer, record: ModuleRecord, capture_name: str, settings: dict[str, Any], tags: list[str],
            metadata: dict[str, Any] | None, policy: PayloadPolicy | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Encode ``record``; a constructor argument without an encoding drops the constructor record
    (with a warning, unless strict) rather than the whole capture."""
    try:
        return encode_record(record, environment=tracer.environment, settings=settings, tags=tags,
                             metadata=metadata, policy=policy)
    except UnsupportedValueError as error:
        if tracer.strict:
            raise
        warnings.warn(f"modulelens: {capture_name}: constructor not recorded: {error}", CaptureWarning, stacklevel=3)
        construction, record.construction = record.construction, None
        try:
            meta, payloads = encode_record(record, environment=tracer.environment, settings=settings, tags=tags,
                                           metadata=metadata, policy=policy)
        finally:
            record.construction = construction
        meta["module"]["construction_missing"] = str(error)
        return meta, payloads
