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

import sys
from collections.abc import Callable
from typing import Any

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


def parse(argv: list[str]) -> tuple[str, dict[str, Any]] | None:
    """``(command, keyword arguments)`` when ``argv`` is a plain ``ls``/``show`` command line, else None.

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
    command, rest = argv[0], argv[1:]
    options, positionals, required = COMMANDS[command]
    values: dict[str, Any] = {}
    given: list[str] = []
    index = 0
    while index < len(rest):
        token = rest[index]
        index += 1
        if not token.startswith("-") or token == "-":
            given.append(token)
            continue
        option, has_value, inline = token.partition("=")
        if option not in options:
            return None  # --help, --, an unknown or short option: typer's to answer
        keyword, takes = options[option]
        if takes == "flag":
            if has_value:
                return None  # click refuses a value for a flag
            values[keyword] = True
            continue
        if not has_value:
            if index == len(rest):
                return None  # the option lacks its value: typer's usage error
            inline = rest[index]  # click takes the next argument as the value, whatever it looks like
            index += 1
        if takes == "values":
            values.setdefault(keyword, []).append(inline)
        else:
            values[keyword] = inline  # given twice: click keeps the last
    if not required <= len(given) <= len(positionals):
        return None
    values.update(zip(positionals, given, strict=False))  # an optional one may be left out
    return command, values


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
