"""The web UI against hostile captures, in a real headless Chromium (``python -m stress``).

Every hostile capture of :mod:`stress.hostile` (class paths, codec payloads and stored source that
try to run code) and a capture whose every shown string is markup (tags, metadata keys and values,
class path, environment, constructor arguments, call values, stored source, report text) are
rendered through every page: the repo page (and a search for the markup), each name's page, each
capture page (its description is markup too), its reports (a kernel report's too), a call tensor's
histogram, the diff, and the saved self-contained file. A page fails the
row when:

* a script ran (the markup sets ``window.__ml_pwned``; the code of the hostile captures creates a
  marker file, on the server's side too);
* markup became elements (a ``<script>``, an event handler attribute, an ``<iframe>``, ``<base>``,
  a refresh ``<meta>``, a stylesheet other than the server's);
* the page requested anything but the server (or ``data:`` images): the markup points every fetch,
  image, style, frame and redirect at a loopback beacon that counts what it receives.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

BEACON_MARK = "BEACON"
MARKUP = ('<script>window.__ml_pwned=true;fetch("BEACON/s")</script><img src="BEACON/i" onerror="window.__ml_pwned=true">'
          '<svg onload="window.__ml_pwned=true"></svg><style>@import url("BEACON/c");</style><iframe src="BEACON/f">'
          '</iframe><base href="BEACON/"><meta http-equiv="refresh" content="0;url=BEACON/m">'
          '<div hx-get="BEACON/h" hx-trigger="load">x</div><a href="javascript:window.__ml_pwned=true">x</a>'
          '{{ 7*7 }}{% raw %}"\'></textarea></pre></table><link rel="stylesheet" href="BEACON/l">')
# Elements or attributes that only injected markup would create on these pages.
INJECTED = ("script:not([src='/static/htmx.min.js']):not([src='/static/ui.js']), [onerror], [onload], iframe, object, "
            "embed, base, "
            "meta[http-equiv]:not([http-equiv='Content-Security-Policy']), "
            "link[rel=stylesheet]:not([href='/static/ui.css']), [hx-trigger='load'], a[href^='javascript']")


def _poison(meta: dict[str, Any], text: str) -> None:
    """Put ``text`` into every string of a capture that a page shows (the metadata stays valid)."""
    meta["tags"] = [text, "plain"]
    meta["metadata"] = {text: text, "nested": {"x": [text]}}
    meta["module"]["class"] = f"evil_{abs(hash(text)) % 97}:{text}"
    meta["module"]["qualified_name"] = text
    construction = meta["constructions"][meta["module"]["construction"]]
    construction["class"] = meta["module"]["class"]
    construction["kwargs"] = {"note": text, "items": {"$type": "dict", "items": [[text, text]]}}
    meta["environment"].update(host=text, argv=[text, "--flag", text], git_commit=text, torch=text)
    meta["capture"]["note"] = text
    meta["unrecorded"] = [{"path": text, "type": text, "reason": text}]
    call = meta["calls"][0]
    call["inputs"]["leaves"].append(text)
    call["inputs"]["spec"]["children"][0]["children"].append("*")
    meta["sources"] = {"evil_src": {"file": text, "text": text, "hash": "blake3:" + "0" * 64, "classes": {text: {}}}}


def hostile_ui_row(tmp: Path, quick: bool = False) -> Any:
    """Render hostile captures through every page in Chromium: 0 scripts run, 0 elements injected,
    0 requests beyond the server."""
    from stress.browser import Beacon, browser_missing, chromium, requested_urls, ui_server
    from stress.table import Row

    row = Row("hostile captures, tags, metadata and source in the web UI (real Chromium, every page)")
    start = time.perf_counter()
    missing = browser_missing()
    if missing:
        row.tried, row.wrong = 1, 1
        row.notes.append(missing)
        return row
    beacon = Beacon()
    try:
        repo, refs, markers = _hostile_repo(tmp, beacon.url, quick)
        export = tmp / "hostile-export.html"
        env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp)}
        with ui_server(repo.location, env=env) as server, chromium() as driver:
            driver.get(server.url + "/")  # start the logs from a page of ours
            requested_urls(driver)
            for path in _pages(repo, refs):
                _visit(driver, server.url, server.url + path, path, row)
            from modulelens.interfaces.ui.export import standalone_html
            from modulelens.interfaces.ui.repo_view import RepoView

            view = RepoView(repo, scan_jobs=False)
            xss_name, xss_version = repo.resolve(refs[0])
            export.write_text(standalone_html(view, view.capture(xss_name, xss_version)))
            _visit(driver, "file://", export.as_uri(), "saved file of " + refs[0], row)
        row.executed += sum(marker.exists() for marker in markers)
        if beacon.hits:
            row.wrong += 1
            row.notes.append(f"the beacon was reached: {sorted(set(beacon.hits))[:4]}")
    finally:
        beacon.close()
    row.notes.insert(0, f"{row.tried} page views of {len(refs)} captures")
    row.seconds = time.perf_counter() - start
    return row


def _hostile_repo(tmp: Path, beacon: str, quick: bool) -> tuple[Any, list[str], list[Path]]:
    import modulelens
    from stress.hostile import CASES, make_base_capture, plant

    repo = modulelens.Repo(tmp / "hostile-ui-repo")
    text = MARKUP.replace(BEACON_MARK, beacon)
    xss = make_base_capture(repo, "xss/markup")
    name, version = repo.resolve(xss)
    path = repo.version_path(name, version) / "capture.json"
    meta = json.loads(path.read_text())
    _poison(meta, text)
    os.chmod(path, 0o644)
    path.write_text(json.dumps(meta))
    repo.rebuild_summary(name)  # the listing shows the markup tags and class too
    repo.add_report(xss, "profile", {"ref": text, "notes": [text], "latency": {"median_ms": 1.0, "p10_ms": 1.0,
                                     "p90_ms": 1.0, "iterations": 3}, "top_ops": [{"name": text, "percent": 1}],
                                     "device": text, "mode": text})
    repo.add_report(xss, "verify", {"candidate": text, "passed": False, "failures": [text],
                                    "calls": [{"index": 0, "passed": False, "error": text}]})
    repo.add_report(xss, "kernel", {"candidate": {"path": text, "backend": text}, "passed": False, "failures": [text],
                                    "samples": [{"sample": text, "kind": text, "passed": False, "error": text}],
                                    "static": {"errors": [{"rule": text, "line": 1, "message": text}]},
                                    "timing": {"measured": False, "reason": text}, "review_required": True,
                                    "review_reasons": [text]})
    repo.describe(xss, text)  # its description (notes.json) is markup too
    refs, markers = [xss, make_base_capture(repo, "xss/plain")], []
    cases = CASES[::4] if quick else CASES
    for i, case in enumerate(cases):
        ref = make_base_capture(repo, f"hostile/h{i}")
        marker = tmp / f"hostile-ui-marker-{i}"
        plant(repo, ref, case, marker)
        refs.append(ref)
        markers.append(marker)
    return repo, refs, markers


def _pages(repo: Any, refs: list[str]) -> list[str]:
    from urllib.parse import quote

    pages = ["/", "/?q=" + quote("<script>"), "/?tag=" + quote(MARKUP[:40]), "/jobs",
             f"/diff?a={quote(refs[0])}&b={quote(refs[1])}", f"/diff?a={quote(refs[1])}&b={quote(refs[0])}"]
    for ref in refs:
        name, version = repo.resolve(ref)
        pages += [f"/capture/{quote(ref, safe='/:')}", f"/capture/{quote(ref, safe='/:')}/reports",
                  f"/capture/{quote(ref, safe='/:')}/call/0"]
        try:
            tensors = list(repo.read_metadata(name, version)["tensors"])
        except Exception:  # a capture whose metadata the repo refuses: its page says so, no histogram to ask for
            tensors = []
        pages += [f"/capture/{quote(ref, safe='/:')}/histogram/{quote(tid)}" for tid in tensors[:2]]
        pages.append(f"/diff?a={quote(refs[1])}&b={quote(ref)}")
        pages.append(f"/name/{quote(name, safe='/')}")
    return pages


def _visit(driver: Any, origin: str, url: str, label: str, row: Any) -> None:
    from stress.browser import requested_urls

    row.tried += 1
    try:
        driver.get(url)
        time.sleep(0.05)  # let anything that would load, load
        ran = driver.execute_script("return window.__ml_pwned === true")
        injected = driver.execute_script(f"return document.querySelectorAll({INJECTED!r}).length")
        elsewhere = [u for u in requested_urls(driver) if not (u.startswith(origin) or u.startswith("data:"))]
    except Exception as error:  # the browser itself failed on the page
        row.wrong += 1
        row.notes.append(f"{label}: {type(error).__name__}: {str(error)[:120]}")
        return
    row.executed += bool(ran)
    if injected or elsewhere:
        row.wrong += 1
        row.notes.append(f"{label}: {injected} injected elements, requests to {elsewhere[:3]}")
    if not ran and not injected and not elsewhere:
        row.survived += 1
