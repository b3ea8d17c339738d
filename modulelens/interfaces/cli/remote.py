"""Commands that move captures between repos: ``push`` and ``pull`` (assembled into the root app by ``app.py``)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from modulelens.format.human import human_bytes
from modulelens.interfaces import session
from modulelens.interfaces._errors import wandb_errors
from modulelens.interfaces.cli._command import command
from modulelens.interfaces.cli._options import JsonOpt, RepoOpt
from modulelens.interfaces.output import console, emit, steps

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
        report = session.open_repo(repo).push(ref, session.open_repo(to, create=True), aliases=aliases)
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

        with wandb_errors(), steps(not as_json) as step:
            step(f"downloading {source}:{ref} from W&B")
            info = pull_from_wandb(f"{source}:{ref}", session.open_repo(repo, create=True))
        emit("pull", as_json, info.to_dict(), lambda r: console.print(f"pulled {r['ref']}"))
        return
    with steps(not as_json) as step:
        step(f"copying {ref} from {source} (only the payloads this repo lacks)")
        report = session.open_repo(repo, create=True).pull(session.open_repo(source), ref, aliases=aliases)
    emit("pull", as_json, report.to_dict(), _render)
