"""Commands for interactive and agent use: ``shell``, ``mcp`` (``app``) and ``agent install`` (``agent_app``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ParamSpec, TypeVar

import typer

from modulelens.errors import MissingDependencyError
from modulelens.interfaces.cli._command import command
from modulelens.interfaces.cli._options import DeviceOpt, DtypeOpt, JsonOpt, RepoOpt
from modulelens.interfaces.output import console, emit, err_console, rich_table

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer()
agent_app = typer.Typer(
    name="agent",
    help="Set modulelens up for coding agents (Claude Code, Cursor): Agent Skill, Cursor rule.",
    no_args_is_help=True,
)


def _agent_command(name: str, context_settings: dict[str, object] | None = None) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``cli.command`` for ``modulelens agent <name>`` (JSON ``command``: ``"agent <name>"``)."""
    return command(agent_app, name, json_name=f"agent {name}", context_settings=context_settings)


# ------------------------------------------------------------------------------------- shell


@command(app, "shell", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def shell_cmd(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="NAME[:vN|:alias]")],
    repo: RepoOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    call: Annotated[int, typer.Option(help="Which recorded call's inputs/output to bind.")] = 0,
) -> None:
    """IPython with capture, module, calls, args, kwargs, output bound (IPython options after --)."""
    from modulelens.interfaces.shell import start_shell

    extra = list(ctx.args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    start_shell(ref, repo=repo, device=device, dtype=dtype, call=call, ipython_args=extra)


# ------------------------------------------------------------------------------------- agent


@_agent_command("install")
def agent_install_cmd(
    claude: Annotated[bool, typer.Option("--claude", help="Write the Agent Skill to .claude/skills/modulelens "
                                         "(always done; Claude Code and Cursor both read it).")] = False,
    cursor: Annotated[bool, typer.Option("--cursor", help="Also write .cursor/rules/modulelens.mdc.")] = False,
    project: Annotated[str | None, typer.Option("--dir", help="Project directory (default: the current one).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite files edited since they were installed.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Install the modulelens Agent Skill (and a Cursor rule) into a project. Safe to rerun."""
    from modulelens.interfaces.agent_skill import install

    del claude  # the skill folder is always written
    result = install(project, cursor=cursor, force=force)

    def render(r: dict[str, Any]) -> None:
        table = rich_table(title=f"modulelens agent skill in {r['project']}")
        table.add_column("file")
        table.add_column("status")
        colors = {"created": "green", "updated": "green", "overwritten": "yellow", "kept-modified": "yellow"}
        for f in r["files"]:
            color = colors.get(f["status"])
            table.add_row(f["path"], f"[{color}]{f['status']}[/{color}]" if color else f["status"])
        console.print(table)
        if r["kept_modified"]:
            err_console.print(f"[yellow]warning:[/yellow] kept {len(r['kept_modified'])} file(s) edited since "
                              "install; rerun with --force to overwrite them")

    emit("agent install", as_json, result.to_dict(), render)


# ------------------------------------------------------------------------------------- mcp


@command(app, "mcp")
def mcp_cmd(repo: RepoOpt = None) -> None:
    """Serve the captures to coding agents over MCP (stdio). Register: claude mcp add modulelens -- modulelens mcp."""
    try:
        from modulelens.interfaces.mcp_server import serve
    except ModuleNotFoundError as error:
        if error.name and error.name.split(".")[0] in ("mcp", "pydantic"):
            raise MissingDependencyError("the MCP server needs the mcp package: pip install 'modulelens[agents]'") from None
        raise
    serve(repo)
