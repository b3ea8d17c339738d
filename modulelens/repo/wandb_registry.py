"""Captures as W&B artifacts, linked into the W&B Registry (``wandb://ENTITY/PROJECT/COLLECTION``).

A version becomes an artifact of type ``modulelens-capture`` whose files are the repo's own:
``capture.json``, ``blobs/<hash>`` for each payload and ``reports/*.json``; its metadata is a
summary of the capture (name, version, module class, tags, payload bytes, origin). Mapping:

* our name ``ranker/top_mlp`` -> artifact name ``ranker--top_mlp`` (W&B names have no ``/``); the
  real name is in the artifact metadata (``modulelens_name``) and in ``capture.json``.
* our version numbers are not W&B's: W&B numbers artifact versions ``v0, v1, ...`` in logging
  order. Our ``name:vN`` is kept as ``modulelens_ref`` in the metadata.
* our aliases become W&B aliases of that artifact version (ours exclude ``latest`` and ``vN``,
  which W&B reserves); pulling sets them back.

Needs the ``wandb`` SDK (``pip install 'modulelens[wandb]'``). ``modulelens.load("wandb://...")``
goes through :func:`resolve_wandb_ref` (download once into the cache, import, load from there).
What has run without a W&B server (tests) and what has *not* run against a live W&B
(``link_artifact``, ``wandb sync``, ``Api().artifact(...)`` and ``.download()``, alias mapping on
the server): the exact list is in docs/repo-layout.md ("The W&B Registry").
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modulelens.errors import CorruptCaptureError, MissingDependencyError, RemoteRepoError, UsageError
from modulelens.repo.layout import CAPTURE_FILE
from modulelens.repo.location import cache_root, offline
from modulelens.repo.names import LATEST, parse_ref, validate_report_file
from modulelens.repo.packs import referenced_blobs
from modulelens.repo.repository import Repo, VersionInfo

ARTIFACT_TYPE = "modulelens-capture"
SCHEME = "wandb://"


@dataclass(frozen=True)
class WandbTarget:
    """``wandb://ENTITY/PROJECT/COLLECTION[:alias]``."""

    entity: str
    project: str
    collection: str
    alias: str | None = None

    @classmethod
    def parse(cls, url: str) -> WandbTarget:
        body = url[len(SCHEME):] if url.startswith(SCHEME) else ""
        path, _, alias = body.partition(":")
        parts = path.split("/")
        if len(parts) != 3 or not all(parts):
            raise UsageError(f"{url!r}: expected wandb://ENTITY/PROJECT/COLLECTION[:alias]")
        return cls(parts[0], parts[1], parts[2], alias or None)

    @property
    def path(self) -> str:
        return f"{self.entity}/{self.project}/{self.collection}"


def artifact_name(capture_name: str) -> str:
    return capture_name.replace("/", "--")


def _wandb() -> Any:
    try:
        import wandb
    except ImportError:
        raise MissingDependencyError("the W&B Registry needs the wandb SDK: pip install 'modulelens[wandb]'") from None
    return wandb


def stage_version(repo: Repo, ref: str, directory: Path) -> tuple[VersionInfo, dict[str, Any]]:
    """Write a version's files (capture.json, blobs/, reports/) into ``directory``; returns its
    info and the artifact metadata."""
    name, version = repo.resolve(ref)
    meta = repo.read_metadata(name, version)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CAPTURE_FILE).write_text(json.dumps(meta, indent=1))
    repo.download(referenced_blobs(meta), label=f"{name}:v{version}")
    packs = {pack["payload"] for pack in meta.get("packs", ())}
    for digest, nbytes in referenced_blobs(meta).items():  # loose payloads and packs (their members checked too)
        source = repo.check_blob(digest, nbytes, pack=digest in packs)
        target = directory / "blobs" / source.name
        target.parent.mkdir(exist_ok=True)
        if not target.exists():
            shutil.copyfile(source, target)
    for filename, data in repo.report_files(name, version).items():
        (directory / "reports").mkdir(exist_ok=True)
        (directory / "reports" / filename).write_bytes(data)
    info = repo.info(name, version, metadata=meta)
    metadata = {"modulelens_name": name, "modulelens_ref": info.ref, "modulelens_repo": repo.location,
                "module_class": info.module_class, "tags": list(info.tags), "payload_bytes": info.nbytes,
                "calls": info.calls, "created": info.created, "format_version": meta.get("format_version")}
    return info, metadata


def build_artifact(repo: Repo, ref: str, directory: Path) -> tuple[Any, list[str]]:
    """The ``wandb.Artifact`` for ``ref`` (files staged in ``directory``) and the aliases to give it."""
    wandb = _wandb()
    info, metadata = stage_version(repo, ref, directory)
    artifact = wandb.Artifact(artifact_name(info.name), type=ARTIFACT_TYPE, metadata=metadata,
                              description=f"modulelens capture {info.ref} ({info.module_class})")
    artifact.add_dir(str(directory))
    return artifact, [a for a in info.aliases if a != LATEST]


def push_to_wandb(repo: Repo, ref: str, url: str, *, work_dir: Path | None = None) -> dict[str, Any]:
    """Log ``ref`` as an artifact in ``ENTITY/PROJECT`` and link it into ``COLLECTION``.

    In offline mode (``WANDB_MODE=offline``) the artifact is logged into the run directory and
    ``wandb sync`` uploads it later; linking needs a server and is skipped then.

    Raises:
        ModulelensError: wandb is not installed, or the URL is malformed.
    """
    wandb = _wandb()
    target = WandbTarget.parse(url)
    staging = work_dir or Path(os.environ.get("MODULELENS_CACHE", Path.home() / ".cache" / "modulelens" / "cache")) / "wandb-staging"
    artifact, aliases = build_artifact(repo, ref, staging / artifact_name(parse_ref(ref).name))
    run = wandb.init(entity=target.entity, project=target.project, job_type="modulelens-push",
                     dir=str(work_dir) if work_dir else None)
    try:
        run.log_artifact(artifact, aliases=aliases or None)
        offline = run.settings.mode == "offline" if hasattr(run.settings, "mode") else wandb.run is None
        if not offline:
            run.link_artifact(artifact, target.path, aliases=aliases or None)
        run_dir = run.dir
    finally:
        run.finish()
    return {"artifact": artifact.name, "aliases": aliases, "linked": not offline, "run_dir": run_dir}


def import_artifact_dir(directory: Path, repo: Repo, *, aliases: tuple[str, ...] = ()) -> VersionInfo:
    """Add the capture in an artifact's downloaded ``directory`` to ``repo`` as a new version (or
    find it there already); payloads are hash-checked on the way in, aliases set afterwards."""
    from modulelens.repo.transfer import content_id

    try:
        meta = json.loads((directory / CAPTURE_FILE).read_text())
        name = meta["name"]
    except (OSError, ValueError, KeyError) as error:
        raise CorruptCaptureError(f"{directory}: not a modulelens artifact ({error})") from None
    existing = {content_id(repo.read_metadata(name, v)): v for v in repo.version_numbers(name)}
    version = existing.get(content_id(meta))
    if version is None:
        for digest in referenced_blobs(meta):  # hash-checked on the way in
            repo.put_blob_file(digest, directory / "blobs" / digest.partition(":")[2])
        meta["origin"] = {"repo": "wandb", "ref": meta.get("origin", {}).get("ref", f"{name}:v{meta.get('version')}")}
        version = repo.commit_version(name, meta).version
        for report in sorted((directory / "reports").glob("*.json")):
            repo.put_report(name, version, validate_report_file(report.name), report.read_bytes())
    for alias in aliases:
        repo.set_alias(f"{name}:v{version}", alias)
    return repo.info(name, version)


def pull_from_wandb(url: str, repo: Repo, *, root: Path | None = None) -> VersionInfo:
    """Download ``wandb://ENTITY/PROJECT/COLLECTION:alias`` and import it into ``repo``
    (not yet run against a live W&B server).

    Raises:
        MissingDependencyError: the wandb SDK is not installed.
        RemoteRepoError: W&B cannot be reached or refuses (no API key, no such artifact).
    """
    artifact = _remote_artifact(url)
    directory = Path(_wandb_call(url, lambda: artifact.download(root=str(root) if root else None)))
    return import_artifact_dir(directory, repo, aliases=_our_aliases(artifact.aliases))


def _our_aliases(aliases: list[str]) -> tuple[str, ...]:
    """W&B's aliases without the ones it maintains itself (``latest``, ``v0``, ``v1``...)."""
    return tuple(a for a in aliases if a != LATEST and not (a[:1] == "v" and a[1:].isdigit()))


def _remote_artifact(url: str) -> Any:
    wandb = _wandb()
    target = WandbTarget.parse(url)
    return _wandb_call(url, lambda: wandb.Api().artifact(f"{target.path}:{target.alias or LATEST}", type=ARTIFACT_TYPE))


def _wandb_call(url: str, call: Any) -> Any:
    """Run one W&B SDK request; its failures (no network, no API key, no such artifact) become one
    line naming the URL."""
    import wandb

    try:
        return call()
    except (wandb.errors.Error, OSError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RemoteRepoError(f"cannot fetch {url} from W&B (network, login or registry): {first}") from None


def wandb_cache_repo() -> Repo:
    """The local repo that W&B artifacts are imported into when loaded by URL (part of the cache)."""
    return Repo(cache_root() / "wandb" / "repo")


def resolve_wandb_ref(url: str) -> tuple[Repo, str]:
    """Where ``modulelens.load("wandb://ENTITY/PROJECT/COLLECTION:alias")`` finds its capture: the
    artifact version is downloaded (once: it is known by its W&B digest) and imported into
    :func:`wandb_cache_repo`; returns that repo and the ref there. With ``MODULELENS_OFFLINE=1``
    the URL resolves to what it resolved to last time, from the cache alone.

    Raises:
        MissingDependencyError: the wandb SDK is not installed (``pip install 'modulelens[wandb]'``).
        RemoteRepoError: W&B cannot be reached or refuses, or offline and never loaded here.
    """
    target = WandbTarget.parse(url)
    key = f"{target.path}:{target.alias or LATEST}"
    index = _WandbIndex(cache_root() / "wandb" / "refs.json")
    repo = wandb_cache_repo()
    if offline():
        ref = index.refs.get(key)
        if ref is None:
            raise RemoteRepoError(f"MODULELENS_OFFLINE is set and {url} was never loaded on this machine")
        return repo, ref
    artifact = _remote_artifact(url)
    ref = index.digests.get(artifact.digest)
    if ref is None:
        root = cache_root() / "wandb" / "download" / artifact.digest
        directory = Path(_wandb_call(url, lambda: artifact.download(root=str(root))))
        ref = import_downloaded(directory, key, artifact.digest, _our_aliases(artifact.aliases))[1]
        shutil.rmtree(root, ignore_errors=True)  # the payloads now live in the cache repo
    else:
        index.record(key, ref, artifact.digest)
    return repo, ref


def import_downloaded(directory: Path, key: str, digest: str, aliases: tuple[str, ...] = ()) -> tuple[Repo, str]:
    """Import an artifact's downloaded ``directory`` into :func:`wandb_cache_repo` and remember that
    ``key`` (``ENTITY/PROJECT/COLLECTION:alias``) and the artifact's ``digest`` resolve to it;
    returns the cache repo and the ref there."""
    repo = wandb_cache_repo()
    info = import_artifact_dir(directory, repo, aliases=aliases)
    _WandbIndex(cache_root() / "wandb" / "refs.json").record(key, info.ref, digest)
    return repo, info.ref


class _WandbIndex:
    """``refs.json`` in the cache: which of our refs each W&B URL and artifact digest resolved to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        self.refs: dict[str, str] = dict(data.get("refs", {}))
        self.digests: dict[str, str] = dict(data.get("digests", {}))

    def record(self, key: str, ref: str, digest: str) -> None:
        self.refs[key], self.digests[digest] = ref, ref
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}-{os.getpid()}")
        tmp.write_text(json.dumps({"refs": self.refs, "digests": self.digests}, indent=1))
        os.replace(tmp, self.path)
