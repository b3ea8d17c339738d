"""The direct path: a plain ``modulelens ls`` or ``show`` runs without importing typer.

Importing typer (with click, its coercion layer and its completion helpers) took 25-30 ms of a
fresh ``modulelens ls``'s ~75 ms (``python -X importtime``), more than the listing itself. So the
console script first looks at its arguments: when they are ``ls`` or ``show`` followed only by
that command's own options and arguments, spelled as click reads them, the command runs from
``browse.py`` here; anything else (``--help``, a typo, an unknown or misplaced option, ``--``,
``--debug``) goes to the typer app, which prints its usual help or usage error. So the direct path
never decides a usage question: it only skips the framework when the command line is one typer
would accept anyway. tests/interfaces/test_cli_direct.py checks that its table of options matches
the typer commands' and that both paths print the same thing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn

# Each command's options as the direct path reads them: option -> (keyword, what it takes), where it
# takes "flag" (True when given), "value" (the next argument) or "values" (repeatable, a list); and
# its positional arguments' keywords, the first ones required up to `required`.
_Options = dict[str, tuple[str, str]]
COMMANDS: dict[str, tuple[_Options, tuple[str, ...], int]] = {
    "ls": ({"--class": ("class_", "value"), "--tag": ("tag", "values"), "--since": ("since", "value"),
            "--sort": ("sort", "value"), "--repo": ("repo", "value"), "--json": ("as_json", "flag")},
           ("name",), 0),
    "show": ({"--repo": ("repo", "value"), "--ops": ("ops", "flag"), "--all": ("show_all", "flag"),
              "--json": ("as_json", "flag")},
             ("ref",), 1),
}


class _DeclinedError(Exception):
    """The command line is typer's to answer (help, a usage error, anything the table lacks)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would print usage and exit: typer does that
        raise _DeclinedError(message)


def _parser(command: str) -> _Parser:
    options, positionals, required = COMMANDS[command]
    # no abbreviations, no -h: an option is spelled exactly as the typer command spells it
    parser = _Parser(prog=f"modulelens {command}", add_help=False, allow_abbrev=False)
    for spelling, (keyword, takes) in options.items():
        action = {"flag": "store_true", "value": "store", "values": "append"}[takes]
        parser.add_argument(spelling, dest=keyword, action=action, default=argparse.SUPPRESS)
    for index, keyword in enumerate(positionals):
        parser.add_argument(keyword, nargs=None if index < required else "?", default=argparse.SUPPRESS)
    return parser


def parse(argv: list[str]) -> tuple[str, dict[str, Any]] | None:
    """``(command, keyword arguments)`` when ``argv`` is a plain ``ls``/``show`` command line, else None.

    Read with argparse from :data:`COMMANDS`; whatever argparse would refuse, and any option the
    table lacks (``--help``, ``--``, ``-1``), is declined for typer to answer as usual.

    Args:
        argv: the arguments after the program name.

    Returns:
        The command and the keywords of its ``browse`` function, or None where typer should decide.

    Example::

        parse(["ls", "--repo", "/tmp/r", "--json"])  # ("ls", {"repo": "/tmp/r", "as_json": True})
        parse(["ls", "--help"])                       # None: typer prints the help
    """
    if not argv or argv[0] not in COMMANDS:
        return None
    options = COMMANDS[argv[0]][0]
    # argparse reads `--` and a number such as `-1` as positional; click calls them an option
    if any(token.startswith("-") and token != "-" and token.partition("=")[0] not in options for token in argv[1:]):
        return None
    try:
        return argv[0], vars(_parser(argv[0]).parse_args(argv[1:]))
    except _DeclinedError:
        return None


def run(argv: list[str]) -> bool:
    """Run ``argv`` on the direct path when :func:`parse` accepts it, exiting as the typer command would.

    Args:
        argv: the arguments after the program name.

    Returns:
        False when the command line is typer's to run (nothing was done); otherwise it exits.
    """
    parsed = parse(argv)
    if parsed is None:
        return False
    command, keywords = parsed
    from modulelens.interfaces.cli import browse

    functions: dict[str, Callable[..., None]] = {"ls": browse.list_captures, "show": browse.show_capture}
    sys.exit(run_reporting(command, functions[command], keywords))


def run_reporting(label: str, func: Callable[..., None], keywords: dict[str, Any]) -> int:
    """Call ``func(**keywords)`` and return the exit code, a known error printed as one line (or one
    JSON error) as every command prints it, and a reader that left the pipe ending it quietly."""
    from modulelens.interfaces._errors import KNOWN_ERRORS
    from modulelens.interfaces.cli._errors import print_error, silence_stdout

    try:
        func(**keywords)
    except BrokenPipeError:  # `modulelens ls | head`: the reader left; end quietly, like other tools
        silence_stdout()
        return 1
    except KNOWN_ERRORS as error:
        return print_error(label, error, bool(keywords.get("as_json")))
    return 0
