"""Browser commands: ``ui`` (a local web app over a repo) and ``report`` (one capture as an HTML file).

The web stack is the optional extra ``modulelens[ui]``, imported inside the commands only:
``--help``, ``ls`` and the other commands never import it (tests/interfaces/test_cli.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from modulelens.errors import MissingDependencyError, UsageError
from modulelens.interfaces import session
from modulelens.interfaces.cli._command import command
from modulelens.interfaces.cli._options import JsonOpt, RepoOpt
from modulelens.interfaces.output import emit, err_console

app = typer.Typer()

_EXTRA = "pip install 'modulelens[ui]'"


def _require(what: str, *modules: str) -> None:
    """Raise a one-line error naming the extra when a package of the web stack is missing."""
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingDependencyError(f"modulelens {what} needs {module}: {_EXTRA}") from None


@command(app, "ui")
def ui_cmd(
    repo: RepoOpt = None,
    host: Annotated[str, typer.Option(
        help="Address to serve on. Anything but a loopback address prints a token that every request must carry.")]
        = "127.0.0.1",
    port: Annotated[int | None, typer.Option(help="Port (default 8765, or the next free one).")] = None,
    allow_run: Annotated[bool, typer.Option(
        "--allow-run", help="Offer replay and profile buttons: they rebuild modules and run them (in a child "
                            "process, under the repo's trust setting). Off by default: the UI is read-only.")] = False,
    allow_write: Annotated[bool, typer.Option(
        "--allow-write", help="Offer forms that set and remove aliases, add and remove tags and edit descriptions "
                              "(they change the repo, and run nothing from it). Off by default: the UI is read-only.")]
        = False,
    open_browser: Annotated[bool | None, typer.Option(
        "--open/--no-open", help="Open the browser (default: when run from a terminal).")] = None,
) -> None:
    """Browse a repo in a web browser: captures, tensors, distributions, diffs, reports (read-only by default)."""
    # One intra-op thread for torch, set before torch is imported (a thread's own setting does not reach
    # the server's worker threads): a page's statistics are of small samples, and on a busy 2-core
    # machine two OpenMP threads per op made each 40x slower (3 ms -> 94 ms for an isfinite of
    # 262,144 values). Replay and profile run in their own processes, with the user's settings.
    user_threads = os.environ.get("OMP_NUM_THREADS")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _require("ui", "starlette", "uvicorn", "jinja2")
    from modulelens.interfaces.ui.repo_view import RepoView
    from modulelens.interfaces.ui.server import DEFAULT_PORT, UiSettings, is_loopback, new_token, serve

    settings = UiSettings(host=host, port=DEFAULT_PORT if port is None else port, allow_run=allow_run,
                          allow_write=allow_write, token=None if is_loopback(host) else new_token())
    view = RepoView(session.open_repo(repo, create=repo is None))
    interactive = session.interactive()
    serve(view, settings, explicit_port=port is not None, open_browser=interactive if open_browser is None else open_browser,
          action_threads=user_threads, announce=lambda line: err_console.print(line, highlight=False, soft_wrap=True, markup=False))


@command(app, "report")
def report_cmd(
    ref: Annotated[str, typer.Argument(help="NAME[:vN|:alias]")],
    output: Annotated[str, typer.Option("--output", "-o", help="The HTML file to write.")],
    repo: RepoOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Save one capture's page (tensors, distributions, calls, source, reports) as a self-contained HTML file."""
    _require("report", "jinja2")
    from modulelens.interfaces.ui.export import standalone_html
    from modulelens.interfaces.ui.repo_view import RepoView

    target = Path(output)
    if target.is_dir():
        raise UsageError(f"-o {output}: is a folder; give a file name such as capture.html")
    store, given = session.open_ref(ref, repo)
    name, version = session.resolve(store, given)
    view = RepoView(store, scan_jobs=False)
    html = standalone_html(view, view.capture(name, version))
    target.write_text(html, encoding="utf-8")
    emit("report", as_json, {"ref": f"{name}:v{version}", "path": str(target), "bytes": len(html.encode())},
         lambda r: typer.echo(f"wrote {r['path']} ({r['bytes']:,} bytes): {r['ref']}, self-contained"))
