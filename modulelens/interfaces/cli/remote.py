"""Commands that move captures between repos: ``push`` and ``pull`` (assembled into the root app by ``root.py``)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from modulelens.format.human import human_bytes
from modulelens.interfaces import session
from modulelens.interfaces._errors import wandb_errors
from modulelens.interfaces.cli._command import command
from modulelens.interfaces.cli._options import JsonOpt, RepoOpt
from modulelens.interfaces.output import console, emit, steps

if TYPE_CHECKING:
    from modulelens.repo import Repo

app = typer.Typer()

AliasesOpt = Annotated[bool, typer.Option("--aliases/--no-aliases", help="Also set the source's aliases of the copied versions.")]


def _render(r: dict[str, Any]) -> None:
    from rich.markup import escape

    for ref in r["copied"]:
        console.print(f"copied {ref}")
    for ref in r["present"]:
        console.print(f"{ref} was already there")
    for alias in r["aliases"]:
        console.print(f"alias {alias} set")
    console.print(f"{r['blobs_copied']} payloads ({human_bytes(r['bytes_copied'])}) transferred")
    for problem in r["reports_skipped"]:
        console.print(f"report not copied: {escape(problem)}", highlight=False)


@command(app, "push")
def push_cmd(
    ref: Annotated[str, typer.Argument(help="NAME (every version), NAME:vN, NAME:alias or NAME:latest")],
    to: Annotated[str, typer.Option("--to", help="Target repo: a directory or URL (s3://bucket/prefix, memory://...).")],
    repo: RepoOpt = None,
    aliases: AliasesOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Copy versions to another repo, uploading only the payloads it lacks (tags, metadata, reports kept).

    ``--to wandb://ENTITY/PROJECT/COLLECTION`` logs the version as a W&B artifact linked into that
    registry collection instead."""
    if to.startswith("wandb://"):
        from modulelens.repo.wandb_registry import push_to_wandb

        with wandb_errors(), steps(not as_json) as step:
            step(f"logging {ref} as a W&B artifact into {to}")
            result = push_to_wandb(session.open_repo(repo), ref, to)
        emit("push", as_json, result, lambda r: console.print(
            f"logged {r['artifact']}" + (" and linked it" if r["linked"] else f" offline into {r['run_dir']}")))
        return
    with steps(not as_json) as step:
        step(f"copying {ref} to {to} (only the payloads it lacks)")
        source = session.open_repo(repo)
        session.resolve(source, ref)  # a misspelt ref fails here, before anything is created at the target
        report = source.push(ref, session.open_repo(to, create=True), aliases=aliases)
    emit("push", as_json, report.to_dict(), _render)


@command(app, "pull")
def pull_cmd(
    source: Annotated[str, typer.Argument(help="Source repo: a directory or URL (s3://bucket/prefix, ...).")],
    ref: Annotated[str, typer.Argument(help="NAME (every version), NAME:vN, NAME:alias or NAME:latest")],
    repo: RepoOpt = None,
    aliases: AliasesOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Copy versions from another repo into this one, downloading only the payloads it lacks.

    A ``wandb://ENTITY/PROJECT/COLLECTION`` source pulls the artifact version REF names (an alias
    or ``latest``)."""
    if source.startswith("wandb://"):
        from modulelens.repo.wandb_registry import pull_from_wandb

        with wandb_errors(), steps(not as_json) as step, _repo_kept_only_if_used(repo) as target:
            step(f"downloading {source}:{ref} from W&B")
            info = pull_from_wandb(f"{source}:{ref}", target)
        emit("pull", as_json, info.to_dict(), lambda r: console.print(f"pulled {r['ref']}"))
        return
    with steps(not as_json) as step:
        step(f"copying {ref} from {source} (only the payloads this repo lacks)")
        origin = session.open_repo(source)  # first: an unreachable source or a missing ref creates nothing here
        session.resolve(origin, ref)
        with _repo_kept_only_if_used(repo) as target:
            report = target.pull(origin, ref, aliases=aliases)
    emit("pull", as_json, report.to_dict(), _render)


@contextlib.contextmanager
def _repo_kept_only_if_used(path: str | None) -> Iterator[Repo]:
    """The local repo at ``path`` (default: ``$MODULELENS_REPO``), created when missing; one that
    this command created is removed again when the command fails before a version landed in it,
    so a failed pull leaves no empty repo behind."""
    from modulelens.repo import default_repo_path

    folder = None if path is not None and "://" in path else Path(path) if path is not None else default_repo_path()
    new = folder is not None and not folder.exists()
    target = session.open_repo(path, create=True)
    try:
        yield target
    except BaseException:
        if new and folder is not None and not target.names():
            shutil.rmtree(folder, ignore_errors=True)
        raise
