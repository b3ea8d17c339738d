"""The web UI under hostile and huge captures (issue 35, items 1, 5, 6, 7 and 9), four rows of
``python -m stress``:

* **links**: the announcement ``modulelens show`` reads (``ui-<pid>.json``, with the token) is
  written while the folder is a link to another folder, a file, a folder open to everyone or one of
  another user's, and while ``ui-<pid>.json`` or its old fixed staging name ``.ui-<pid>.json.tmp``
  is a link to a file of the user's; and a real ``modulelens ui`` is started with the folder a
  link. **wrong**: a write that landed outside the folder (the victim changed, a file appeared in
  the link's target), the token left in a folder others can enter, or a server that did not start.
* **errors and headers**: received reports of every wrong field type (``max_abs_error`` a list,
  ``latency`` a string, a report that is a list, not JSON, nested 100,000 deep), a shape-only
  tensor whose statistics are strings and lists, plots titled with deep mathtext, and requests
  with bad parameters, through every page of a real server. **wrong**: a 500, a response without
  the security headers (CSP, nosniff, frame-ancestors), a hostile report neither shown nor named.
* **sizes**: a capture of 50,000 calls, one with a call of a million leaves, one with 3,000
  stored reports, every page of each (capture, its other pages, a call, reports, saved file, diff).
  **wrong**: a page over 5 MiB or, once the capture is open (its ``capture.json`` read and checked
  once per server), slower than 2 s; the first (cold) time of each page is in the notes.
* **token and Host**: Host headers a loose parser took (``127.0.0.1:PORT@evil.com``,
  ``localhost:PORT.evil.com``...), ``GET //evil.com?token=T`` and its variants on a server with a
  token, and the links ``modulelens show`` prints. **wrong**: a hostile Host answered, a redirect
  off the server, the token in ``show``'s output.

Run on the code before the fix (docs/reliability.md has the numbers), each row failed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from stress.table import Row

HEADERS = ("content-security-policy", "x-content-type-options", "x-frame-options")
PAGE_BYTES = 5 * 2**20
PAGE_SECONDS = 2.0


# ------------------------------------------------------------------------------------------ links


@contextlib.contextmanager
def _runtime(folder: Path) -> Iterator[Path]:
    """``$XDG_RUNTIME_DIR`` pointed at ``folder`` for the block (where ``announce`` writes)."""
    before = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(folder)
    try:
        yield folder / "modulelens"
    finally:
        if before is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = before


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} if folder.is_dir() else {}


def ui_links_row(tmp: Path) -> Row:
    """The discovery file under planted links: nothing written outside its folder."""
    from modulelens.interfaces.ui import discovery

    row = Row("UI discovery file under planted links and open folders (issue 35.1)")
    start = time.perf_counter()
    pid = os.getpid()
    cases = ["folder is a link to another folder", "folder is a dangling link", "staging name is a link to a file",
             "announcement name is a link to a file", "folder open to everyone (0777)", "folder is a file"]
    if os.getuid() == 0:
        cases.append("folder belongs to another user")
    for i, case in enumerate(cases):
        row.tried += 1
        base = tmp / f"ui-links-{i}"
        victim_dir, runtime = base / "victim", base / "runtime"
        victim_dir.mkdir(parents=True)
        runtime.mkdir()
        victim = victim_dir / "precious.txt"
        victim.write_text("the user's own file")
        folder = runtime / "modulelens"
        if case == "folder is a link to another folder":
            folder.symlink_to(victim_dir)
        elif case == "folder is a dangling link":
            folder.symlink_to(victim_dir / "missing")
        elif case == "folder is a file":
            folder.write_text("x")
        else:
            folder.mkdir(mode=0o700)
            if case == "staging name is a link to a file":
                (folder / f".ui-{pid}.json.tmp").symlink_to(victim)
            elif case == "announcement name is a link to a file":
                (folder / f"ui-{pid}.json").symlink_to(victim)
            elif case == "folder open to everyone (0777)":
                os.chmod(folder, 0o777)
            elif case == "folder belongs to another user":
                os.chown(folder, 65534, 65534)
        before = _snapshot(victim_dir)
        problem = ""
        written: Path | None = None
        with _runtime(runtime):
            try:
                written = discovery.announce("http://127.0.0.1:9", "/repo", "secret-token")
            except OSError:
                written = None  # refused: the server runs on without announcing itself (fine)
            except Exception as error:  # anything else would end the server
                problem = f"{type(error).__name__}: {error}"
        after = _snapshot(victim_dir)
        if after != before:
            problem = f"wrote outside the folder: {sorted(set(after) ^ set(before)) or 'the victim changed'}"
        elif victim.read_text() != "the user's own file":
            problem = "the victim file changed"
        elif written is not None:
            mode = stat.S_IMODE(os.lstat(written.parent).st_mode)
            owner = os.lstat(written.parent).st_uid
            if os.path.islink(written.parent) or mode & 0o077 or owner != os.getuid():
                problem = f"the token was written into a folder others can reach (mode {oct(mode)}, uid {owner})"
            elif "secret-token" not in written.read_text():
                problem = "the announcement was not written"
        if problem:
            row.wrong += 1
            row.notes.append(f"{case}: {problem}"[:200])
        else:
            row.survived += 1
    _server_with_linked_folder(tmp, row)
    row.seconds = time.perf_counter() - start
    return row


def _server_with_linked_folder(tmp: Path, row: Row) -> None:
    """A real ``modulelens ui`` whose discovery folder is a link: it must start, answer, and write
    nothing into the link's target."""
    import modulelens
    from stress.browser import ui_server
    from stress.hostile import make_base_capture

    row.tried += 1
    base = tmp / "ui-links-server"
    victim_dir, runtime = base / "victim", base / "runtime"
    victim_dir.mkdir(parents=True)
    runtime.mkdir()
    (runtime / "modulelens").symlink_to(victim_dir)
    repo = modulelens.Repo(base / "repo")
    make_base_capture(repo, "links/plain")
    try:
        with ui_server(repo.location, env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)}) as server:
            status = _get(server.url, "/")[0]
    except (RuntimeError, OSError) as error:
        row.wrong += 1
        row.notes.append(f"a server with a linked discovery folder: {error}"[:200])
        return
    if list(victim_dir.iterdir()) or status != 200:
        row.wrong += 1
        row.notes.append(f"a server with a linked discovery folder wrote {[p.name for p in victim_dir.iterdir()]}, "
                         f"answered {status}")
    else:
        row.survived += 1


# ------------------------------------------------------------------------------------------ http


def _get(url: str, path: str, *, host: str | None = None, timeout: float = 120.0,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes, float]:
    """``GET path`` sent as it is (no normalising of ``//`` or of the Host header): status, headers
    (lower-case names), body, seconds."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    start = time.perf_counter()
    try:
        connection.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        connection.putheader("Host", host if host is not None else parts.netloc)
        for key, value in (headers or {}).items():
            connection.putheader(key, value)
        connection.endheaders()
        response = connection.getresponse()
        body = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body, time.perf_counter() - start
    finally:
        connection.close()


# ------------------------------------------------------------------------------------------ errors


def _hostile_reports(repo: Any, ref: str) -> list[str]:
    """Reports of every wrong type stored with ``ref`` the way a pull would have brought them (files
    in its reports folder); returns their file names."""
    from stress.huge_captures import MATHTEXT

    name, version = repo.resolve(ref)
    folder = repo.version_path(name, version) / "reports"
    folder.mkdir(exist_ok=True)
    bodies: dict[str, Any] = {
        "verify-1-abs-of-a-list.json": {"kind": "verify", "passed": False, "calls": [{"index": 0, "max_abs_error": [1, 2]}]},
        "verify-2-calls-not-objects.json": {"kind": "verify", "calls": [1, "x", None]},
        "verify-3-passed-a-string.json": {"kind": "verify", "passed": "yes", "created": 7, "notes": "not a list"},
        "profile-1-latency-a-string.json": {"kind": "profile", "latency": "fast", "top_ops": "x", "batch_sweep": [1]},
        "profile-2-numbers-as-lists.json": {"kind": "profile", "latency": {"median_ms": [1], "iterations": "3"},
                                            "memory": {"peak_bytes": "big"}, "batch_sweep": [{"batch_size": "8",
                                                                                              "median_ms": {}}]},
        "profile-3-mathtext.json": {"kind": "profile", "ref": MATHTEXT, "device": MATHTEXT, "mode": MATHTEXT,
                                    "created": "2026" + MATHTEXT, "latency": {"median_ms": 1.0, "p10_ms": 1.0,
                                                                                "p90_ms": 1.0, "iterations": 3},
                                    "batch_sweep": [{"batch_size": 1, "median_ms": 1.0, "p10_ms": 1.0, "p90_ms": 1.0,
                                                     "throughput_per_s": 1.0}]},
        "profile-4-nan-strings.json": {"kind": "profile", "latency": {"median_ms": "nan", "p10_ms": "inf",
                                                                      "p90_ms": "-inf", "iterations": 3},
                                       "batch_sweep": [{"batch_size": 2, "median_ms": "nan", "p10_ms": "nan",
                                                        "p90_ms": "nan", "throughput_per_s": "nan"}]},
        "kernel-1-a-list.json": [1, 2, 3],
        "replay-1-kind-a-list.json": {"kind": ["replay"], "calls": {"0": "pass"}},
    }
    for filename, body in bodies.items():
        (folder / filename).write_text(json.dumps(body))
    (folder / "verify-4-not-json.json").write_text("{not json")
    (folder / "verify-5-deep.json").write_text("[" * 100_000 + "]" * 100_000)
    return [*bodies, "verify-4-not-json.json", "verify-5-deep.json"]


def _bad_statistics(repo: Any) -> str:
    """A capture whose shape-only call output has statistics of the wrong types."""
    from stress.huge_captures import rewrite

    ref = _shape_only_capture(repo, "errors/stats")

    def edit(meta: dict[str, Any]) -> None:
        for entry in meta["tensors"].values():
            if entry.get("shape_only"):
                entry["stats"] = {"numel": "many", "min": [1], "max": {"a": 1}, "mean": "0.5", "std": None,
                                  "zero_fraction": "all", "nonfinite": -3, "quantiles": [1, 2]}

    rewrite(repo, ref, edit)
    return ref


def _shape_only_capture(repo: Any, name: str) -> str:
    """A capture of ``Linear(4, 256)`` whose output is stored shape-only (with its statistics)."""
    import torch

    import modulelens
    from stress.huge_captures import capture_of

    return capture_of(repo, name, lambda: torch.nn.Linear(4, 256), torch.randn(2, 4),
                      payload=modulelens.PayloadPolicy(shape_only_over=1024))


def ui_errors_row(tmp: Path) -> Row:
    """Hostile reports, statistics and parameters through every page of a real server: no 500, every
    response with the security headers, every hostile report shown or named."""
    import modulelens
    from stress.browser import ui_server
    from stress.hostile import make_base_capture

    row = Row("UI pages of hostile reports, statistics and parameters: errors and headers (issue 35.5)")
    start = time.perf_counter()
    repo = modulelens.Repo(tmp / "ui-errors-repo")
    plain = make_base_capture(repo, "errors/plain")
    files = _hostile_reports(repo, plain)
    stats = _bad_statistics(repo)
    clean = _shape_only_capture(repo, "errors/shape-only")
    quoted = {ref: quote(ref, safe="/:") for ref in (plain, stats, clean)}
    paths = [f"/capture/{quoted[plain]}", f"/capture/{quoted[plain]}/reports", f"/capture/{quoted[plain]}/export",
             f"/capture/{quoted[plain]}/reports?page=abc", f"/capture/{quoted[plain]}?state=x",
             f"/capture/{quoted[plain]}?calls=-1", f"/capture/{quoted[plain]}/call/99", f"/capture/{quoted[plain]}/call/x",
             f"/capture/{quoted[plain]}/histogram/nope", f"/capture/{quoted[stats]}", f"/capture/{quoted[stats]}/reports",
             f"/capture/{quoted[stats]}/export", f"/diff?a={quoted[plain]}&b={quoted[stats]}",
             f"/diff?a={quoted[clean]}&b={quoted[plain]}", f"/capture/{quoted[clean]}", f"/capture/{quoted[clean]}/export",
             "/?per_page=abc", "/?page=0", "/nothing-here", "/capture/no/such:v1", "/static/nope.js"]
    named = 0
    with ui_server(repo.location, env={**os.environ, "XDG_RUNTIME_DIR": str(tmp)}) as server:
        for path in paths:
            row.tried += 1
            try:
                status, headers, body, _ = _get(server.url, path)
            except OSError as error:
                row.wrong += 1
                row.notes.append(f"{path}: {type(error).__name__}: {error}"[:200])
                continue
            missing = [h for h in HEADERS if h not in headers]
            if status >= 500 or missing:
                row.wrong += 1
                row.notes.append(f"{path}: {status}" + (f", no {', '.join(missing)}" if missing else ""))
            else:
                row.survived += 1
            if path == f"/capture/{quoted[plain]}/reports" and status == 200:
                text = body.decode("utf-8", "replace")
                named = sum(f in text for f in files)
    if named < len(files):  # a valid one is shown (its file name heads it), another named as not a report
        row.wrong += 1
        row.notes.append(f"the reports page names {named} of the {len(files)} hostile report files")
    row.notes.insert(0, f"{len(paths)} requests; the reports page shows or names {named} of {len(files)} hostile reports")
    row.seconds = time.perf_counter() - start
    return row


# ------------------------------------------------------------------------------------------ sizes


def ui_sizes_row(tmp: Path) -> Row:
    """Every page of a 50,000-call capture, a million-leaf call and 3,000 reports: at most 5 MiB, and
    at most 2 s once the capture is open (cold times noted)."""
    from stress.browser import ui_server
    from stress.huge_captures import huge_repo

    row = Row("UI pages of a 50,000-call capture, a million-leaf call, 3,000 reports (issue 35.6)")
    start = time.perf_counter()
    root = tmp / "ui-sizes-repo"
    refs = huge_repo(root)
    made = time.perf_counter() - start
    q = {k: quote(v, safe="/:") for k, v in refs.items()}
    pages = [f"/capture/{q['calls']}", f"/capture/{q['calls']}?calls=2500", f"/capture/{q['calls']}/call/49999",
             f"/capture/{q['calls']}/reports", f"/capture/{q['calls']}/export", f"/diff?a={q['calls']}&b={q['leaves']}",
             f"/capture/{q['leaves']}", f"/capture/{q['leaves']}/call/0", f"/capture/{q['leaves']}/call/0?output=2000",
             f"/capture/{q['leaves']}/export", f"/capture/{q['reports']}", f"/capture/{q['reports']}/reports",
             f"/capture/{q['reports']}/reports?page=150", f"/capture/{q['reports']}/export",
             f"/capture/{q['mathtext']}/reports", "/", "/?per_page=all"]
    cold: list[str] = []
    worst = (0.0, 0, "")
    with ui_server(str(root), env={**os.environ, "XDG_RUNTIME_DIR": str(tmp)}) as server:
        for path in pages:
            row.tried += 1
            problem = ""
            try:
                status, _, body, first = _get(server.url, path, timeout=300)
                status, _, body, seconds = _get(server.url, path, timeout=300)
            except OSError as error:
                row.wrong += 1
                row.notes.append(f"{path}: {type(error).__name__} (no answer in 300 s)")
                continue
            cold.append(f"{first:.1f}")
            worst = max(worst, (seconds, len(body), path))
            if status != 200:
                problem = f"answered {status}"
            elif len(body) > PAGE_BYTES:
                problem = f"{len(body) / 2**20:.1f} MiB"
            elif seconds > PAGE_SECONDS:
                problem = f"{seconds:.1f} s once open"
            if problem:
                row.wrong += 1
                row.notes.append(f"{path}: {problem}")
            else:
                row.survived += 1
    row.notes.insert(0, f"slowest once open {worst[0]:.2f} s ({worst[2]}), largest {worst[1] / 2**20:.2f} MiB; "
                        f"first views {', '.join(cold)} s (the first reads the 45 MiB capture.json); made in {made:.0f} s")
    row.seconds = time.perf_counter() - start
    return row


# ------------------------------------------------------------------------------------------ token and Host


def ui_token_row(tmp: Path) -> Row:
    """Host headers of a loose parser, redirects after the token check, and the token in ``show``'s links."""
    import modulelens
    from stress.browser import ui_server
    from stress.hostile import make_base_capture

    row = Row("UI token and Host header: redirects stay on the server, links carry no token (issue 35.7, 35.9)")
    start = time.perf_counter()
    repo = modulelens.Repo(tmp / "ui-token-repo")
    ref = make_base_capture(repo, "token/plain")
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp / "ui-token-runtime")}
    Path(env["XDG_RUNTIME_DIR"]).mkdir()
    with ui_server(repo.location, env=env) as server:
        port = urlsplit(server.url).port
        for host, good in ((f"127.0.0.1:{port}@evil.com", False), (f"localhost:{port}.evil.com", False),
                           (f"127.0.0.1.evil.com:{port}", False), (f"[::1]evil.com:{port}", False),
                           (f"127.0.0.1:{port}/evil", False), (f"evil.com:{port}", False), (f"127.0.0.1:{port}:1", False),
                           (f"127.0.0.1:{port}", True), (f"localhost:{port}", True), (f"[::1]:{port}", True),
                           ("localhost", True)):
            row.tried += 1
            status = _get(server.url, "/", host=host)[0]
            if (status == 200) != good:
                row.wrong += 1
                row.notes.append(f"Host {host!r}: {status}")
            else:
                row.survived += 1
    with ui_server(repo.location, env=env, host="0.0.0.0") as server:
        url = server.url.replace("0.0.0.0", "127.0.0.1")
        for path in ("//evil.com", "///evil.com", "/\\evil.com", "//evil.com/x", "/%2F%2Fevil.com", "/\\/evil.com"):
            row.tried += 1
            status, headers, _, _ = _get(url, f"{path}?token={server.token}")
            location = headers.get("location", "")
            if status in (301, 302, 303, 307, 308) and (not location.startswith("/") or location.startswith(("//", "/\\"))):
                row.wrong += 1
                row.notes.append(f"GET {path}?token=...: redirect to {location!r}")
            else:
                row.survived += 1
        shown = subprocess.run([sys.executable, "-m", "modulelens", "show", ref, "--repo", repo.location],
                               capture_output=True, text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)
        row.record("show printed the server's token in its link" if server.token and server.token in shown.stdout + shown.stderr
                   else f"show printed no link to the running server: {shown.stdout[-200:]!r}"
                   if "in the browser" not in shown.stdout else None)
    row.seconds = time.perf_counter() - start
    return row
