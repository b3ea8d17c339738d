"""Pages to HTML: the Jinja2 templates, the static files, and the Content-Security-Policy.

Every value from a capture reaches HTML through a template with autoescape on (names, tags,
metadata, stored source, report text): it renders as text, never as markup. The server sends
``SERVER_CSP``: scripts, styles and connections only from the server itself (the vendored htmx,
``ui.js``'s copy buttons and ``ui.css``; no inline script, no inline style, no ``eval``), images only from it and ``data:``, no
frames, no forms to elsewhere. The self-contained file (:func:`standalone_page`) carries its own
policy in a ``<meta>`` tag: no script at all, its one inline stylesheet allowed by hash, images
only ``data:``, so opening it fetches nothing.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from urllib.parse import quote, urlencode

import jinja2
from markupsafe import Markup

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
# The only files /static/ serves: named here, read from the package, never a path from a request.
STATIC_TYPES = {"htmx.min.js": "text/javascript; charset=utf-8", "ui.css": "text/css; charset=utf-8",
                "htmx.LICENSE.txt": "text/plain; charset=utf-8", "ui.js": "text/javascript; charset=utf-8"}
SERVER_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
              "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
# htmx's settings, read from a <meta> tag: no eval (hx-on, js: values), no scripts from responses,
# no style element of its own (the policy would refuse it), requests to this server only.
HTMX_CONFIG = ('{"allowEval": false, "allowScriptTags": false, "includeIndicatorStyles": false, '
               '"selfRequestsOnly": true, "historyCacheSize": 0, "refreshOnHistoryMiss": true}')


@functools.cache
def static_file(name: str) -> bytes:
    """A file of :data:`STATIC_TYPES`, read once.

    Raises:
        KeyError: any other name.
    """
    if name not in STATIC_TYPES:
        raise KeyError(name)
    return (STATIC / name).read_bytes()


def ref_path(ref: str) -> str:
    """A ref in a URL path: ``demo/top_mlp:v1`` stays readable, anything else is quoted."""
    return quote(ref, safe="/:")


def query(params: Mapping[str, object]) -> str:
    """``?a=1&b=x`` (empty for no parameters)."""
    return "?" + urlencode(params) if params else ""


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,  # every template, every value: capture strings are text, never markup
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["refpath"] = ref_path
    env.filters["query"] = query
    env.globals["htmx_config"] = HTMX_CONFIG
    return env


def render(template: str, context: Mapping[str, object], *, standalone: bool = False, allow_run: bool = False,
           allow_write: bool = False, csrf: str = "") -> str:
    """One page (or fragment) as HTML.

    Args:
        template: the template's file name in ``templates/``.
        context: the page's data (:mod:`.pages`).
        standalone: the self-contained form (no links to the server, no script); see
            :func:`standalone_page` for the whole file.
        allow_run: show the action buttons (the server runs with ``--allow-run``).
        allow_write: show the forms that edit aliases, tags and descriptions (``--allow-write``).
        csrf: the server's form token, put into every form that changes something.
    """
    page = {**context, "standalone": standalone, "allow_run": allow_run and not standalone,
            "allow_write": allow_write and not standalone, "csrf": csrf,
            "inline_style": Markup(_css()) if standalone else None, "csp": standalone_csp() if standalone else None}
    return environment().get_template(template).render(page)


FIRST_PIECE = 4096  # bytes of a streamed page sent first: its head, filters and first rows
PIECE = 65536


def stream(template: str, context: Mapping[str, object], *, allow_run: bool = False, allow_write: bool = False,
           csrf: str = "") -> Iterator[bytes]:
    """:func:`render` of a server page, in pieces as the template produces them: the first
    :data:`FIRST_PIECE` bytes as soon as they are there, then :data:`PIECE` at a time (the template's
    own pieces are a few bytes each: sent one by one, 500 rows were thousands of messages).
    ``context`` is complete before the first piece: a page that cannot be made fails before any
    byte is sent, with its error page."""
    page = {**context, "standalone": False, "allow_run": allow_run, "allow_write": allow_write, "csrf": csrf,
            "inline_style": None, "csp": None}
    pieces: list[str] = []
    size, limit = 0, FIRST_PIECE
    for text in environment().get_template(template).generate(page):
        pieces.append(text)
        size += len(text)
        if size >= limit:
            yield "".join(pieces).encode()
            pieces, size, limit = [], 0, PIECE
    if pieces:
        yield "".join(pieces).encode()


@functools.cache
def _css() -> str:
    return static_file("ui.css").decode("utf-8")


def standalone_csp() -> str:
    """The policy of a self-contained file: its inline stylesheet by hash, ``data:`` images, nothing else."""
    digest = base64.b64encode(hashlib.sha256(_css().encode("utf-8")).digest()).decode("ascii")
    return f"default-src 'none'; style-src 'sha256-{digest}'; img-src data:; base-uri 'none'; form-action 'none'"


def standalone_page(capture_context: Mapping[str, object], reports_context: Mapping[str, object]) -> str:
    """A capture page and its reports in one self-contained HTML file (``modulelens report``)."""
    keys = ("report_list", "history_plot", "report_count", "report_problems", "history_counted")
    return render("standalone.html", {**capture_context, **{k: reports_context[k] for k in keys}}, standalone=True)
