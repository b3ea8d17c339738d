"""Repos: where captures live: a local directory, or object storage (``s3://``, any fsspec URL)."""

from modulelens.repo.local import GcReport, Repo, VersionInfo, default_repo_path
from modulelens.repo.names import Ref, parse_ref
from modulelens.repo.transfer import TransferReport

__all__ = ["GcReport", "Ref", "Repo", "TransferReport", "VersionInfo", "default_repo_path", "parse_ref"]
