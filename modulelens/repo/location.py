"""Where repos and the cache are, from the environment: ``$MODULELENS_REPO``, ``$MODULELENS_CACHE``,
``$MODULELENS_OFFLINE`` (docs/repo-layout.md)."""

from __future__ import annotations

import os
from pathlib import Path


def is_url(location: str | os.PathLike[str]) -> bool:
    """True for an fsspec URL other than ``file://`` (a ``file://`` URL names a local directory)."""
    text = os.fspath(location)
    return "://" in text and not text.startswith("file://")


def default_repo_location() -> str:
    """``$MODULELENS_REPO`` (a directory or a URL such as ``s3://bucket/prefix``), else the default
    local repo path."""
    env = os.environ.get("MODULELENS_REPO")
    if env:
        return env if is_url(env) else str(Path(env).expanduser())
    return str(default_repo_path())


def default_repo_path() -> Path:
    """``$MODULELENS_REPO``, else ``$XDG_CACHE_HOME/modulelens/repo`` (``~/.cache/...``)."""
    env = os.environ.get("MODULELENS_REPO")
    if env and not is_url(env):
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "modulelens" / "repo"


def cache_root() -> Path:
    """``$MODULELENS_CACHE``, else ``$XDG_CACHE_HOME/modulelens/cache`` (``~/.cache/...``): the
    payloads and manifests of remote repos, staged uploads, W&B imports."""
    env = os.environ.get("MODULELENS_CACHE")
    if env:
        return Path(env).expanduser().absolute()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "modulelens" / "cache"


def offline() -> bool:
    """``MODULELENS_OFFLINE=1``: never contact a remote repo; read from the cache only."""
    return os.environ.get("MODULELENS_OFFLINE", "") not in ("", "0", "false", "no")
