"""A capture's first view does only what the page shows (issue 35 item 6): whether a capture whose
file is not the lines that were signed is the user's own is asked for after the page (its cell
fills in), the saved file says it when it is known and that it was not checked otherwise; the job
column's background read takes the environment from its own line and waits for the pages. In-process on the real app; the timings are in
benchmarks/bench_ui.py --huge and the stress row."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import modulelens
from modulelens.format.provenance import stored_field
from modulelens.interfaces.ui import repo_view
from modulelens.interfaces.ui.repo_view import RepoView
from modulelens.interfaces.ui.server import UiSettings, create_app
from modulelens.repo.layout import capture_json
from stress.hostile import make_base_capture
from stress.huge_captures import rewrite

LOCAL = "http://127.0.0.1:8765"


def _cell(page: str) -> str:
    return re.search(r'<td id="provenance".*?</td>', page, re.S).group(0)


@pytest.fixture
def repo(tmp_path: Path) -> modulelens.Repo:
    return modulelens.Repo(tmp_path / "repo")


def test_a_reformatted_capture_is_yours_once_its_cell_is_asked_for(repo: modulelens.Repo) -> None:
    """Reformatted (one line, as json.dumps writes it): the page does not encode it again to check
    its signature, its cell asks; the answer is "yours" (reformatting is not editing). The saved
    file has no server to ask: made first thing (a fresh server, nobody asked) it says it was not
    checked and where it is, never "yours" unchecked; made from the page (whose cell asked), it says "yours"."""
    ref = make_base_capture(repo, "team/linear")
    rewrite(repo, ref, lambda meta: None)
    cold = TestClient(create_app(RepoView(repo, scan_jobs=False), UiSettings()), base_url=LOCAL)
    unchecked = _cell(cold.get(f"/capture/{ref}/export").text)
    assert "hx-get" not in unchecked and "checking…" not in unchecked and "yours" not in unchecked
    assert "not checked in this file" in unchecked and "modulelens ui" in unchecked
    web = TestClient(create_app(RepoView(repo, scan_jobs=False), UiSettings()), base_url=LOCAL)
    cell = _cell(web.get(f"/capture/{ref}").text)
    assert f'hx-get="/capture/{ref}/provenance" hx-trigger="load" hx-swap="outerHTML"' in cell and "checking…" in cell
    answer = web.get(f"/capture/{ref}/provenance")
    assert answer.status_code == 200
    assert '<span class="pill pass">yours</span> saved by you into this repo (signed)' in answer.text
    assert "hx-get" not in answer.text
    assert "hx-get" not in _cell(web.get(f"/capture/{ref}").text)  # known now: the page has it
    exported = web.get(f"/capture/{ref}/export").text
    assert "hx-get" not in _cell(exported) and '<span class="pill pass">yours</span>' in _cell(exported)


def test_an_edited_capture_is_not_yours_and_a_stored_one_is_told_at_once(repo: modulelens.Repo) -> None:
    ref = make_base_capture(repo, "team/linear")
    untouched = make_base_capture(repo, "team/other")

    def edit(meta: dict[str, Any]) -> None:
        meta["tags"] = ["edited"]

    rewrite(repo, ref, edit)
    web = TestClient(create_app(RepoView(repo, scan_jobs=False), UiSettings()), base_url=LOCAL)
    assert "checking…" in _cell(web.get(f"/capture/{ref}").text)
    answer = web.get(f"/capture/{ref.replace(':v1', ':latest')}/provenance", follow_redirects=False)
    assert answer.status_code == 302 and answer.headers["location"] == f"/capture/{ref}/provenance"
    answer = web.get(f"/capture/{ref}/provenance").text
    assert '<span class="pill unknown">not yours</span>' in answer and "its signature does not match" in answer
    stored = _cell(web.get(f"/capture/{untouched}").text)  # as the repo wrote it: checked on the bytes read
    assert "hx-get" not in stored and '<span class="pill pass">yours</span>' in stored


def test_stored_field_reads_one_top_level_line_or_nothing() -> None:
    text = capture_json({"name": "m", "environment": {"host": "h\n,\n\"environment\": 1"}, "tensors": {}})
    assert stored_field(text, "environment") == {"host": "h\n,\n\"environment\": 1"}
    assert stored_field(text, "tensors") == {} and stored_field(text, "calls") is None
    assert stored_field(json.dumps({"environment": {"host": "h"}}).encode(), "environment") is None  # not the layout
    twice = b'{\n"environment": {"host":"a"},\n"environment": {"host":"b"}\n}\n'
    assert stored_field(twice, "environment") == {"host": "b"}  # the last, as a parse takes it
    packed = b'{\n"name": "m",\n"environment": {"host":"a"}, "x": 1\n}\n'  # two fields on the line
    assert stored_field(packed, "environment") is None
    assert stored_field(b'{\n"environment": {"host":\n}\n', "environment") is None  # damaged


def test_the_job_read_waits_for_pages_and_takes_the_environment_line(repo: modulelens.Repo,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The job column's background read starts only once no page has been served for QUIET_S; it
    reads the job from the environment line of a file the repo wrote, and reads a reformatted one
    whole (the same job either way)."""
    monkeypatch.setattr(repo_view, "QUIET_S", 0.3)
    laid_out = make_base_capture(repo, "team/a")
    reformatted = make_base_capture(repo, "team/b")
    rewrite(repo, reformatted, lambda meta: None)
    env = repo.read_metadata(*repo.resolve(laid_out))["environment"]
    view = RepoView(repo, scan_jobs=False)
    page_done = threading.Event()

    def page() -> None:
        with view.serving():
            page_done.wait(10)

    server = threading.Thread(target=page)
    server.start()
    time.sleep(0.05)
    view.scan_jobs()
    time.sleep(1.0)
    assert view.job(laid_out) is None and view.job_pending(laid_out)  # still waiting for the page
    page_done.set()
    server.join()
    view.wait_for_jobs(30)
    for ref in (laid_out, reformatted):
        job = view.job(ref)
        assert job is not None and job["host"] == env["host"] and job["git_commit"] == env.get("git_commit")
        assert job["command"] == " ".join(env["argv"])
