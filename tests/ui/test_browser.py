"""``modulelens ui`` in a real headless Chromium: a server started as a user starts it (``modulelens ui
--repo DIR``, a child process on a free port), clicked through page by page, with the rendered DOM
checked and screenshots saved for CI. Every request the pages make is recorded: none may leave
the server (no CDN, no font, no beacon), and no Content-Security-Policy violation may be reported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ready
from selenium.webdriver.support.ui import WebDriverWait

import modulelens
from stress.browser import console_messages, requested_urls, ui_server


def _only_from(server_url: str, urls: list[str]) -> list[str]:
    """The requests that went anywhere but the server (``data:`` images are part of the page)."""
    return [u for u in urls if not (u.startswith(server_url + "/") or u == server_url or u.startswith("data:"))]


def _wait(driver: Any, seconds: float = 30) -> WebDriverWait:
    # htmx replaces parts of the page (the job status every second): an element may go stale mid-check
    return WebDriverWait(driver, seconds, ignored_exceptions=(StaleElementReferenceException, NoSuchElementException))


def _text(driver: Any, element_id: str) -> str:
    return _wait(driver).until(lambda d: d.find_element(By.ID, element_id).text)


def test_click_through_repo_capture_histogram_diff_reports(demo: dict[str, Any], browser: Any, child_env: dict[str, str],
                                                           screenshots: Path) -> None:
    driver = browser
    with ui_server(demo["repo"].location, env=child_env) as server:
        requested_urls(driver), console_messages(driver)  # start the logs from here
        driver.get(server.url + "/")
        rows = driver.find_elements(By.CSS_SELECTOR, "#captures tbody tr")
        assert len(rows) == len(demo["refs"]) == 5
        assert {a.text for a in driver.find_elements(By.CSS_SELECTOR, "#captures a.ref")} == set(demo["refs"])
        driver.save_screenshot(str(screenshots / "1-repo.png"))

        # search: only the two versions of top_mlp are left
        box = driver.find_element(By.ID, "q")
        box.clear()
        box.send_keys("top_mlp")
        driver.find_element(By.ID, "apply").click()
        _wait(driver).until(lambda d: "q=top_mlp" in d.current_url)
        refs = [a.text for a in driver.find_elements(By.CSS_SELECTOR, "#captures a.ref")]
        assert refs == ["demo/top_mlp:v2", "demo/top_mlp:v1"]  # newest first

        # a capture: constructor, parameters with a histogram each, calls
        driver.find_element(By.LINK_TEXT, "demo/top_mlp:v1").click()
        _wait(driver).until(ready.presence_of_element_located((By.ID, "capture-ref")))
        assert driver.find_element(By.ID, "capture-ref").text == "demo/top_mlp:v1"
        assert driver.find_element(By.ID, "constructor").text == (
            "MLP([26, 64, 32, 1], activation=GELU, dropout=0.1)")
        params = driver.find_elements(By.CSS_SELECTOR, "table[data-part=state] tbody tr")
        assert [r.get_attribute("data-path") for r in params] == [
            "net.0.weight", "net.0.bias", "net.3.weight", "net.3.bias", "net.6.weight", "net.6.bias"]
        assert len(driver.find_elements(By.CSS_SELECTOR, "table[data-part=state] svg.hist")) == 6
        bars = driver.find_elements(By.CSS_SELECTOR, "table[data-part=state] tr[data-path='net.0.weight'] svg.hist rect")
        assert len(bars) == 40
        calls = driver.find_elements(By.CSS_SELECTOR, "section.call")
        assert len(calls) == 2
        driver.save_screenshot(str(screenshots / "2-capture.png"))

        # a call's input histogram, on click (htmx asks the server for it)
        first_input = calls[0].find_element(By.CSS_SELECTOR, "table[data-part=inputs] tbody tr")
        assert first_input.get_attribute("data-path") == "args[0]"
        assert not first_input.find_elements(By.CSS_SELECTOR, "svg.hist")
        first_input.find_element(By.CSS_SELECTOR, "button.hbtn").click()
        _wait(driver).until(lambda d: first_input.find_elements(By.CSS_SELECTOR, ".hist-slot svg.hist rect"))
        assert "float32[64, 26]" in first_input.find_element(By.CSS_SELECTOR, ".hist-slot").text
        driver.execute_script("arguments[0].scrollIntoView()", first_input)
        driver.save_screenshot(str(screenshots / "3-call-histogram.png"))

        # the next version, then its diff with this one
        driver.find_element(By.LINK_TEXT, "v2").click()
        _wait(driver).until(lambda d: d.find_element(By.ID, "capture-ref").text == "demo/top_mlp:v2")
        driver.find_element(By.ID, "diff-previous").click()
        _wait(driver).until(ready.presence_of_element_located((By.ID, "diff-weights")))
        weights = {r.find_element(By.CSS_SELECTOR, "td").text: r for r in
                   driver.find_elements(By.CSS_SELECTOR, "#diff-weights tbody tr")}
        assert set(weights) == {"net.0.weight", "net.0.bias", "net.3.weight", "net.3.bias", "net.6.weight", "net.6.bias"}
        assert all("changed" in (r.get_attribute("class") or "") for r in weights.values())  # trained in between
        assert float(weights["net.0.weight"].find_elements(By.CSS_SELECTOR, "td")[5].text) > 0
        assert driver.find_elements(By.CSS_SELECTOR, "#diff-inputs tbody tr")[0].find_element(By.CSS_SELECTOR, "td").text == "args[0]"
        driver.save_screenshot(str(screenshots / "4-diff.png"))

        # the reports of v2: the profile (with its plots) and the replay, newest first
        driver.get(server.url + "/capture/demo/top_mlp:v2")
        driver.find_element(By.ID, "reports-link").click()
        _wait(driver).until(ready.presence_of_element_located((By.CSS_SELECTOR, "section.report")))
        kinds = [s.get_attribute("data-kind") for s in driver.find_elements(By.CSS_SELECTOR, "section.report")]
        assert kinds == ["profile", "replay"]
        assert driver.find_element(By.ID, "history-plot").get_attribute("naturalWidth") != "0"
        sweep = driver.find_element(By.CSS_SELECTOR, "section.report[data-kind=profile] img.sweep")
        assert int(sweep.get_attribute("naturalWidth")) > 500  # the PNG decoded
        assert "PASS" in driver.find_element(By.CSS_SELECTOR, "section.report[data-kind=replay] h3").text
        driver.save_screenshot(str(screenshots / "5-reports.png"))

        elsewhere = _only_from(server.url, requested_urls(driver))
        assert elsewhere == []
        problems = [m for m in console_messages(driver) if "Content Security Policy" in m or "SEVERE" in m]
        assert problems == []


def test_an_action_shows_its_progress_and_stores_its_report(demo: dict[str, Any], browser: Any,
                                                            child_env: dict[str, str], screenshots: Path) -> None:
    driver = browser
    ref = demo["top_v1"]
    before = len(demo["repo"].reports(ref))
    with ui_server(demo["repo"].location, env=child_env, allow_run=True) as server:
        driver.get(f"{server.url}/capture/{ref}")
        driver.find_element(By.ID, "run-replay").click()
        _wait(driver).until(ready.presence_of_element_located((By.ID, "job-status")))
        assert _text(driver, "job-state") in ("queued", "running", "done")
        driver.save_screenshot(str(screenshots / "6-action-running.png"))
        seen = set()
        _wait(driver, 240).until(lambda d: seen.add(d.find_element(By.ID, "job-status").text)
                                 or d.find_element(By.ID, "job-state").text in ("done", "failed"))
        assert _text(driver, "job-state") == "done", _text(driver, "job-status")
        assert "PASS" in _text(driver, "job-status") and "(2 / 2)" in _text(driver, "job-status")
        # while it ran, the page showed it running and kept polling. Which stage a 1 s poll catches
        # depends on the machine (a two-call replay can pass from "starting" to done between two
        # polls), so the stage and its <progress> while running are checked on the page itself in
        # tests/ui/test_pages.py::test_a_running_job_shows_its_stage_and_how_far_it_is
        assert any(text.startswith("state: running") for text in seen), seen
        driver.save_screenshot(str(screenshots / "7-action-done.png"))
        driver.find_element(By.ID, "job-reports").click()
        _wait(driver).until(ready.presence_of_element_located((By.CSS_SELECTOR, "section.report")))
        assert driver.find_elements(By.CSS_SELECTOR, "section.report")[0].get_attribute("data-kind") == "replay"
    assert len(modulelens.Repo(demo["repo"].location).reports(ref)) == before + 1


def test_the_saved_file_opens_offline_and_fetches_nothing(demo: dict[str, Any], browser: Any, tmp_path: Path,
                                                          child_env: dict[str, str], screenshots: Path) -> None:
    import subprocess
    import sys

    target = tmp_path / "top_mlp.html"
    done = subprocess.run([sys.executable, "-m", "modulelens", "report", demo["top_v2"], "-o", str(target),
                           "--repo", demo["repo"].location], capture_output=True, text=True, env=child_env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"wrote {target}" in done.stdout
    driver = browser
    requested_urls(driver), console_messages(driver)
    driver.get(target.as_uri())
    assert driver.find_element(By.ID, "capture-ref").text == demo["top_v2"]
    # every call tensor's histogram is in the file (no server to ask), and the reports with their plots
    assert driver.find_elements(By.CSS_SELECTOR, "table[data-part=inputs] svg.hist")
    assert len(driver.find_elements(By.CSS_SELECTOR, "section.report")) >= 2
    assert int(driver.find_element(By.CSS_SELECTOR, "img.sweep").get_attribute("naturalWidth")) > 500
    assert driver.execute_script("return document.scripts.length") == 0
    # the stylesheet applied (allowed by its hash): the header is dark
    assert driver.find_element(By.CSS_SELECTOR, "header.top").value_of_css_property("background-color") == "rgba(36, 41, 47, 1)"
    driver.save_screenshot(str(screenshots / "8-saved-file.png"))
    urls = requested_urls(driver)
    assert [u for u in urls if not u.startswith(("file://", "data:"))] == []
    assert [m for m in console_messages(driver) if "Content Security Policy" in m] == []


def test_long_lists_page_through_in_the_browser(browser: Any, tmp_path: Path, child_env: dict[str, str],
                                                screenshots: Path) -> None:
    """A capture of 45 calls whose call returned 1,200 leaves (issue 35): the capture page shows 20
    calls and a pager, the next page the next 20, a call's page its leaves 500 at a time."""
    from stress.huge_captures import many_calls, many_leaves

    repo = modulelens.Repo(tmp_path / "repo")
    calls, leaves = many_calls(repo, "long/calls", calls=45), many_leaves(repo, "long/leaves", leaves=1_200)
    driver = browser
    with ui_server(repo.location, env=child_env) as server:
        requested_urls(driver), console_messages(driver)
        driver.get(f"{server.url}/capture/{calls}")
        assert len(driver.find_elements(By.CSS_SELECTOR, "section.call")) == 20
        assert driver.find_element(By.ID, "calls-counted").text == "20 of 45 recorded calls (1-20)"
        driver.find_element(By.CSS_SELECTOR, "#calls-pager").find_element(By.LINK_TEXT, "next ›").click()
        _wait(driver).until(lambda d: d.find_element(By.ID, "calls-counted").text == "20 of 45 recorded calls (21-40)")
        assert driver.find_elements(By.CSS_SELECTOR, "section.call")[0].get_attribute("id") == "call-20"
        driver.save_screenshot(str(screenshots / "9-paged-calls.png"))

        driver.get(f"{server.url}/capture/{leaves}")
        output = driver.find_element(By.CSS_SELECTOR, "section.call table[data-part=output]")
        assert len(output.find_elements(By.CSS_SELECTOR, "tbody tr")) == 16
        driver.find_element(By.LINK_TEXT, "all of them").click()
        _wait(driver).until(ready.presence_of_element_located((By.ID, "call-title")))
        rows = driver.find_elements(By.CSS_SELECTOR, "table[data-part=output] tbody tr")
        assert len(rows) == 500 and rows[-1].get_attribute("data-path") == "output[499]"
        driver.find_element(By.ID, "output-pager").find_element(By.LINK_TEXT, "3").click()
        _wait(driver).until(lambda d: "output=3" in d.current_url)
        rows = driver.find_elements(By.CSS_SELECTOR, "table[data-part=output] tbody tr")
        assert len(rows) == 200 and rows[0].get_attribute("data-path") == "output[1000]"
        driver.save_screenshot(str(screenshots / "10-call-leaves.png"))
        assert _only_from(server.url, requested_urls(driver)) == []
        assert [m for m in console_messages(driver) if "Content Security Policy" in m or "SEVERE" in m] == []


# ------------------------------------------------------------------------ a home for each capture


def test_a_name_page_picks_two_versions_for_a_visual_diff(demo: dict[str, Any], browser: Any, child_env: dict[str, str],
                                                          screenshots: Path) -> None:
    """Repo page → a name's page (versions, aliases, timeline) → the two versions picked there →
    the diff with A and B's histograms over each other → another pair from the diff's own picker."""
    from selenium.webdriver.support.ui import Select

    driver = browser
    with ui_server(demo["repo"].location, env=child_env) as server:
        requested_urls(driver), console_messages(driver)
        driver.get(server.url + "/")
        row = next(r for r in driver.find_elements(By.CSS_SELECTOR, "#captures tbody tr")
                   if r.find_element(By.CSS_SELECTOR, "a.ref").text == demo["top_v2"])
        row.find_element(By.CSS_SELECTOR, "a.name-link").click()
        _wait(driver).until(lambda d: d.find_element(By.ID, "name-title").text.startswith("demo/top_mlp"))
        assert [r.get_attribute("data-ref") for r in driver.find_elements(By.CSS_SELECTOR, "#versions tbody tr")] == [
            "demo/top_mlp:v2", "demo/top_mlp:v1"]
        assert {r.get_attribute("data-alias") for r in driver.find_elements(By.CSS_SELECTOR, "#name-aliases tbody tr")} == {
            "latest", "golden"}
        events = [(li.get_attribute("data-kind"), li.find_element(By.CSS_SELECTOR, "a.mono").text)
                  for li in driver.find_elements(By.CSS_SELECTOR, "#timeline li")]
        # (an earlier test of this session may have replayed v1: its report is in the timeline too)
        assert [kind for kind, ref in events if ref == "demo/top_mlp:v2"] == ["profile", "replay", "saved"]
        assert [kind for kind, ref in events if ref == "demo/top_mlp:v1"][-1] == "saved"
        driver.save_screenshot(str(screenshots / "11-name.png"))

        driver.find_element(By.ID, "compare").click()  # A = v1, B = v2, as picked by default
        _wait(driver).until(ready.presence_of_element_located((By.ID, "diff-weights")))
        assert "a=demo%2Ftop_mlp%3Av1" in driver.current_url and "b=demo%2Ftop_mlp%3Av2" in driver.current_url
        overlays = driver.find_elements(By.CSS_SELECTOR, "#diff-weights svg.overlay")
        assert len(overlays) == 6
        drawn = overlays[0].find_elements(By.CSS_SELECTOR, "rect.a"), overlays[0].find_elements(By.CSS_SELECTOR, "rect.b")
        assert len(drawn[0]) == len(drawn[1]) == 40 and any(float(r.get_attribute("height")) > 0 for r in drawn[1])
        assert driver.find_element(By.CSS_SELECTOR, "#diff-inputs svg.overlay")
        driver.save_screenshot(str(screenshots / "12-diff-overlay.png"))

        Select(driver.find_element(By.ID, "diff-a")).select_by_value("demo/top_mlp:v2")  # the picker: v2 against itself
        driver.find_element(By.ID, "diff-go").click()
        _wait(driver).until(lambda d: "a=demo%2Ftop_mlp%3Av2" in d.current_url)
        assert "6 of 6 identical" in driver.find_element(By.CSS_SELECTOR, "h3").text + driver.page_source
        assert _only_from(server.url, requested_urls(driver)) == []
        assert [m for m in console_messages(driver) if "Content Security Policy" in m or "SEVERE" in m] == []


def test_aliases_tags_and_a_description_are_edited_in_the_browser(demo: dict[str, Any], browser: Any, tmp_path: Path,
                                                                 child_env: dict[str, str], screenshots: Path) -> None:
    """With --allow-write: a tag added and one taken off, a description written, an alias set and
    then removed on the name's page, a snippet copied; the repo has them, and the pages show them."""
    import shutil

    shutil.copytree(demo["repo"].location, tmp_path / "repo", symlinks=True)
    repo = modulelens.Repo(tmp_path / "repo")
    driver = browser
    ref = "demo/top_mlp:v2"
    with ui_server(repo.location, env=child_env, allow_write=True) as server:
        requested_urls(driver), console_messages(driver)
        driver.get(f"{server.url}/capture/{ref}")

        def tags() -> list[str]:
            return [p.get_attribute("data-tag") for p in driver.find_elements(By.CSS_SELECTOR, "#tags span.pill")]

        form = driver.find_element(By.ID, "add-tag")
        form.find_element(By.NAME, "value").send_keys("reviewed")
        form.find_element(By.TAG_NAME, "button").click()
        _wait(driver).until(lambda d: "reviewed" in tags())
        driver.find_element(By.CSS_SELECTOR, "#tags span.pill[data-tag=retrained] button").click()
        _wait(driver).until(lambda d: tags() == ["demo", "reviewed"])

        box = driver.find_element(By.CSS_SELECTOR, "#describe-form textarea")
        box.send_keys("Retrained for 8 steps.\nThe candidate for the next release.")
        driver.find_element(By.ID, "save-description").click()
        _wait(driver).until(lambda d: d.find_elements(By.ID, "description"))
        assert driver.find_element(By.ID, "description").text == "Retrained for 8 steps.\nThe candidate for the next release."
        assert driver.find_element(By.ID, "description-lede").text == "Retrained for 8 steps."
        box = driver.find_element(By.CSS_SELECTOR, "#describe-form textarea")  # edited again: the form's own text
        box.send_keys(" Reviewed.")  # (a browser sends its newlines as CRLF: still the text it was shown)
        driver.find_element(By.ID, "save-description").click()
        _wait(driver).until(lambda d: d.find_element(By.ID, "description").text.endswith("release. Reviewed."))

        form = driver.find_element(By.ID, "add-alias")
        form.find_element(By.NAME, "value").send_keys("candidate")
        form.find_element(By.TAG_NAME, "button").click()
        _wait(driver).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#aliases span.pill[data-alias=candidate]"))

        # a snippet copied to the clipboard (the browser's clipboard, granted to this page)
        driver.execute_cdp_cmd("Browser.grantPermissions", {"origin": server.url,
                                                            "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})
        button = driver.find_element(By.CSS_SELECTOR, "button.copy[data-copy=snippet-python]")
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
        button.click()
        _wait(driver).until(lambda d: button.get_attribute("data-state") in ("copied", "selected: press Ctrl+C"))
        copied = driver.execute_async_script("navigator.clipboard.readText().then(arguments[0], () => arguments[0](null))")
        assert button.get_attribute("data-state") == "copied", button.get_attribute("data-state")
        assert copied == driver.find_element(By.ID, "snippet-python").text + "\n" or copied == driver.find_element(
            By.ID, "snippet-python").text
        assert f"modulelens.load('{ref}', repo=" in copied
        driver.execute_script("window.scrollTo(0, 0)")
        driver.save_screenshot(str(screenshots / "13-capture-home.png"))
        driver.execute_script("document.getElementById('use').scrollIntoView()")
        driver.save_screenshot(str(screenshots / "14-snippets-lineage.png"))

        driver.find_element(By.ID, "name-link").click()
        _wait(driver).until(ready.presence_of_element_located((By.ID, "name-aliases")))
        assert driver.find_element(By.CSS_SELECTOR, "#versions tr[data-ref='demo/top_mlp:v2']").text.count("candidate") == 1
        driver.find_element(By.CSS_SELECTOR, "#name-aliases tr[data-alias=golden] button").click()
        _wait(driver).until(lambda d: not d.find_elements(By.CSS_SELECTOR, "#name-aliases tr[data-alias=golden]"))
        assert _only_from(server.url, requested_urls(driver)) == []
        assert [m for m in console_messages(driver) if "Content Security Policy" in m or "SEVERE" in m] == []
    assert repo.info("demo/top_mlp", 2).tags == ("demo", "reviewed")
    assert repo.notes(ref).description == "Retrained for 8 steps.\nThe candidate for the next release. Reviewed."
    assert repo.aliases("demo/top_mlp") == {"candidate": 2}


def test_the_job_column_fills_in_without_a_reload(browser: Any, tmp_path: Path, child_env: dict[str, str]) -> None:
    """A version saved after the server started: its job cell shows "…", then its job, as the page
    asks the server again every 2 s (no reload)."""
    import torch

    repo = modulelens.Repo(tmp_path / "repo")
    module = torch.nn.Linear(2, 2)
    with modulelens.capture(module, targets="Linear", repo=repo, name="early"):
        module(torch.randn(1, 2))
    driver = browser
    with ui_server(repo.location, env=child_env) as server:
        driver.get(server.url + "/")
        _wait(driver).until(lambda d: not d.find_elements(By.CSS_SELECTOR, "#captures [title='being read']"))
        with modulelens.capture(module, targets="Linear", repo=repo, name="late"):
            module(torch.randn(1, 2))
        driver.get(server.url + "/")
        row = next(r for r in driver.find_elements(By.CSS_SELECTOR, "#captures tbody tr")
                   if r.find_element(By.CSS_SELECTOR, "a.ref").text == "late:v1")
        cell = row.find_elements(By.CSS_SELECTOR, "td")[-1]
        host = repo.read_metadata("late", 1)["environment"]["host"]
        _wait(driver, 60).until(lambda d: cell.text.startswith(f"{host} · "))  # the same page, no reload
        assert driver.find_element(By.ID, "job-poller").get_attribute("data-done") == "true"  # and it stopped asking


def test_the_diff_action_shows_its_result_as_a_table(demo: dict[str, Any], browser: Any, child_env: dict[str, str],
                                                     screenshots: Path) -> None:
    driver = browser
    with ui_server(demo["repo"].location, env=child_env, allow_run=True) as server:
        driver.get(f"{server.url}/diff?a={demo['top_v1']}&b={demo['top_v2']}")
        driver.find_element(By.ID, "run-diff").click()
        _wait(driver).until(ready.presence_of_element_located((By.ID, "job-status")))
        _wait(driver, 240).until(lambda d: d.find_element(By.ID, "job-state").text in ("done", "failed"))
        assert _text(driver, "job-state") == "done", _text(driver, "job-status")
        assert driver.find_element(By.CSS_SELECTOR, "#job-outcome .pill").text == "outputs differ"
        assert not driver.find_elements(By.CSS_SELECTOR, "#job-status .pill.fail")
        rows = driver.find_elements(By.CSS_SELECTOR, "#job-calls tbody tr")
        assert len(rows) == 2 and all(r.find_elements(By.TAG_NAME, "td")[1].text == "differs" for r in rows)
        assert "{" not in _text(driver, "job-status")  # no raw JSON
        driver.save_screenshot(str(screenshots / "15-diff-action.png"))
        driver.find_element(By.ID, "job-diff").click()
        _wait(driver).until(ready.presence_of_element_located((By.ID, "diff-weights")))


def test_the_provenance_cell_fills_in_after_the_page(browser: Any, tmp_path: Path, child_env: dict[str, str]) -> None:
    """A capture whose file is not the lines that were signed (reformatted): the page comes without
    waiting for its signature check, and its provenance cell fills in ("yours") with no reload."""
    from stress.hostile import make_base_capture
    from stress.huge_captures import rewrite

    repo = modulelens.Repo(tmp_path / "repo")
    ref = make_base_capture(repo, "reformatted")
    rewrite(repo, ref, lambda meta: None)
    driver = browser
    with ui_server(repo.location, env=child_env) as server:
        requested_urls(driver), console_messages(driver)
        driver.get(f"{server.url}/capture/{ref}")
        _wait(driver).until(ready.presence_of_element_located((By.ID, "capture-ref")))
        _wait(driver).until(lambda d: d.find_element(By.ID, "provenance").text.startswith("yours saved by you"))
        assert driver.find_element(By.ID, "provenance").get_attribute("hx-get") is None  # the answer replaced the cell
        assert not console_messages(driver) and not _only_from(server.url, requested_urls(driver))
