"""The UI's pages and its security rules, in-process (Starlette's test client on the real app)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import modulelens
from modulelens.interfaces.ui.export import standalone_html
from modulelens.interfaces.ui.render import SERVER_CSP, standalone_csp
from modulelens.interfaces.ui.repo_view import RepoView
from modulelens.interfaces.ui.server import UiSettings, create_app

LOCAL = "http://127.0.0.1:8765"


def client(repo: modulelens.Repo, **settings: Any) -> TestClient:
    return TestClient(create_app(RepoView(repo, scan_jobs=False), UiSettings(**settings)), base_url=LOCAL)


def refs_on(html: str) -> list[str]:
    return re.findall(r'class="ref">([^<]+)</a>', html)


def test_repo_page_searches_filters_and_sorts(demo: dict[str, Any]) -> None:
    web = client(demo["repo"])
    page = web.get("/")
    assert page.status_code == 200 and sorted(refs_on(page.text)) == sorted(demo["refs"])
    assert refs_on(web.get("/?q=TOP_mlp").text) == ["demo/top_mlp:v2", "demo/top_mlp:v1"]  # newest first
    assert refs_on(web.get("/?q=golden").text) == ["demo/top_mlp:v1"]  # aliases are searched
    assert refs_on(web.get("/?tag=retrained").text) == ["demo/top_mlp:v2"]
    assert refs_on(web.get("/?class=FeatureAttention").text) == ["demo/attention:v1"]
    assert refs_on(web.get("/?since=2999-01-01").text) == [] and "no version matches" in web.get("/?since=2999-01-01").text
    assert len(refs_on(web.get("/?until=2999-01-01").text)) == 5
    by_size = [i.ref for i in sorted(demo["repo"].list(), key=lambda i: i.nbytes)]
    assert refs_on(web.get("/?sort=size&order=asc").text) == by_size
    assert refs_on(web.get("/?sort=name&order=asc&per_page=2").text) == ["demo/attention:v1", "demo/embeddings:v1"]
    bad = web.get("/?sort=colour")
    assert bad.status_code == 400 and "sort must be one of" in bad.text
    assert web.get("/?since=yesterday").status_code == 400


def test_capture_page_shows_arguments_tensors_calls_environment_and_source(demo: dict[str, Any]) -> None:
    web = client(demo["repo"])
    page = web.get(f"/capture/{demo['top_v1']}").text
    assert "MLP([26, 64, 32, 1], activation=GELU, dropout=0.1)" in page
    assert page.count('<svg class="hist"') == 6  # one histogram per parameter
    assert 'hx-get="/capture/demo/top_mlp:v1/histogram/' in page  # call tensors: on click
    assert re.search(r"<th>torch</th><td class=\"mono\">2\.", page)
    assert "<th>step</th>" in page  # the capture's metadata
    attention = web.get("/capture/demo/attention:v1").text
    assert 'class="pill shape-only"' in attention and "stored shape-only" in attention
    fragment = web.get("/capture/demo/top_mlp:v1/histogram/" + _first_call_tensor(demo))
    assert fragment.status_code == 200 and "<svg" in fragment.text and "float32[64, 26]" in fragment.text
    assert web.get("/capture/demo/top_mlp:v1/histogram/no-such").status_code == 400


def _first_call_tensor(demo: dict[str, Any]) -> str:
    name, version = demo["repo"].resolve(demo["top_v1"])
    call = demo["repo"].read_metadata(name, version)["calls"][0]
    return call["inputs"]["leaves"][0]["id"]


def test_aliases_and_latest_lead_to_the_version(demo: dict[str, Any]) -> None:
    web = client(demo["repo"])
    assert web.get("/capture/demo/top_mlp:golden", follow_redirects=False).headers["location"] == "/capture/demo/top_mlp:v1"
    assert web.get("/capture/demo/top_mlp", follow_redirects=False).headers["location"] == "/capture/demo/top_mlp:v2"
    assert web.get("/capture/demo/top_mlp:latest/reports", follow_redirects=False).headers["location"] == \
        "/capture/demo/top_mlp:v2/reports"
    missing = web.get("/capture/demo/top_mpl:v1")
    assert missing.status_code == 404 and "did you mean: demo/top_mlp" in missing.text


def test_reports_page_is_newest_first_with_plots(demo: dict[str, Any]) -> None:
    page = client(demo["repo"]).get(f"/capture/{demo['top_v2']}/reports").text
    assert re.findall(r'<section class="report" data-kind="(\w+)"', page) == ["profile", "replay"]
    assert page.count('src="data:image/png;base64,') == 2  # the history/roofline figure and the sweep
    assert "median" in page and "arithmetic intensity" in page


def test_diff_page_compares_weights_arguments_inputs_and_outputs(demo: dict[str, Any]) -> None:
    web = client(demo["repo"])
    page = web.get("/diff", params={"a": demo["top_v1"], "b": demo["top_v2"]}).text
    weights = re.search(r'<table id="diff-weights">(.*?)</table>', page, re.S).group(1)
    assert weights.count('class="changed"') == 6 and "0 of 6 identical" in page
    assert '<td class="mono">dropout</td><td class="mono">0.1</td><td class="mono">0.1</td>' in page
    assert 'id="diff-inputs"' in page and "args[0]" in page and 'id="diff-outputs"' in page
    same = web.get("/diff", params={"a": demo["top_v2"], "b": demo["top_v2"]}).text
    assert "6 of 6 identical" in same
    assert web.get("/diff", params={"a": demo["top_v2"]}, follow_redirects=False).headers["location"] == \
        "/diff?a=demo/top_mlp:v1&b=demo/top_mlp:v2"


def test_every_response_carries_the_policy_and_only_named_files_are_served(demo: dict[str, Any]) -> None:
    web = client(demo["repo"])
    for path in ("/", f"/capture/{demo['top_v1']}", "/static/ui.css", "/nope", "/capture/x:v9"):
        response = web.get(path)
        assert response.headers["content-security-policy"] == SERVER_CSP, path
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["x-frame-options"] == "DENY"
    assert web.get("/static/htmx.min.js").headers["content-type"].startswith("text/javascript")
    location = demo["repo"].location
    for path in ("/static/../../../etc/passwd", "/static/%2e%2e%2fpyproject.toml", "/static/pages.py",
                 "/capture/..%2F..%2F..%2Fetc%2Fpasswd:v1", f"/capture/{location}/modulelens-repo.json:v1",
                 "/capture/demo%2F..%2F..%2Fblobs:v1", "/blobs/", "/names/demo%2Ftop_mlp/versions/1/capture.json"):
        response = web.get(path)
        assert response.status_code in (400, 404), (path, response.status_code)
        assert "root:" not in response.text and "layout_version" not in response.text


def test_read_only_unless_allow_run_and_forms_need_the_server_token(demo: dict[str, Any]) -> None:
    read_only = client(demo["repo"])
    assert read_only.post("/actions/replay", data={"ref": demo["top_v1"]}).status_code == 403
    assert read_only.put("/").status_code == 405 and read_only.delete(f"/capture/{demo['top_v1']}").status_code == 405
    assert read_only.post("/").status_code == 405
    assert 'id="run-replay"' not in read_only.get(f"/capture/{demo['top_v1']}").text
    runs = client(demo["repo"], allow_run=True)
    page = runs.get(f"/capture/{demo['top_v1']}").text
    token = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    assert runs.post("/actions/replay", data={"ref": demo["top_v1"]}).status_code == 403  # no form token
    assert runs.post("/actions/replay", data={"ref": demo["top_v1"], "csrf": "x" + token}).status_code == 403
    other_site = runs.post("/actions/replay", data={"ref": demo["top_v1"], "csrf": token},
                           headers={"origin": "http://evil.example", "sec-fetch-site": "cross-site"})
    assert other_site.status_code == 403
    assert runs.post("/actions/rm", data={"ref": demo["top_v1"], "csrf": token}).status_code == 404
    assert runs.post("/actions/replay", data={"ref": "demo/nothing:v1", "csrf": token}).status_code == 404


def test_loopback_server_refuses_other_host_names(demo: dict[str, Any]) -> None:
    """DNS rebinding: a page of evil.example resolving to 127.0.0.1 must not read the repo."""
    web = client(demo["repo"])
    assert web.get("/", headers={"host": "evil.example:8765"}).status_code == 421
    assert web.get("/", headers={"host": "localhost:8765"}).status_code == 200
    assert web.get("/", headers={"host": "[::1]:8765"}).status_code == 200


def test_a_server_beyond_loopback_needs_its_token(demo: dict[str, Any]) -> None:
    with pytest.raises(modulelens.errors.UsageError, match="needs a token"):
        UiSettings(host="0.0.0.0")
    app = create_app(RepoView(demo["repo"], scan_jobs=False), UiSettings(host="0.0.0.0", token="s3cret-token"))
    web = TestClient(app, base_url="http://10.1.2.3:8765")
    for path in ("/", "/static/ui.css", f"/capture/{demo['top_v1']}", "/?token=wrong"):
        refused = web.get(path)
        assert refused.status_code == 401 and "needs its token" in refused.text and demo["top_v1"] not in refused.text
    entry = web.get("/capture/demo/top_mlp:v1?token=s3cret-token&state=0", follow_redirects=False)
    assert entry.status_code == 303 and entry.headers["location"] == "/capture/demo/top_mlp:v1?state=0"
    assert "HttpOnly" in entry.headers["set-cookie"] and "SameSite=Strict" in entry.headers["set-cookie"]
    assert web.get("/").status_code == 200  # the cookie carries it from now on
    bearer = TestClient(app, base_url="http://10.1.2.3:8765")
    assert bearer.get("/", headers={"authorization": "Bearer s3cret-token"}).status_code == 200


def test_the_saved_file_is_self_contained(demo: dict[str, Any]) -> None:
    view = RepoView(demo["repo"], scan_jobs=False)
    name, version = demo["repo"].resolve(demo["top_v2"])
    html = standalone_html(view, view.capture(name, version))
    assert f'<meta http-equiv="Content-Security-Policy" content="{standalone_csp()}">'.replace("'", "&#39;") in html
    assert "<script" not in html and "<link rel=\"stylesheet\"" not in html
    assert not re.search(r'(src|href)="(?!data:)[^"#]', html)  # nothing to fetch: data: images only, no links
    assert html.count('<svg class="hist"') >= 6 + 2  # parameters, and the call tensors drawn in
    assert html.count('src="data:image/png;base64,') == 2


def test_hostile_captures_render_as_text_and_run_nothing(tmp_path: Path) -> None:
    """The stress suite's hostile captures (and one whose every string is markup) on every page:
    each page answers (a damaged capture's with its "damaged" page), no markup survives unescaped,
    no marker file appears (the server imports nothing a capture names). The same pages in
    Chromium: python -m stress (stress/hostile_ui.py)."""
    from stress.hostile_ui import _hostile_repo, _pages

    repo, refs, markers = _hostile_repo(tmp_path, "http://127.0.0.1:9", quick=True)
    web = client(repo)
    for path in _pages(repo, refs):
        page = web.get(path)
        # a capture the format refuses (a call setting it does not allow) has a "damaged" page, 422
        assert page.status_code == 200 or (page.status_code == 422 and "<h1>damaged</h1>" in page.text), \
            (path, page.text[-300:])
        assert "<script>window" not in page.text and "onerror=\"window" not in page.text and "<iframe" not in page.text
    assert "&lt;script&gt;window.__ml_pwned=true" in web.get(f"/capture/{refs[0]}").text
    assert not any(marker.exists() for marker in markers)


def test_a_remote_repo_is_browsed_through_its_cache(demo: dict[str, Any], tmp_path: Path, monkeypatch: Any) -> None:
    """An fsspec repo (memory:// here; s3:// alike): listing, capture page with histograms from the
    payloads downloaded into the cache."""
    monkeypatch.setenv("MODULELENS_CACHE", str(tmp_path / "cache"))
    url = f"memory://ui-{tmp_path.name}/repo"
    demo["repo"].push(demo["top_v1"], url)
    web = client(modulelens.Repo(url))
    assert refs_on(web.get("/").text) == [demo["top_v1"]]
    page = web.get(f"/capture/{demo['top_v1']}")
    assert page.status_code == 200 and page.text.count('<svg class="hist"') == 6


def test_a_running_job_shows_its_stage_and_how_far_it_is() -> None:
    from modulelens.interfaces.ui import render
    from modulelens.interfaces.ui.actions import Job

    job = Job(1, "replay", ("demo/top_mlp:v1",), state="running", stage="replaying calls", done=1, total=2)
    html = render.render("job_status.html", {"repo": "/repo", "job": job.view()}, allow_run=True, csrf="token")
    assert 'id="job-state">running</b>' in html and 'hx-trigger="every 1s"' in html  # it keeps polling
    assert '<progress id="job-progress" value="1" max="2">' in html and "replaying calls (1 / 2)" in html
    finished = Job(1, "replay", ("demo/top_mlp:v1",), state="done", stage="finished", done=2, total=2, passed=True)
    html = render.render("job_status.html", {"repo": "/repo", "job": finished.view()}, allow_run=True, csrf="token")
    assert "hx-trigger" not in html and "finished (2 / 2)" in html  # done: no more polling
