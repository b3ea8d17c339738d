"""Repos: where captures live: a local directory, or object storage (``s3://``, any fsspec URL)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from modulelens.repo.local import GcReport, Repo, VersionInfo, default_repo_path
from modulelens.repo.names import Ref, parse_ref

if TYPE_CHECKING:
    from modulelens.repo.transfer import TransferReport

__all__ = ["GcReport", "Ref", "Repo", "TransferReport", "VersionInfo", "default_repo_path", "parse_ref"]


def __getattr__(name: str) -> Any:
    if name == "TransferReport":  # on first use: push/pull's module (and its thread pool) is not needed to list
        from modulelens.repo.transfer import TransferReport

        return TransferReport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
