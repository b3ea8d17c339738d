"""The root ``modulelens`` app, assembled from the command modules when a command needs them.

Each command module owns a ``typer.Typer`` and imports only ``_command``, ``_options``,
``session`` and ``output``; this module is the only one that reaches them all, so there is no
cycle. Top-level commands are merged in without a group name; groups (``kernel``, ``agent``) keep
theirs.

Nothing is assembled up front: ``modulelens ls`` imports the module that defines ``ls`` and builds
its commands only, and ``--help`` lists the commands from their registrations without building any
(click's lazy-group pattern). Building every command's parameters, importing every module's
dependencies and rendering help through rich took about two thirds of a ``--help``, and kept
``ls`` from starting faster than a tenth of a second over a bare ``import typer``
(benchmarks/bench_cli.py). Command modules import torch and rich only inside commands.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from modulelens.interfaces.cli._command import GivenValues
from modulelens.interfaces.cli._errors import DebugState

# Where the commands are defined, in the order ``--help`` lists them: (module, its typer app, the
# group name, or None when its commands are top-level commands).
_SOURCES = (
    ("core", "app", None),      # ls, show, replay, alias, rm, trust, gc, fsck, run, demo
    ("tools", "app", None),     # profile, verify, diff
    ("kernel", "app", None),    # export
    ("agents", "app", None),    # shell, mcp
    ("remote", "app", None),    # push, pull
    ("ui", "app", None),        # ui, report
    ("kernel", "kernel_app", "kernel"),
    ("agents", "agent_app", "agent"),
)


def _typer_app(module: str, attribute: str) -> typer.Typer:
    sub: typer.Typer = getattr(importlib.import_module(f"modulelens.interfaces.cli.{module}"), attribute)
    # Plain click help for every command, like the root's: rich's boxed panels cut option names and
    # help text to a third of an 80-column terminal (issue 23).
    sub.rich_markup_mode = None
    return sub


def _entries(stop: str | None = None) -> Iterator[tuple[str, typer.Typer, str | None]]:
    """``(command name, its module's app, its group name)`` for every command and group, importing
    the command modules in order (all of them, or up to the one that defines ``stop``)."""
    for module, attribute, group in _SOURCES:
        sub = _typer_app(module, attribute)
        names = [group] if group else [info.name for info in sub.registered_commands if info.name]
        for name in names:
            yield name, sub, group
        if stop in names:
            return


class _LazyCommands(GivenValues, TyperGroup):
    """The root group: a command's module is imported, and its commands built, when it runs."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [name for name, _, _ in _entries()]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        for name, sub, group in _entries(stop=cmd_name):
            if name == cmd_name and group:  # a group even when it holds one command (agent install)
                return typer.main.get_group(sub)
            if name == cmd_name:  # build this command only, not its module's others
                [info] = [i for i in sub.registered_commands if i.name == name]
                return typer.main.get_command_from_info(
                    info, pretty_exceptions_short=sub.pretty_exceptions_short, rich_markup_mode=None)
        return None

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        # typer suggests close names from the commands it built up front; here they are found on demand
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in [n for n, _, _ in _entries(stop=name)]:
            close = difflib.get_close_matches(name, self.list_commands(ctx))
            if close:
                ctx.fail(f"No such command {name!r}. Did you mean {', '.join(map(repr, close))}?")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The command list of ``--help``, from the registrations: nothing is built for it."""
        rows = []
        for name, sub, group in _entries():
            if group:
                text = sub.info.help if isinstance(sub.info.help, str) else ""
            else:
                [info] = [i for i in sub.registered_commands if i.name == name]
                text = info.help or inspect.getdoc(info.callback) or ""
            rows.append((name, _summary(text)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _summary(text: str) -> str:
    """A command's line in ``--help``: the first sentence of its help's first paragraph (joined
    across the docstring's line breaks, so it never stops mid-sentence)."""
    paragraph = " ".join(text.strip().split("\n\n")[0].split())
    first, dot, _ = paragraph.partition(". ")
    return first + "." if dot else paragraph


app = typer.Typer(
    name="modulelens",
    cls=_LazyCommands,
    help="Capture submodules of a real PyTorch job, store them versioned, rebuild and replay them anywhere.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: rendering it through rich cost more than the rest of --help
)


def _version(value: bool) -> None:
    if value:
        from modulelens import __version__

        print(f"modulelens {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    del version  # handled by its eager callback
    DebugState.enabled = debug
