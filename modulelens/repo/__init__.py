"""Repos: where captures live. The embedded default is a local directory."""

from modulelens.repo.local import GcReport, Repo, VersionInfo, default_repo_path
from modulelens.repo.names import Ref, parse_ref

__all__ = ["GcReport", "Ref", "Repo", "VersionInfo", "default_repo_path", "parse_ref"]
