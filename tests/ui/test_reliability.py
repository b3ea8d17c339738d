"""The UI under hostile and huge captures (issue 35): bounded pages, hostile reports and statistics,
the security headers on every response (errors included), strict Host headers, redirects that stay
on the server, the discovery file under planted links, and links without the token. The same cases
against a real server: ``python -m stress`` (stress/ui_rows.py); page times: benchmarks/bench_ui.py."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import modulelens
from modulelens.interfaces.ui import discovery, pages, shown
from modulelens.interfaces.ui.repo_view import RepoView
from modulelens.interfaces.ui.server import UiSettings, create_app, host_of, same_origin_path
from modulelens.interfaces.value_text import spec_leaf_paths, spec_leaf_window
from modulelens.repo import reports as stored_reports
from modulelens.repo.reports import parse_report
from stress.hostile import make_base_capture
from stress.huge_captures import huge_repo, many_reports
from stress.ui_rows import HEADERS, PAGE_BYTES, _bad_statistics, _hostile_reports

LOCAL = "http://127.0.0.1:8765"


def client(repo: modulelens.Repo, **settings: Any) -> TestClient:
    return TestClient(create_app(RepoView(repo, scan_jobs=False), UiSettings(**settings)), base_url=LOCAL,
                      raise_server_exceptions=False)


# ------------------------------------------------------------------------------------------ sizes


@pytest.fixture(scope="module")
def huge(tmp_path_factory: pytest.TempPathFactory) -> tuple[modulelens.Repo, dict[str, str]]:
    """50,000 calls, a call of a million leaves, 3,000 reports (the sizes of issue 35)."""
    root = tmp_path_factory.mktemp("huge")
    refs = huge_repo(root)
    return modulelens.Repo(root), refs


def test_every_page_of_huge_captures_is_bounded(huge: tuple[modulelens.Repo, dict[str, str]]) -> None:
    repo, refs = huge
    web = client(repo)
    calls, leaves, reports = refs["calls"], refs["leaves"], refs["reports"]
    for path in (f"/capture/{calls}", f"/capture/{calls}?calls=2500", f"/capture/{calls}/call/49999",
                 f"/capture/{calls}/export", f"/diff?a={calls}&b={leaves}", f"/capture/{leaves}",
                 f"/capture/{leaves}/call/0", f"/capture/{leaves}/call/0?output=2000", f"/capture/{leaves}/export",
                 f"/capture/{reports}", f"/capture/{reports}/reports", f"/capture/{reports}/reports?page=150",
                 f"/capture/{reports}/export", "/?per_page=all"):
        page = web.get(path)
        assert page.status_code == 200, (path, page.text[-300:])
        assert len(page.content) <= PAGE_BYTES, (path, len(page.content))
        assert all(h in page.headers for h in HEADERS)


def test_long_lists_are_paged_and_counted(huge: tuple[modulelens.Repo, dict[str, str]]) -> None:
    repo, refs = huge
    web = client(repo)
    first = web.get(f"/capture/{refs['calls']}").text
    assert "20 of 50,000 recorded calls (1-20)" in first and first.count('<section class="call"') == shown.CALLS_PER_PAGE
    assert f'href="/capture/{refs["calls"]}?calls=2"' in first and f'href="/capture/{refs["calls"]}?calls=2500"' in first
    last = web.get(f"/capture/{refs['calls']}?calls=2500").text
    assert "20 of 50,000 recorded calls (49,981-50,000)" in last and 'id="call-49999"' in last
    assert web.get(f"/capture/{refs['calls']}?calls=999999").status_code == 200  # past the end: the last page
    assert web.get(f"/capture/{refs['calls']}?calls=x").status_code == 400

    preview = web.get(f"/capture/{refs['leaves']}").text
    assert "16 of 1,000,000 leaves" in preview and f'href="/capture/{refs["leaves"]}/call/0#output"' in preview
    call = web.get(f"/capture/{refs['leaves']}/call/0?output=2000").text
    assert "500 of 1,000,000 leaves (999,501-1,000,000)" in call and "output[999999]" in call and "output[999500]" in call
    assert web.get(f"/capture/{refs['leaves']}/call/1").status_code == 400

    listed = web.get(f"/capture/{refs['reports']}").text
    assert f"the newest {shown.REPORTS_LISTED} of 3000" in listed
    reports = web.get(f"/capture/{refs['reports']}/reports?page=2").text
    assert "20 of 3,000 reports (21-40)" in reports and reports.count('<section class="report"') == 20
    assert len(re.findall(r'class="plot sweep"', reports)) <= shown.SWEEP_PLOTS
    assert web.get("/?per_page=all").text.count('class="ref"') <= shown.MAX_PER_PAGE


def test_a_page_reads_and_checks_only_the_reports_it_shows(huge: tuple[modulelens.Repo, dict[str, str]],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """3,000 reports: the reports page reads its 20 and the newest profile reports of its figure, the
    capture page the newest it names, the saved file its first page; the rest are counted by name."""
    repo, refs = huge
    web = client(repo)
    parsed: list[str] = []

    def counted(data: bytes, where: str) -> dict[str, Any]:
        parsed.append(where)
        return parse_report(data, where)

    monkeypatch.setattr(stored_reports, "parse_report", counted)
    page = web.get(f"/capture/{refs['reports']}/reports?page=150").text
    assert "20 of 3,000 reports (2,981-3,000)" in page and page.count('<section class="report"') == 20
    assert f"the newest {shown.PLOTTED_PROFILES} of 1,500 profile reports" in page
    assert 20 < len(parsed) <= shown.REPORTS_PER_PAGE + shown.PLOTTED_PROFILES
    for path, most in ((f"/capture/{refs['reports']}", shown.LISTED), (f"/capture/{refs['reports']}/export",
                                                                        shown.LISTED + shown.REPORTS_PER_PAGE
                                                                        + shown.PLOTTED_PROFILES)):
        parsed.clear()
        assert web.get(path).status_code == 200 and 0 < len(parsed) <= most, (path, len(parsed))


def test_a_damaged_report_is_named_on_the_page_that_would_show_it(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    ref = make_base_capture(repo, "errors/many")
    many_reports(repo, ref, 45)
    folder = repo.version_path(*repo.resolve(ref)) / "reports"
    (folder / "verify-20000101T000000Z-0bad.json").write_text('{"kind": "verify", "calls": [{"max_abs_error": [1]}]}')
    web = client(repo)
    first, last = web.get(f"/capture/{ref}/reports").text, web.get(f"/capture/{ref}/reports?page=3").text
    assert "20 of 46 reports (1-20)" in first and "0bad" not in first  # the oldest: on the last page
    assert "6 of 46 reports (41-46)" in last and last.count('<section class="report"') == 5
    assert "report verify-20000101T000000Z-0bad.json: calls[0].max_abs_error: expected a number, found list" in last
    assert "reports (46)" in web.get(f"/capture/{ref}").text


def test_plot_text_is_plain_text(huge: tuple[modulelens.Repo, dict[str, str]]) -> None:
    """Deep mathtext in a report's title, device and date: drawn as text, not parsed."""
    repo, refs = huge
    page = client(repo).get(f"/capture/{refs['mathtext']}/reports").text
    assert 'id="history-plot"' in page and 'class="plot sweep"' in page and "plot not drawn" not in page


def test_window_links_stay_few_and_name_the_current_page() -> None:
    window = shown.Window.of(50_000, 1_234, 20)
    links = window.links(lambda p: f"?calls={p}")
    assert len(links) <= 14 and ("1234", None) in links and ("1", "?calls=1") in links and ("2500", "?calls=2500") in links
    assert (window.start, window.stop) == (24_660, 24_680)
    assert shown.Window.of(3, 1, 20).links(str) == [] and shown.Window.of(0, 5, 20).page == 1


def test_leaf_window_names_what_all_paths_name() -> None:
    tree = {"spec": {"type": "builtins:tuple", "children": [
        {"type": "builtins:tuple", "children": ["*", "*"]},
        {"type": "builtins:dict", "context": {"value": ["a", "b"]},
         "children": ["*", {"type": "builtins:list", "children": ["*"] * 3}]}]}, "leaves": list(range(6))}
    for prefix in ("inputs", "output"):
        full = spec_leaf_paths(tree, prefix)
        assert [spec_leaf_window(tree, prefix, a, b) for a in range(7) for b in range(a, 8)] == \
            [full[a:b] for a in range(7) for b in range(a, 8)]
    broken = {"spec": {"type": "builtins:list", "children": ["*"]}, "leaves": [1, 2]}  # does not add up: positions
    assert spec_leaf_window(broken, "output", 0, 2) == ["output[0]", "output[1]"]


# ------------------------------------------------------------------------------------------ errors


def test_hostile_reports_are_named_and_every_page_answers(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    ref = make_base_capture(repo, "errors/plain")
    files = _hostile_reports(repo, ref)
    web = client(repo)
    page = web.get(f"/capture/{ref}/reports")
    assert page.status_code == 200
    assert all(name in page.text for name in files)  # shown (valid), or named as not a report
    assert "report verify-1-abs-of-a-list.json: calls[0].max_abs_error: expected a number, found list" in page.text
    assert "report verify-5-deep.json: " in page.text and "report kernel-1-a-list.json: a report must be a JSON object" in page.text
    for path in (f"/capture/{ref}", f"/capture/{ref}/export"):
        assert web.get(path).status_code == 200
    problems: list[str] = []
    assert len(repo.reports(ref, problems=problems)) == 2 and len(problems) == len(files) - 2


def test_statistics_of_the_wrong_types_are_a_named_refusal(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    ref = _bad_statistics(repo)
    page = client(repo).get(f"/capture/{ref}")
    assert page.status_code == 422 and ".stats.numel: expected int, found str" in page.text
    assert all(h in page.headers for h in HEADERS)


def test_an_internal_error_answers_500_with_the_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    ref = make_base_capture(repo, "errors/plain")

    def broken(*args: Any, **kwargs: Any) -> None:
        raise TypeError("a bug")

    monkeypatch.setattr(pages, "capture_page", broken)
    page = client(repo).get(f"/capture/{ref}")
    assert page.status_code == 500 and "internal error (TypeError)" in page.text and "a bug" not in page.text
    assert all(h in page.headers for h in HEADERS)


def test_pushed_and_pulled_reports_are_checked(tmp_path: Path) -> None:
    source = modulelens.Repo(tmp_path / "source")
    ref = make_base_capture(source, "errors/plain")
    files = _hostile_reports(source, ref)
    source.add_report(ref, "profile", {"latency": {"median_ms": 1.0}})
    target = modulelens.Repo(tmp_path / "target")
    report = source.push(ref, target)
    assert len(report.reports_skipped) == len(files) - 2 and "verify-1-abs-of-a-list.json" in " ".join(report.reports_skipped)
    problems: list[str] = []
    assert len(target.reports(ref, problems=problems)) == 3 and problems == []
    with pytest.raises(modulelens.errors.CorruptCaptureError, match=r"report x\.json of"):
        target.put_report(*target.resolve(ref), "x.json", b'{"kind": "verify", "passed": "yes"}')


# ------------------------------------------------------------------------------------------ Host, redirects


def test_host_header_is_host_and_digits_only(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    make_base_capture(repo, "token/plain")
    web = client(repo)
    for host in ("127.0.0.1:8765@evil.com", "localhost:8765.evil.com", "127.0.0.1.evil.com:8765", "[::1]evil:8765",
                 "127.0.0.1:8765:1", "127.0.0.1:port", ""):
        assert web.get("/", headers={"host": host}).status_code in (400, 421), host
    for host in ("127.0.0.1:8765", "localhost", "[::1]:8765"):
        assert web.get("/", headers={"host": host}).status_code == 200, host
    assert host_of("127.0.0.1:8765") == "127.0.0.1" and host_of("[::1]:1") == "[::1]" and host_of("a@b") is None


def test_redirects_after_the_token_stay_on_the_server(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    make_base_capture(repo, "token/plain")
    web = TestClient(create_app(RepoView(repo, scan_jobs=False), UiSettings(host="0.0.0.0", token="s3cret")),
                     base_url="http://10.1.2.3:8765")
    for path in ("//evil.com", "///evil.com", "//evil.com/x", "/%2F%2Fevil.com"):
        answer = web.get(f"{path}?token=s3cret", follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"].startswith("/")
        assert not answer.headers["location"].startswith(("//", "/\\")), answer.headers["location"]
    assert same_origin_path("//evil.com/x") == "/evil.com/x" and same_origin_path("/capture/a:v1") == "/capture/a:v1"


# ------------------------------------------------------------------------------------------ discovery


def _victim(tmp_path: Path) -> tuple[Path, Path]:
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    victim = victim_dir / "precious.txt"
    victim.write_text("mine")
    return victim_dir, victim


def test_announcement_is_not_written_through_planted_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    victim_dir, victim = _victim(tmp_path)
    folder = runtime / "modulelens"
    folder.symlink_to(victim_dir)
    with pytest.raises(OSError, match="is not a plain folder"):
        discovery.announce("http://127.0.0.1:9", "/repo", "token")
    assert [p.name for p in victim_dir.iterdir()] == ["precious.txt"]
    folder.unlink()
    folder.mkdir(mode=0o700)
    (folder / f".ui-{os.getpid()}.json.tmp").symlink_to(victim)
    (folder / f"ui-{os.getpid()}.json").symlink_to(victim)
    written = discovery.announce("http://127.0.0.1:9", "/repo", "token")
    assert victim.read_text() == "mine" and not written.is_symlink() and json.loads(written.read_text())["token"] == "token"
    assert oct(written.stat().st_mode & 0o777) == "0o600"


def test_a_folder_open_to_others_is_closed_before_the_token_is_written(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    folder = tmp_path / "modulelens"
    folder.mkdir()
    os.chmod(folder, 0o777)
    discovery.announce("http://127.0.0.1:9", "/repo", "token")
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    if os.getuid() == 0:  # another user's folder is refused (only root can make one here)
        os.chown(folder, 65534, 65534)
        with pytest.raises(PermissionError, match="belongs to uid 65534"):
            discovery.announce("http://127.0.0.1:9", "/repo", "token")


def test_links_to_a_running_server_carry_no_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        discovery.announce(url, str(tmp_path / "repo"), "s3cret-token")
        link = discovery.capture_url(str(tmp_path / "repo"), "demo/top_mlp:v1")
    assert link == f"{url}/capture/demo/top_mlp:v1"


def test_a_name_holding_call_or_histogram_is_a_capture_not_a_subpage(tmp_path: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    ref = make_base_capture(repo, "team/call/7")
    web = client(repo)
    assert web.get(f"/capture/{ref}").status_code == 200
    call = web.get(f"/capture/{ref}/call/0")
    assert call.status_code == 200 and f"call 0 of <a href=\"/capture/{ref}\"" in call.text
    name = ref.partition(":")[0]
    assert web.get(f"/capture/{name}", follow_redirects=False).headers["location"] == f"/capture/{ref}"


def test_a_damaged_call_is_refused_on_the_pages_that_show_it(tmp_path: Path) -> None:
    """A capture's calls are checked when a page shows them, not all at its first view (50,000 took
    0.55 s of it): the pages without the damaged calls answer, each page with one refuses naming its
    field, and every other reader (load, show) still refuses the whole capture."""
    from stress.huge_captures import many_calls, rewrite

    repo = modulelens.Repo(tmp_path / "repo")
    ref = many_calls(repo, "long/calls", calls=45)

    def damage(meta: dict[str, Any]) -> None:
        meta["calls"][30] = 7
        meta["calls"][44]["training"] = "yes"
        meta["calls"][2]["finished"] = False  # listed among the warnings: checked as a shown call

    rewrite(repo, ref, damage)
    web = client(repo)
    first = web.get(f"/capture/{ref}")
    assert first.status_code == 200 and "call 2 raised in the original job" in first.text
    for path, problem in ((f"/capture/{ref}/call/44", "calls[44].training: expected bool, found str"),
                          (f"/capture/{ref}?calls=3", "calls[44].training: expected bool, found str"),
                          (f"/capture/{ref}/call/30", "calls[30]: expected dict, found int"),
                          (f"/capture/{ref}?calls=2", "calls[30]: expected dict, found int")):
        page = web.get(path)
        assert page.status_code == 422 and problem in page.text, (path, page.status_code, page.text[-300:])
        assert all(h in page.headers for h in HEADERS)
    assert web.get(f"/capture/{ref}/call/29").status_code == 200
    with pytest.raises(modulelens.CorruptCaptureError, match=r"calls\[30\]: expected dict, found int"):
        repo.read_metadata(*repo.resolve(ref))
    with pytest.raises(modulelens.CorruptCaptureError, match=r"calls\[30\]"):
        modulelens.load(ref, repo=repo)


def test_the_repo_page_keeps_its_listing_until_the_repo_changes(tmp_path: Path) -> None:
    """The repo page lists again only when the listing stamp changes (issue 37: a 500-row page in
    O(page) at 100,000 versions), so every change any process makes shows on the next request:
    a new version, an alias, an edited tag, a removed version. The page is streamed with the headers."""
    root = tmp_path / "repo"
    ref = make_base_capture(modulelens.Repo(root), "kept/a")
    web = client(modulelens.Repo(root))
    view = web.app.state.ui.view  # type: ignore[attr-defined]
    first = web.get("/")
    assert first.status_code == 200 and all(h in first.headers for h in HEADERS)
    assert refs_on(first.text) == [ref]
    kept = view.listing()
    assert web.get("/").status_code == 200 and view.listing() is kept  # nothing changed: not listed again
    other = modulelens.Repo(root)  # another process's repo object
    second = make_base_capture(other, "kept/b")
    assert refs_on(web.get("/").text) == [second, ref]
    other.set_alias(ref, "golden")
    assert "golden" in web.get("/?q=golden").text
    other.tag(second, "picked")
    assert refs_on(web.get("/?tag=picked").text) == [second]
    other.remove(second)
    assert refs_on(web.get("/").text) == [ref]


def refs_on(html: str) -> list[str]:
    return re.findall(r'class="ref">([^<]+)</a>', html)
