"""The ``modulelens ui`` server: a Starlette app over one repo, served by uvicorn.

Safe by default (docs/ui.md, "Security model"):

* it binds 127.0.0.1 and answers only requests whose ``Host`` is that address (a web page cannot
  reach it through DNS rebinding);
* on any other ``--host`` it makes a token, prints it in the URL, and refuses every request that
  does not carry it (``?token=`` once, which sets an HttpOnly same-site cookie, or
  ``Authorization: Bearer``);
* it is read-only: GET pages only, unless ``--allow-run``, which adds the action forms (POST,
  with a per-server form token and a same-origin check) that run replay/profile in a child process,
  or ``--allow-write``, which adds the forms that edit aliases, tags and descriptions (POST, the
  same token and check);
* every response carries a strict Content-Security-Policy (:data:`.render.SERVER_CSP`), and every
  page escapes every string from a capture;
* it serves no file by path: pages come from the repo through its API, and ``/static/`` only the
  files named in :data:`.render.STATIC_TYPES`.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import logging
import re
import secrets
import socket
import sys
import threading
import webbrowser
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modulelens.errors import (
    CaptureNotFoundError,
    CorruptCaptureError,
    InvalidNameError,
    ModulelensError,
    RepoBusyError,
    UsageError,
)
from modulelens.interfaces.ui import diff_page, discovery, home, pages, render, report_pages
from modulelens.interfaces.ui.actions import KINDS, JobRunner
from modulelens.interfaces.ui.export import standalone_html
from modulelens.interfaces.ui.repo_view import RepoView, StoredCapture

TOKEN_COOKIE = "modulelens_ui_token"
# The edits of a server started with --allow-write: POST /edit/<what>, each one call of the repo.
_EDITS = ("alias", "unalias", "tag", "untag", "describe")
DEFAULT_PORT = 8765
_PORT_TRIES = 20


@dataclass(frozen=True)
class UiSettings:
    """How a server runs.

    Args:
        host: the address to bind; anything but a loopback address needs the token.
        port: the port (``0``: any free one).
        allow_run: offer replay/profile/diff-outputs actions (they run code from the repo's captures).
        token: the token every request must carry, or ``None`` (loopback only).
        allow_write: offer the forms that set and remove aliases, add and remove tags and edit
            descriptions (they change the repo; they run nothing from it).
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    allow_run: bool = False
    token: str | None = None
    allow_write: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise UsageError(f"--port must be 0-65535, not {self.port}")
        if not is_loopback(self.host) and not self.token:
            raise UsageError(f"serving on {self.host} needs a token (only loopback addresses are served without one)")


# What a browser sends as Host: a name or IPv4 address, or a bracketed IPv6 address, and an optional
# port of digits. Anything else (``127.0.0.1:8765@evil.com``, ``localhost:8765.evil.com``) is refused
# before its host part is looked at: no browser sends it, and a loose parse took a prefix of it.
_HOST_HEADER = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)"
                          r"(?::[0-9]{1,5})?")


def host_of(header: str) -> str | None:
    """The host of a ``Host`` header of the form ``host[:digits]`` (``[v6][:digits]``), or ``None``.

    Example::

        host_of("127.0.0.1:8765"), host_of("[::1]:8765"), host_of("127.0.0.1:8765@evil.com")
        # ('127.0.0.1', '[::1]', None)
    """
    found = _HOST_HEADER.fullmatch(header)
    return found["host"] if found else None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def new_token() -> str:
    return secrets.token_urlsafe(24)


# ------------------------------------------------------------------------------------------ app


def create_app(view: RepoView, settings: UiSettings, runner: JobRunner | None = None) -> Starlette:
    """The web app over ``view``'s repo (started by :func:`serve`; tests and benchmarks call it directly)."""
    ui = _Ui(view, settings, runner or JobRunner(view.location))
    routes = [
        Route("/", ui.repo),
        Route("/job-cells", ui.job_cells),
        Route("/name/{name:path}", ui.name),
        Route("/capture/{rest:path}", ui.capture_routes),
        Route("/diff", ui.diff),
        Route("/diff/histogram", ui.diff_histogram),
        Route("/edit/{what}", ui.edit, methods=["POST"]),
        Route("/static/{name}", ui.static),
        Route("/actions/{kind}", ui.action, methods=["POST"]),
        Route("/jobs", ui.jobs),
        Route("/jobs/{job_id:int}", ui.job),
        Route("/jobs/{job_id:int}/status", ui.job_status),
    ]
    app = Starlette(routes=routes, exception_handlers={ModulelensError: ui.error, 404: ui.not_found, 405: ui.not_allowed})
    app.add_middleware(_Serving, view=view)
    app.add_middleware(_Guard, settings=settings)
    app.state.ui = ui
    return app


class _Ui:
    """The routes, sharing the repo view, the settings and the action runner."""

    def __init__(self, view: RepoView, settings: UiSettings, runner: JobRunner) -> None:
        self.view = view
        self.settings = settings
        self.runner = runner
        self.csrf = secrets.token_urlsafe(24)

    def page(self, template: str, context: Mapping[str, object], status: int = 200) -> HTMLResponse:
        html = render.render(template, {"repo": self.view.location, **context}, allow_run=self.settings.allow_run,
                             allow_write=self.settings.allow_write, csrf=self.csrf)
        return HTMLResponse(html, status_code=status)

    def _capture(self, ref: str) -> StoredCapture:
        name, version = self.view.resolve(ref)
        return self.view.capture(name, version)

    # ---------------------------------------------------------------------------- pages

    def repo(self, request: Request) -> Response:
        """The repo page, streamed: up to 500 rows, and its first bytes before the rows are rendered."""
        query = pages.RepoQuery.from_params(request.query_params)
        context = {"repo": self.view.location, **pages.repo_page(self.view, query)}
        return StreamingResponse(render.stream("repo.html", context, allow_run=self.settings.allow_run,
                                               allow_write=self.settings.allow_write, csrf=self.csrf),
                                 media_type="text/html; charset=utf-8")

    def job_cells(self, request: Request) -> Response:
        """The repo page's job column as it is known now (the page polls it while a cell is pending)."""
        query = pages.RepoQuery.from_params(request.query_params)
        return self.page("job_cells.html", pages.job_cells(self.view, query))

    def name(self, request: Request) -> Response:
        name = request.path_params["name"]
        if ":" in name:  # a ref: its name's page
            return RedirectResponse(home.name_href(self.view.resolve(name)[0]), status_code=302)
        return self.page("name.html", home.name_page(self.view, name, pages.page_param(request.query_params, "page")))

    def capture_routes(self, request: Request) -> Response:
        """``/capture/REF``, and under it ``/reports``, ``/export``, ``/provenance``, ``/histogram/TENSOR``, ``/call/N``.

        A name may hold ``/call/`` itself (``team/call/ranker``): the pages under a version are taken
        as such only after a ref with a selector (``NAME:vN``, ``NAME:alias``), as every link writes it."""
        rest = request.path_params["rest"]
        for marker, kind in (("/histogram/", "histogram"), ("/call/", "call")):
            ref, found, tail = rest.rpartition(marker)
            if found and ":" in ref.rpartition("/")[2]:
                return self._version_page(request, ref, kind, tail)
        for suffix in ("/reports", "/export", "/provenance"):
            head = rest[: -len(suffix)]
            if rest.endswith(suffix) and ":" in head:
                return self._version_page(request, head, suffix[1:])
        return self._version_page(request, rest, "capture")

    def _version_page(self, request: Request, ref: str, kind: str, tail: str = "") -> Response:
        name, version = self.view.resolve(ref)
        canonical = f"{name}:v{version}"
        if canonical != ref:  # an alias or no selector: send the reader to the version it is now
            after = {"capture": "", "reports": "/reports", "export": "/export", "provenance": "/provenance",
                     "histogram": f"/histogram/{quote(tail)}",
                     "call": f"/call/{quote(tail)}"}[kind]
            target = f"/capture/{render.ref_path(canonical)}{after}" + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(target, status_code=302)
        capture = self.view.capture(name, version)
        params = request.query_params
        if kind == "histogram":
            return self.page("histogram.html", pages.histogram_of(self.view, capture, tail))
        if kind == "call":
            if not tail.isdigit() or len(tail) > 9:
                raise UsageError(f"a call is numbered 0, 1, ...: not {tail[:40]!r}")
            return self.page("call.html", pages.call_page(self.view, capture, int(tail), params))
        if kind == "provenance":  # the capture page's cell, asked for once the page is shown
            return self.page("provenance_cell.html", {"own": self.view.provenance(capture)})
        if kind == "reports":
            return self.page("reports.html", report_pages.reports_page(self.view, capture, pages.page_param(params, "page")))
        if kind == "export":
            html = standalone_html(self.view, capture)
            filename = f"{name.replace('/', '_')}_v{version}.html"
            return HTMLResponse(html, headers={"Content-Disposition": f'attachment; filename="{quote(filename)}"',
                                               "Content-Security-Policy": render.standalone_csp()})
        return self.page("capture.html", pages.capture_page(self.view, capture, pages.CaptureQuery.from_params(params)))

    def diff(self, request: Request) -> Response:
        a, b = request.query_params.get("a", "").strip(), request.query_params.get("b", "").strip()
        context: dict[str, Any] = {"title": "diff", "a": a, "b": b, "picker": diff_page.picker(self.view, a, b)}
        if a and b:
            context.update(diff_page.diff_page(self.view, self._capture(a), self._capture(b)))
        elif a and not b:  # one given: compare with the version before it
            first = self._capture(a)
            earlier = [v for v in self.view.version_numbers(first.name) if v < first.version]
            if earlier:
                return RedirectResponse(f"/diff?a={quote(first.name)}:v{earlier[-1]}&b={quote(first.ref, safe='/:')}",
                                        status_code=302)
        return self.page("diff.html", context)

    def diff_histogram(self, request: Request) -> Response:
        """Two compared tensors' histograms over each other (a click on a diff row)."""
        params = request.query_params
        a, b = self._capture(params.get("a", "")), self._capture(params.get("b", ""))
        overlay = diff_page.overlay_of(self.view, a, params.get("ta", ""), b, params.get("tb", ""))
        return self.page("overlay.html", {"overlay": overlay})

    def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            body = render.static_file(name)
        except KeyError:
            return self.not_found(request, None)
        return Response(body, media_type=render.STATIC_TYPES[name], headers={"Cache-Control": "max-age=3600"})

    # ---------------------------------------------------------------------------- actions

    async def action(self, request: Request) -> Response:
        form = await self._form(request, self.settings.allow_run, "--allow-run to replay or profile")
        if isinstance(form, Response):
            return form
        kind = request.path_params["kind"]
        if kind not in KINDS:
            return self.not_found(request, None)
        wanted = (form.get("a", ""), form.get("b", "")) if kind == "diff" else (form.get("ref", ""),)
        refs = tuple(self._capture(ref).ref for ref in wanted)  # each must exist; pinned to its version now
        job = self.runner.start(kind, refs)
        return RedirectResponse(f"/jobs/{job.id}", status_code=303)

    async def _form(self, request: Request, allowed: bool, option: str) -> dict[str, str] | Response:
        """A posted form's fields, or the 403 page when the server was not started with ``option``
        or the form does not carry this server's form token (the guard checked its origin)."""
        if not allowed:
            return self.page("error.html", {"title": "read-only", "heading": "this server is read-only",
                                            "message": f"start it with modulelens ui {option}"}, 403)
        form = {k: v[0] for k, v in parse_qs((await request.body()).decode("utf-8", "replace"),
                                              keep_blank_values=True).items()}
        if not hmac.compare_digest(form.get("csrf", ""), self.csrf):
            return self.page("error.html", {"title": "refused", "heading": "refused",
                                            "message": "the form is not from this server (reload the page)"}, 403)
        return form

    async def edit(self, request: Request) -> Response:
        """An alias, tag or description changed from a form (``--allow-write``; the form token and
        the same-origin check as the actions), then back to the page the form was on."""
        form = await self._form(request, self.settings.allow_write, "--allow-write to edit aliases, tags and descriptions")
        if isinstance(form, Response):
            return form
        what = request.path_params["what"]
        if what not in _EDITS:
            return self.not_found(request, None)
        name, version = self.view.resolve(form.get("ref", ""))  # it must exist; an alias is pinned to its version now
        ref = f"{name}:v{version}"
        value = form.get("value", "").strip()
        if what == "describe":
            self.view.describe(ref, form.get("value", ""), form.get("expected", ""))
        else:
            if not value:
                raise UsageError(f"{what}: give a name")
            change = {"alias": self.view.set_alias, "unalias": self.view.remove_alias, "tag": self.view.tag,
                      "untag": self.view.untag}[what]
            try:
                change(ref, value)
            except InvalidNameError as error:  # a name typed into the form: the form's mistake (400), not a missing page
                raise UsageError(str(error)) from None
        target = home.name_href(name) if form.get("back") == "name" else f"/capture/{render.ref_path(ref)}"
        return RedirectResponse(target + {"describe": "#notes", "tag": "#notes", "untag": "#notes"}.get(what, ""),
                                status_code=303)

    def jobs(self, request: Request) -> Response:
        return self.page("jobs.html", {"title": "actions", "jobs": [j.view() for j in self.runner.jobs()]})

    def job(self, request: Request) -> Response:
        job = self.runner.get(request.path_params["job_id"])
        if job is None:
            return self.not_found(request, None)
        return self.page("job.html", {"title": f"{job.kind} {job.target}", "job": job.view()})

    def job_status(self, request: Request) -> Response:
        job = self.runner.get(request.path_params["job_id"])
        if job is None:
            return self.not_found(request, None)
        return self.page("job_status.html", {"job": job.view()})

    # ---------------------------------------------------------------------------- errors

    def error(self, request: Request, error: Exception) -> Response:
        status = 404 if isinstance(error, (CaptureNotFoundError, InvalidNameError)) else \
            400 if isinstance(error, UsageError) else 422 if isinstance(error, CorruptCaptureError) else \
            409 if isinstance(error, RepoBusyError) else 500
        heading = {404: "not found", 400: "bad request", 422: "damaged", 409: "changed meanwhile"}.get(status, "cannot show this")
        return self.page("error.html", {"title": heading, "heading": heading, "message": str(error)}, status)

    def not_found(self, request: Request, error: Exception | None) -> Response:
        return self.page("error.html", {"title": "not found", "heading": "not found",
                                        "message": f"nothing at {request.url.path}"}, 404)

    def not_allowed(self, request: Request, error: Exception | None) -> Response:
        return self.page("error.html", {"title": "not allowed", "heading": "not allowed",
                                        "message": f"{request.method} is not accepted here"}, 405)


# ------------------------------------------------------------------------------------------ guard

_HEADERS = [
    (b"content-security-policy", render.SERVER_CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


class _Serving:
    """ASGI middleware that marks each page in flight (:meth:`RepoView.serving`), so that background
    work waits for it. Style sheets, scripts and the repo page's polls of its job column are not
    pages: the job column's background read must not wait for its own polls."""

    _NOT_PAGES = ("/static/", "/job-cells", "/jobs/")

    def __init__(self, app: ASGIApp, view: RepoView) -> None:
        self.app = app
        self.view = view

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or str(scope.get("path", "")).startswith(self._NOT_PAGES):
            await self.app(scope, receive, send)
            return
        with self.view.serving():
            await self.app(scope, receive, send)


class _Guard:
    """ASGI middleware in front of every route: the host check, the token, the methods, and the
    security headers on every response (error pages included)."""

    def __init__(self, app: ASGIApp, settings: UiSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            status, message = refusal
            await _plain(send, status, message)
            return
        token_in_query = self._token_in_query(scope)
        if token_in_query:  # remember it in a cookie, and take it out of the address bar
            rest = "&".join(p for p in scope.get("query_string", b"").decode("latin-1").split("&")
                            if p and not p.startswith("token="))
            await send({"type": "http.response.start", "status": 303, "headers": [
                (b"location", (same_origin_path(scope.get("path", "/")) + (f"?{rest}" if rest else "")).encode("latin-1")),
                (b"set-cookie", f"{TOKEN_COOKIE}={self.settings.token}; HttpOnly; SameSite=Strict; Path=/".encode()),
                *_HEADERS]})
            await send({"type": "http.response.body", "body": b""})
            return
        started = False

        async def with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                present = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in _HEADERS if h[0] not in present)]
            await send(message)

        try:
            await self.app(scope, receive, with_headers)
        except Exception as error:  # a bug: answered here, so that the error page carries the headers too
            _log.exception("modulelens ui: %s %s failed", scope.get("method"), scope.get("path"))
            if started:
                raise
            await _plain(send, 500, f"cannot show this page: an internal error ({type(error).__name__}); "
                                    "the server's log has the traceback")

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str] | None:
        settings = self.settings
        host = host_of(headers.get("host", ""))
        if host is None:
            return 400, "malformed Host header (expected host[:port])"
        if is_loopback(settings.host) and not is_loopback(host):
            return 421, "this server answers only at its loopback address"
        if scope["method"] not in ("GET", "HEAD", "POST"):
            return 405, "method not allowed"
        if scope["method"] == "POST":
            if not scope.get("path", "").startswith(("/actions/", "/edit/")):
                return 405, "method not allowed"
            # A form of another site posting here (CSRF) is refused by its origin, by the browser's
            # Sec-Fetch-Site, and, whatever the browser sends, by the form token (_Ui.action).
            origin = headers.get("origin")
            if origin not in (None, "null") and origin.split("://", 1)[-1] != headers.get("host"):
                return 403, "cross-origin request refused"
            if headers.get("sec-fetch-site") not in (None, "same-origin"):
                return 403, "cross-site request refused"
        if settings.token and not self._carries_token(scope, headers):
            return 401, "this server needs its token: open the address modulelens ui printed (it ends in ?token=...)"
        return None

    def _token_in_query(self, scope: Scope) -> bool:
        if not self.settings.token:
            return False
        query = scope.get("query_string", b"").decode("latin-1")
        return any(hmac.compare_digest(p, f"token={self.settings.token}") for p in query.split("&") if p.startswith("token="))

    def _carries_token(self, scope: Scope, headers: dict[str, str]) -> bool:
        token = self.settings.token or ""
        if self._token_in_query(scope):
            return True
        bearer = headers.get("authorization", "")
        if bearer.startswith("Bearer ") and hmac.compare_digest(bearer[7:].strip(), token):
            return True
        for part in headers.get("cookie", "").split(";"):
            key, _, value = part.strip().partition("=")
            if key == TOKEN_COOKIE and hmac.compare_digest(value, token):
                return True
        return False


def same_origin_path(path: str) -> str:
    """``path`` as a redirect target that stays on this server: one leading slash, quoted.

    ``//evil.com`` (or ``/\\evil.com``) in a ``Location`` header is a protocol-relative address of
    another site; the path of a request may start that way, so its leading slashes are collapsed.

    Example::

        same_origin_path("//evil.com/x")   # '/evil.com/x'
    """
    return "/" + quote(path.lstrip("/\\"), safe="/:%")


_log = logging.getLogger("modulelens.ui")


async def _plain(send: Send, status: int, message: str) -> None:
    body = message.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                            *_HEADERS]})
    await send({"type": "http.response.body", "body": body})


# ------------------------------------------------------------------------------------------ serve


def _warm_up(view: RepoView) -> None:
    """Import what the first pages need while nobody waits: the templates, and matplotlib (about a
    second on its own; the first reports page paid it), once no page is being served (a first page
    that shared the interpreter with the import took that much longer)."""
    view.wait_until_quiet()
    for template in ("repo.html", "name.html", "capture.html", "reports.html", "call.html", "diff.html", "error.html"):
        render.environment().get_template(template)
    view.wait_until_quiet()
    with contextlib.suppress(ImportError):
        import matplotlib.figure  # noqa: F401


def bind(host: str, port: int, *, explicit: bool) -> socket.socket:
    """A listening socket at ``host:port``; the default port moves up to the next free one.

    Raises:
        UsageError: the port is taken (an explicit ``--port``), or nothing free near the default.
    """
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    tries = 1 if explicit or port == 0 else _PORT_TRIES
    last: OSError | None = None
    for candidate in range(port, port + tries):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), candidate))
        except OSError as error:
            sock.close()
            last = error
            continue
        sock.listen(128)
        return sock
    raise UsageError(f"cannot listen on {host}:{port}{'' if tries == 1 else f'-{port + tries - 1}'}: {last} "
                     "(another modulelens ui? pick one with --port)")


def serve(view: RepoView, settings: UiSettings, *, explicit_port: bool, open_browser: bool,
          action_threads: str | None = None, announce: Callable[[str], None] = print) -> None:
    """Serve ``view`` until interrupted; announce the URL (discovery file, terminal, browser).
    ``action_threads``: ``OMP_NUM_THREADS`` for the actions' processes (``None``: torch's default)."""
    import uvicorn

    sock = bind(settings.host, settings.port, explicit=explicit_port)
    port = sock.getsockname()[1]
    host = settings.host if ":" not in settings.host.strip("[]") else f"[{settings.host.strip('[]')}]"
    url = f"http://{host}:{port}"
    runner = JobRunner(view.location, action_threads)
    app = create_app(view, settings, runner)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
    try:
        marker: Path | None = discovery.announce(url, view.location, settings.token)
    except OSError as error:  # the server works without it; only `show`'s link to it is lost
        marker = None
        announce(f"note: not announced for `modulelens show` to link to: {error}")
    visit = f"{url}/?token={settings.token}" if settings.token else f"{url}/"
    mode = ", ".join([*(["actions enabled (--allow-run)"] if settings.allow_run else []),
                      *(["editing enabled (--allow-write)"] if settings.allow_write else [])]) or "read-only"
    announce(f"modulelens ui: {view.location} at {visit} ({mode}; Ctrl+C to stop)")
    if settings.token:
        announce("serving beyond this machine: every request must carry the token in that address")
    if open_browser:
        threading.Timer(0.5, lambda: webbrowser.open(visit)).start()
    threading.Thread(target=_warm_up, args=(view,), name="modulelens-ui-warm-up", daemon=True).start()
    try:
        server.run(sockets=[sock])
    finally:
        if marker is not None:
            discovery.withdraw(marker)
        runner.stop()
        with contextlib.suppress(OSError):
            sock.close()
        sys.stdout.flush()
