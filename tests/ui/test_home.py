"""The UI as a home for each capture (issue 38 item 6), in-process on the real app: a page per name
(versions, aliases, tags, descriptions, a timeline, a two-version picker), the capture page's
"use this capture" snippets (run as copied, in a fresh process), its lineage, alias/tag/description
editing (only with --allow-write, with the form token, same-origin), the diff picker with overlaid
histograms, the diff action's rendered result, formatted report numbers, rendered kernel reports,
and the live job column. The same in a real Chromium: tests/ui/test_browser.py."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from starlette.testclient import TestClient

import modulelens
from modulelens.format.human import human_number
from modulelens.interfaces.ui import render
from modulelens.interfaces.ui.actions import Job
from modulelens.interfaces.ui.repo_view import RepoView
from modulelens.interfaces.ui.server import UiSettings, create_app
from modulelens.repo.layout import notes_key
from stress.ui_rows import HEADERS

LOCAL = "http://127.0.0.1:8765"


def client(repo: modulelens.Repo, *, scan_jobs: bool = False, **settings: Any) -> TestClient:
    return TestClient(create_app(RepoView(repo, scan_jobs=scan_jobs), UiSettings(**settings)), base_url=LOCAL)


@pytest.fixture
def editable(demo: dict[str, Any], tmp_path: Path) -> modulelens.Repo:
    """A copy of the demo repo that a test may change (the session's demo repo stays as it is)."""
    shutil.copytree(demo["repo"].location, tmp_path / "repo", symlinks=True)
    return modulelens.Repo(tmp_path / "repo")


def _form_token(page: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)


def _poster(web: TestClient, ref: str) -> Callable[..., Any]:
    """Posts an edit form as the capture page of ``ref`` would (with its form token), not following the redirect."""
    token = _form_token(web.get(f"/capture/{ref}").text)
    return lambda what, **fields: web.post(f"/edit/{what}", data={"csrf": token, **fields}, follow_redirects=False)


def _tags_on(page: str) -> list[str]:
    return re.findall(r'<span class="pill tag" data-tag="([^"]+)"', page)


# ------------------------------------------------------------------------------------------ name


def test_a_name_has_a_page_of_versions_aliases_a_picker_and_a_timeline(demo: dict[str, Any]) -> None:
    web = client(demo["repo"])
    page = web.get("/name/demo/top_mlp")
    assert page.status_code == 200 and all(h in page.headers for h in HEADERS)
    text = page.text
    assert re.findall(r'<tr data-ref="([^"]+)"', text) == ["demo/top_mlp:v2", "demo/top_mlp:v1"]  # newest first
    aliases = dict(re.findall(r'<tr data-alias="([^"]+)"><td><span class="pill">[^<]+</span></td><td class="mono">'
                              r'<a href="[^"]+">(v\d+)</a>', text))
    assert aliases == {"latest": "v2", "golden": "v1"}
    # the picker: B is the newest, A the one before; the form asks the diff page for them
    assert re.search(r'<input type="radio" name="a" value="demo/top_mlp:v1" checked', text)
    assert re.search(r'<input type="radio" name="b" value="demo/top_mlp:v2" checked', text)
    assert '<form method="get" action="/diff" id="pick-form">' in text
    # the timeline: each version saved by its job, the reports of v2 with their verdicts, newest first
    timeline = re.findall(r'<li data-kind="(\w+)"><span class="mono small when">([^<]*)</span> <a [^>]+>([^<]+)</a>', text)
    # (v1's reports left out: the session's demo repo is shared, and the browser test replays v1 from a page)
    assert [(kind, ref) for kind, _, ref in timeline if kind == "saved" or ref.endswith(":v2")] == [
        ("profile", "demo/top_mlp:v2"), ("replay", "demo/top_mlp:v2"), ("saved", "demo/top_mlp:v2"),
        ("saved", "demo/top_mlp:v1")]
    assert [when for _, when, _ in timeline] == sorted((when for _, when, _ in timeline), reverse=True)
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", timeline[0][1])  # the report's stamp, read as a time
    assert '<span class="pill pass">PASS</span>' in text
    # from the repo page and the capture page
    assert 'href="/name/demo/top_mlp"' in web.get("/").text
    assert 'id="name-link">demo/top_mlp</a>' in web.get(f"/capture/{demo['top_v1']}").text


def test_unknown_names_are_not_found_and_a_ref_leads_to_its_name(demo: dict[str, Any]) -> None:
    web = client(demo["repo"])
    missing = web.get("/name/demo/top_mpl")
    assert missing.status_code == 404 and "did you mean: demo/top_mlp" in missing.text
    assert web.get("/name/..%2F..%2Fetc").status_code in (400, 404)
    moved = web.get("/name/demo/top_mlp:golden", follow_redirects=False)
    assert moved.status_code == 302 and moved.headers["location"] == "/name/demo/top_mlp"


def test_a_long_history_is_paged_and_its_timeline_bounded(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    module = torch.nn.Linear(2, 2)
    for _ in range(23):
        with modulelens.capture(module, targets="Linear", repo=repo, name="many") as cap:
            module(torch.randn(1, 2))
    for _ in range(7):
        repo.add_report(cap.saved[0].ref, "replay", {"passed": True, "status": "PASS", "calls": []})
    web = client(repo)
    first = web.get("/name/many").text
    assert "20 of 23 versions (1-20)" in first and first.count("<tr data-ref=") == 20
    assert "2 older reports" in first  # the newest 5 of v23's 7 reports, and a line for the rest
    second = web.get("/name/many?page=2").text
    assert re.findall(r'<tr data-ref="([^"]+)"', second) == ["many:v3", "many:v2", "many:v1"]
    assert web.get("/name/many?page=x").status_code == 400


# --------------------------------------------------------------------------------------- capture


def _snippet(page: str, which: str) -> str:
    return html.unescape(re.search(rf'<pre id="snippet-{which}">(.*?)</pre>', page, re.S).group(1))


def test_the_snippets_run_as_copied(demo: dict[str, Any], child_env: dict[str, str], tmp_path: Path) -> None:
    """The Python snippet of a capture page, run as it is in a fresh process, loads, replays and
    prints PASS; the command line snippet's commands run too."""
    page = client(demo["repo"]).get(f"/capture/{demo['top_v2']}").text
    python = _snippet(page, "python")
    assert f"modulelens.load('{demo['top_v2']}', repo={demo['repo'].location!r})" in python
    assert "trust_source" not in python  # the user's own signed capture: no trust needed, none given
    script = tmp_path / "snippet.py"
    script.write_text(python)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=child_env, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "PASS" in done.stdout
    commands = _snippet(page, "cli").splitlines()
    assert [c.split()[1] for c in commands] == ["show", "replay", "shell", "profile"]
    show = subprocess.run([sys.executable, "-m", *commands[0].split()], capture_output=True, text=True, env=child_env,
                          timeout=300)
    assert show.returncode == 0 and demo["top_v2"] in show.stdout, show.stderr
    replay = subprocess.run([sys.executable, "-m", *commands[1].split()], capture_output=True, text=True, env=child_env,
                            timeout=300)
    assert replay.returncode == 0 and "PASS" in replay.stdout, replay.stderr
    test = _snippet(page, "pytest")
    assert "assert_matches(MyMLP, 'demo/top_mlp:v2'" in test and "def test_my_mlp_matches_the_recording" in test


def test_snippets_quote_the_repo_and_never_trust_a_strangers_capture(demo: dict[str, Any], tmp_path: Path) -> None:
    """A repo path with a space and a quote stays one argument; a capture that is not the user's
    own says how trust is given, without giving it."""
    odd = tmp_path / "it's a repo"
    shutil.copytree(demo["repo"].location, odd, symlinks=True)  # copied: no longer signed for this directory
    page = client(modulelens.Repo(odd)).get(f"/capture/{demo['top_v2']}").text
    assert f"--repo '{tmp_path}/it'\"'\"'s a repo'" in _snippet(page, "cli")
    python = _snippet(page, "python")
    assert f"repo={str(odd)!r}" in python and "trust_source=True, for captures you trust" in python
    assert "trust_source=True)" not in python
    assert '<span class="pill unknown">not yours</span>' in page


def test_lineage_names_the_job_the_commit_and_the_reports_that_used_it(demo: dict[str, Any]) -> None:
    web = client(demo["repo"])
    page = web.get(f"/capture/{demo['top_v2']}").text
    lineage = re.search(r'<table id="lineage-table">(.*?)</table>', page, re.S).group(1)
    name, version = demo["repo"].resolve(demo["top_v2"])
    env = demo["repo"].read_metadata(name, version)["environment"]
    assert f'<th>git commit</th><td class="mono">{env["git_commit"]}</td>' in lineage
    assert f'<th>host</th><td class="mono">{env["host"]}</td>' in lineage
    assert f'<th>process</th><td class="mono">{env["pid"]}</td>' in lineage
    assert '<span class="pill pass">yours</span> saved by you into this repo (signed)' in lineage
    used = re.findall(r'<a href="(/capture/demo/top_mlp:v2/reports#report-[^"]+)">(\w+) report</a>', lineage)
    assert [kind for _, kind in used] == ["profile", "replay"]
    reports = web.get(f"/capture/{demo['top_v2']}/reports").text
    for href, _ in used:  # each link lands on its report's section
        assert f'id="{href.rpartition("#")[2]}"' in reports


# ------------------------------------------------------------------------------------------ edits


def test_editing_needs_the_write_option_the_form_token_and_this_origin(editable: modulelens.Repo) -> None:
    ref = "demo/top_mlp:v2"
    read_only = client(editable, allow_run=True)
    page = read_only.get(f"/capture/{ref}").text
    assert "/edit/" not in page and "start the server with --allow-write" in page
    refused = read_only.post("/edit/tag", data={"csrf": _form_token(page), "ref": ref, "value": "x"})
    assert refused.status_code == 403 and "--allow-write" in refused.text
    web = client(editable, allow_write=True)
    token = _form_token(web.get(f"/capture/{ref}").text)
    assert web.post("/edit/tag", data={"ref": ref, "value": "x"}).status_code == 403
    assert web.post("/edit/tag", data={"csrf": "x" + token, "ref": ref, "value": "x"}).status_code == 403
    other_site = web.post("/edit/tag", data={"csrf": token, "ref": ref, "value": "x"},
                          headers={"origin": "http://evil.example", "sec-fetch-site": "cross-site"})
    assert other_site.status_code == 403
    assert web.post("/edit/rm", data={"csrf": token, "ref": ref, "value": "x"}).status_code == 404
    assert web.get("/edit/tag").status_code == 405
    assert editable.notes(ref).empty and editable.info("demo/top_mlp", 2).tags == ("demo", "retrained")


def test_aliases_tags_and_descriptions_are_edited_from_the_pages(editable: modulelens.Repo) -> None:
    web = client(editable, allow_write=True)
    ref = "demo/top_mlp:v2"
    post = _poster(web, ref)

    done = post("tag", ref="demo/top_mlp:latest", value="reviewed")  # an alias is pinned to its version
    assert done.status_code == 303 and done.headers["location"] == f"/capture/{ref}#notes"
    assert post("untag", ref=ref, value="retrained").status_code == 303
    page = web.get(f"/capture/{ref}").text
    assert _tags_on(page) == ["demo", "reviewed"] and "(edited; captured with demo, retrained)" in page
    assert editable.info("demo/top_mlp", 2).tags == ("demo", "reviewed")  # ls, filters, the listing all see it
    assert re.findall(r'class="ref">([^<]+)</a>', web.get("/?tag=reviewed").text) == [ref]

    assert post("describe", ref=ref, value="retrained 8 steps\n<b>not bold</b>", expected="").status_code == 303
    page = web.get(f"/capture/{ref}").text
    assert '<div class="description" id="description">retrained 8 steps\n&lt;b&gt;not bold&lt;/b&gt;</div>' in page
    assert 'name="expected" value="retrained 8 steps\n&lt;b&gt;not bold&lt;/b&gt;"' in page
    assert editable.notes(ref).description == "retrained 8 steps\n<b>not bold</b>"
    assert "retrained 8 steps" in web.get("/name/demo/top_mlp").text  # its first line on the name's page

    moved = post("alias", ref=ref, value="candidate", back="name")
    assert moved.status_code == 303 and moved.headers["location"] == "/name/demo/top_mlp"
    assert editable.resolve("demo/top_mlp:candidate") == ("demo/top_mlp", 2)
    assert post("unalias", ref="demo/top_mlp:v1", value="golden").status_code == 303
    assert "golden" not in editable.aliases("demo/top_mlp")
    assert re.findall(r'<tr data-alias="([^"]+)"', web.get("/name/demo/top_mlp").text) == ["latest", "candidate"]


def test_bad_and_stale_edits_are_refused_and_change_nothing(editable: modulelens.Repo) -> None:
    web = client(editable, allow_write=True)
    ref = "demo/top_mlp:v2"
    post = _poster(web, ref)

    assert post("describe", ref=ref, value="alice's words", expected="").status_code == 303
    stale = post("describe", ref=ref, value="bob's words", expected="")  # bob's form was loaded before alice saved
    assert stale.status_code == 409 and "changed by someone else meanwhile" in stale.text
    assert all(h in stale.headers for h in HEADERS)
    bad = post("tag", ref=ref, value="<script>")
    assert bad.status_code == 400 and "invalid tag &#39;&lt;script&gt;&#39;" in bad.text
    assert post("alias", ref=ref, value="v7").status_code == 400
    assert post("alias", ref=ref, value="latest").status_code == 400
    assert post("tag", ref=ref, value="").status_code == 400
    assert post("untag", ref=ref, value="never-there").status_code == 400
    assert post("tag", ref="demo/nothing:v1", value="x").status_code == 404
    assert post("describe", ref=ref, value="x" * 10_001, expected="alice's words").status_code == 400
    assert editable.notes(ref).description == "alice's words" and editable.info("demo/top_mlp", 2).tags == ("demo", "retrained")


def test_a_damaged_notes_file_is_named_and_the_pages_still_render(editable: modulelens.Repo) -> None:
    (Path(editable.location) / notes_key("demo/top_mlp")).write_text('{"notes": 1, "versions": {"2": {"tags": "x"}}}')
    web = client(editable, allow_write=True)
    for path in ("/capture/demo/top_mlp:v2", "/name/demo/top_mlp", "/"):
        page = web.get(path)
        assert page.status_code == 200, path
    assert "cannot be read:" in web.get("/capture/demo/top_mlp:v2").text
    token = _form_token(web.get("/capture/demo/top_mlp:v2").text)
    refused = web.post("/edit/tag", data={"csrf": token, "ref": "demo/top_mlp:v2", "value": "x"})
    assert refused.status_code == 422 and "notes.json" in refused.text


def test_hostile_names_descriptions_and_reports_render_as_text(tmp_path: Path) -> None:
    """The stress suite's hostile captures through the new pages too: each name's page, a capture
    whose description (and every shown string) is markup, a kernel report of markup."""
    from stress.hostile_ui import _hostile_repo, _pages

    repo, refs, markers = _hostile_repo(tmp_path, "http://127.0.0.1:9", quick=True)
    web = client(repo, allow_write=True, allow_run=True)
    paths = [p for p in _pages(repo, refs) if p.startswith("/name/")]
    assert paths
    for path in [*paths, f"/capture/{refs[0]}", f"/capture/{refs[0]}/reports"]:
        page = web.get(path)
        assert page.status_code == 200, (path, page.text[-300:])
        assert "<script>window" not in page.text and "onerror=\"window" not in page.text and "<iframe" not in page.text
    capture = web.get(f"/capture/{refs[0]}").text
    assert '<div class="description" id="description">&lt;script&gt;window.__ml_pwned=true' in capture
    # the class name in a snippet: letters, digits and _ only (a newline in it would end the comment)
    python, test = _snippet(capture, "python"), _snippet(capture, "pytest")
    assert re.search(r"module = capture.module        # the \w+, rebuilt with its recorded weights\n", python)
    assert re.search(r"def test_my_\w+_matches_the_recording\(\):\n    assert_matches\(My\w+, ", test)
    assert len(python.splitlines()) == 9 and len(test.splitlines()) == 5 and "<" not in python + test
    assert not any(marker.exists() for marker in markers)


# ------------------------------------------------------------------------------------------ diff


def test_the_diff_picker_offers_every_version_grouped_by_name(demo: dict[str, Any]) -> None:
    page = client(demo["repo"]).get("/diff", params={"a": demo["top_v1"], "b": demo["top_v2"]}).text
    picker = re.search(r'<select name="a" id="diff-a">(.*?)</select>', page, re.S).group(1)
    groups = re.findall(r'<optgroup label="([^"]+)">', picker)
    assert groups[0] == "demo/top_mlp" and sorted(groups) == sorted({r.partition(":")[0] for r in demo["refs"]})
    assert re.findall(r'<option value="(demo/top_mlp:v\d)"', picker) == ["demo/top_mlp:v2", "demo/top_mlp:v1"]
    assert '<option value="demo/top_mlp:v1" selected>' in picker
    assert '<option value="demo/top_mlp:v2" selected>' in re.search(r'<select name="b".*?</select>', page, re.S).group(0)
    assert 'id="diff-swap"' in page


def test_the_diff_draws_the_compared_tensors_over_each_other(demo: dict[str, Any]) -> None:
    web = client(demo["repo"])
    page = web.get("/diff", params={"a": demo["top_v1"], "b": demo["top_v2"]}).text
    weights = re.search(r'<table id="diff-weights">(.*?)</table>', page, re.S).group(1)
    assert weights.count('<svg class="hist overlay"') == 6  # every weight (6 of them: all drawn in)
    first = re.search(r'<tr class="changed" data-name="net.0.weight">.*?</tr>', weights, re.S).group(0)
    assert first.count('<rect class="a"') == 40 and first.count('<rect class="b"') == 40  # the same 40 bins
    inputs = re.search(r'<table id="diff-inputs">(.*?)</table>', page, re.S).group(1)
    assert inputs.count('<svg class="hist overlay"') == 1
    # a click asks for one pair: the fragment, and its refusals
    name, version = demo["repo"].resolve(demo["top_v1"])
    meta = demo["repo"].read_metadata(name, version)
    tid = meta["states"][0]["parameters"]["net.0.weight"]["tensor"]
    other = demo["repo"].read_metadata(*demo["repo"].resolve(demo["top_v2"]))["states"][0]["parameters"]["net.0.weight"]["tensor"]
    fragment = web.get("/diff/histogram", params={"a": demo["top_v1"], "ta": tid, "b": demo["top_v2"], "tb": other})
    assert fragment.status_code == 200 and fragment.text.count('<rect class="b"') == 40
    assert web.get("/diff/histogram", params={"a": demo["top_v1"], "ta": "nope", "b": demo["top_v2"], "tb": other}).status_code == 400
    # shape-only tensors (the attention block's input) have no values to draw, and say so
    shape_only = web.get("/diff", params={"a": "demo/attention:v1", "b": "demo/attention:v1"}).text
    assert "stored shape-only: no values to draw" in re.search(r'<table id="diff-inputs">(.*?)</table>', shape_only, re.S).group(1)


def test_a_diff_of_many_tensors_draws_the_first_rows_and_the_rest_on_a_click(tmp_path: Path) -> None:
    from modulelens.interfaces.ui.shown import DIFF_OVERLAYS

    repo = modulelens.Repo(tmp_path / "repo")
    model = torch.nn.Sequential(*[torch.nn.Linear(3, 3) for _ in range(10)])
    refs = []
    for _ in range(2):
        with modulelens.capture(model, targets=[""], repo=repo, name="deep") as cap:
            model(torch.randn(2, 3))
        refs.append(cap.saved[0].ref)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1)
    page = client(repo).get("/diff", params={"a": refs[0], "b": refs[1]}).text
    weights = re.search(r'<table id="diff-weights">(.*?)</table>', page, re.S).group(1)
    assert weights.count("<tr ") == 20 and weights.count('<svg class="hist overlay"') == DIFF_OVERLAYS
    assert weights.count('hx-get="/diff/histogram?') == 20 - DIFF_OVERLAYS


def test_the_diff_action_shows_a_rendered_result_not_json(demo: dict[str, Any]) -> None:
    """B on A's inputs, run for real (the worker's own function), as the job page shows it: outputs
    that differ after training are "outputs differ" with a table, not a red FAIL over raw JSON."""
    from modulelens.interfaces.ui._action_worker import _diff

    result = _diff(demo["top_v1"], demo["top_v2"], demo["repo"].location)
    job = Job(1, "diff", (demo["top_v1"], demo["top_v2"]), state="done", stage="finished", result=result)
    page = render.render("job_status.html", {"repo": "/repo", "job": job.view()}, allow_run=True, csrf="t")
    assert '<span class="pill differ">outputs differ</span>' in page and 'class="pill fail"' not in page
    rows = re.findall(r'<tr class="changed"><td class="mono">(\d+)</td><td>differs</td><td class="num">([^<]+)</td>', page)
    indices = [str(c["index"]) for c in demo["repo"].read_metadata("demo/top_mlp", 1)["calls"]]
    assert [call for call, _ in rows] == indices and all(re.fullmatch(r"[0-9.e-]{1,8}", v) for _, v in rows)
    assert "different on 2 of 2 calls" in page and "{" not in re.sub(r"<[^>]+>", "", page)
    assert f'href="/diff?a={demo["top_v1"].replace("/", "%2F").replace(":", "%3A")}' in page
    same = Job(2, "diff", (demo["top_v2"], demo["top_v2"]), state="done", result=_diff(demo["top_v2"], demo["top_v2"],
                                                                                         demo["repo"].location))
    page = render.render("job_status.html", {"repo": "/repo", "job": same.view()}, allow_run=True, csrf="t")
    assert '<span class="pill pass">outputs the same</span>' in page and "the same on all 1 calls" in page


def test_action_results_show_formatted_numbers() -> None:
    profile = Job(1, "profile", ("a:v1",), state="done", result={"median_ms": 0.6895053317060889, "peak_bytes": 3_276_800,
                                                                  "flops": 12_345_678, "report": "/r/profile-1.json"})
    page = render.render("job_status.html", {"repo": "/repo", "job": profile.view()}, allow_run=True, csrf="t")
    assert "<dd>0.69 ms</dd>" in page and "<dd>3.1 MiB</dd>" in page and "<dd>12.3 MFLOP</dd>" in page
    assert "0.6895" not in page and "profile-1.json" in page


# --------------------------------------------------------------------------------------- reports


def test_report_numbers_are_formatted_and_kernel_reports_rendered(tmp_path: Path) -> None:
    """A real ``verify`` report (its speedup a long float) and a real ``kernel verify`` report (CPU:
    the Triton interpreter, no timing), then a stored report shaped as a GPU run's timing is (no GPU
    here): every number formatted, each part a table, never only JSON."""
    pytest.importorskip("triton", reason="kernel verify needs triton (pip install 'modulelens[kernels]')")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support"))
    from kernel_models import capture_all

    from modulelens.kernels.options import CandidatePolicy
    from modulelens.kernels.verify import verify_kernel
    from modulelens.tools.timing import TimingConfig

    root = tmp_path / "repo"
    capture_all(str(root))
    repo = modulelens.Repo(root)
    capture = modulelens.load("km/mlp", repo=repo)
    report = modulelens.verify(capture, type(capture.module), timing=TimingConfig(warmup=1, iters=5))
    assert report.passed and report.speedup is not None
    candidates = Path(__file__).resolve().parent.parent / "support" / "kernel_candidates"
    kernel = verify_kernel("km/act", candidates / "scaled_gelu.py", repo=repo, policy=CandidatePolicy(timeout=120))
    assert kernel.passed, kernel.failures
    # stored later than the CPU report: both are made within a second, and reports of the same second
    # are ordered by their files' random suffixes (this test failed half its runs)
    later = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() + 60))
    gpu = dict(kernel.to_dict(), created=later, timing={
        "measured": True, "method": "cuda_event", "speedup_geomean": 0.6895053317060889, "speedup_samples": 2,
        "speedup_p10": 0.61234567, "speedup_p90": 0.7456789, "trusted": True,
        "samples": [{"sample": "call0", "reference": {"median_ms": 0.0123456}, "candidate": {"median_ms": 0.0179012},
                     "speedup": 0.6895053317060889}]})
    repo.add_report("km/act:v1", "kernel", gpu)
    web = client(repo)
    verify_page = web.get(f"/capture/{capture.ref}/reports").text
    speedup = re.search(r"<dt>speedup</dt><dd>([^<]+)</dd>", verify_page).group(1)
    assert speedup == f"{human_number(report.speedup)}x" and len(speedup) <= 6, speedup  # never 0.6895053317060889
    kernel_page = web.get("/capture/km/act:v1/reports").text
    sections = re.findall(r'<section class="report" data-kind="kernel" id="[^"]+">(.*?)</section>', kernel_page, re.S)
    assert len(sections) == 2
    # newest first; both may carry the same second, so each is told by what it holds
    timed, cpu = sorted(sections, key=lambda section: "not measured: no CUDA device" in section)
    assert "<dt>speedup</dt><dd>0.69x geometric mean over 2 passing samples (p10 0.612x, p90 0.746x)</dd>" in timed
    assert '<td class="mono">0.0123 ms</td>' in timed and '<td class="mono">0.69x</td>' in timed
    assert re.search(r"<dt>correctness</dt><dd>\d+ of \d+ samples pass \(\d+ recorded calls, 5 random inputs\)</dd>", cpu)
    assert "<dt>timing</dt><dd>not measured: no CUDA device" in cpu
    assert re.search(r'<div class="small muted">samples</div>\s*<table>', cpu) and "scaled_gelu.py" in cpu
    assert "0.6895" not in re.sub(r"<details>.*?</details>", "", kernel_page, flags=re.S)  # only in the stored JSON


# ------------------------------------------------------------------------------------------ jobs


def test_the_job_column_fills_in_for_versions_saved_after_the_server_started(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    module = torch.nn.Linear(2, 2)
    with modulelens.capture(module, targets="Linear", repo=repo, name="early"):
        module(torch.randn(1, 2))
    view = RepoView(repo, scan_jobs=True)
    view.wait_for_jobs(60)
    web = TestClient(create_app(view, UiSettings()), base_url=LOCAL)
    assert 'id="job-poller"' not in web.get("/").text  # every job known: nothing to ask again
    with modulelens.capture(module, targets="Linear", repo=repo, name="late"):  # saved while the server runs
        module(torch.randn(1, 2))
    page = web.get("/").text
    cell = re.search(r'<span id="(job-[0-9a-f]+)"><span class="muted" title="being read">…</span></span>', page)
    assert cell is not None and 'hx-get="/job-cells" hx-trigger="every 2s"' in page
    deadline = time.monotonic() + 60
    while True:  # what the page's poll gets, every 2 s in a browser
        cells = web.get("/job-cells").text
        if 'data-done="true"' in cells or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert f'<span id="{cell.group(1)}" hx-swap-oob="true">' in cells and 'data-done="true"' in cells
    host = repo.read_metadata("late", 1)["environment"]["host"]
    assert re.search(rf'<span id="{cell.group(1)}" hx-swap-oob="true">{re.escape(host)} · ', cells)
    assert "being read" not in web.get("/").text
