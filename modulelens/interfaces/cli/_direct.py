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

A plain ``ls`` or ``show`` first goes one step further: ``_quick_ls.py`` lists a local repo in its
plain state from its index files, and ``_quick_show.py`` reads and checks one version's
``capture.json``, without importing the repo package (each declining anything else, having printed
nothing, to ``browse.py``); and ``--version`` alone is answered here, as the root callback answers it.
"""

from __future__ import annotations

import sys

_TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~2 ms of a fresh start)
if _TYPE_CHECKING:
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

    Read from :data:`COMMANDS` in the shapes click reads the same way: an option spelled whole
    (``--repo DIR`` or ``--repo=DIR``; no abbreviation), a flag without a value, arguments anywhere
    between them, the last of a repeated single-valued option winning. Anything else (``--help``,
    ``--``, a number such as ``-1``, an unknown option, a value that starts with ``-``, too few or too
    many arguments) is declined for typer to answer as usual. A hand-read table and not argparse:
    argparse's import, its translations and its help formatter (which imports shutil, bz2 and lzma)
    took 4 ms of a ~30 ms ``ls``, and it accepts shapes click refuses (abbreviations).

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
    options, positionals, required = COMMANDS[argv[0]]
    keywords: dict[str, Any] = {}
    arguments: list[str] = []
    tokens = iter(argv[1:])
    for token in tokens:
        if not token.startswith("-") or token == "-":
            arguments.append(token)
            continue
        spelling, given, value = token.partition("=")
        if spelling not in options:
            return None
        keyword, takes = options[spelling]
        if takes == "flag":
            if given:
                return None  # click refuses a value for a flag
            keywords[keyword] = True
            continue
        if not given:
            following = next(tokens, None)
            if following is None or (following.startswith("-") and following != "-"):
                return None  # click would take `--json` as the value, or say the value is missing
            value = following
        if takes == "values":
            keywords.setdefault(keyword, []).append(value)
        else:
            keywords[keyword] = value
    if not required <= len(arguments) <= len(positionals):
        return None
    keywords.update(zip(positionals, arguments, strict=False))  # the optional ones may be absent
    return argv[0], keywords


def run(argv: list[str]) -> bool:
    """Run ``argv`` on the direct path when :func:`parse` accepts it (or it is ``--version`` alone),
    exiting as the typer command would.

    Args:
        argv: the arguments after the program name.

    Returns:
        False when the command line is typer's to run (nothing was done); otherwise it exits.
    """
    if argv == ["--version"]:  # what the root callback prints (root.py), without building the app
        from modulelens import __version__

        sys.exit(_write(f"modulelens {__version__}\n"))
    parsed = parse(argv)
    if parsed is None:
        return False
    command, keywords = parsed
    if command == "ls":
        from modulelens.interfaces.cli._quick_ls import listing_text

        text = listing_text(keywords)  # a plain local repo, from its index files alone; else None
        if text is not None:
            sys.exit(_write(text))
    if command == "show":
        from modulelens.interfaces.cli._quick_show import printer

        show = printer(keywords)  # a plain show of a local repo, read and checked without the repo package
        if show is not None:
            sys.exit(run_reporting(command, show, {}))
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


def _write(text: str) -> int:
    """Print ``text`` as ``output.echo`` prints (flushed at once); the exit code, 1 when the reader
    left the pipe (ended quietly, as :func:`run_reporting` ends it)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        from modulelens.interfaces.cli._errors import silence_stdout

        silence_stdout()
        return 1
    return 0
