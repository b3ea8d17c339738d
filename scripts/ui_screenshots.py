"""The screenshots of docs/ui.md: the demo's captures (tests/support/ui_support.py), a kernel
candidate verified against one of them, a description, a tag and an alias written through the
pages, then each page in Debian's headless Chromium (stress/browser.py), saved as small PNG files
(256-colour palettes) in docs/images/ui/.

    python scripts/ui_screenshots.py            # about two minutes; needs chromium, chromium-driver, triton

Every page is checked as it is taken (its main element is there, and nothing was requested beyond
the server), so a screenshot of an error page is never committed.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # stress/ (the browser) and this checkout's modulelens
OUT = ROOT / "docs" / "images" / "ui"
WINDOW = (1280, 900)


def _repo(folder: Path) -> tuple[Any, dict[str, Any]]:
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from ui_support import make_demo_repo

    demo = make_demo_repo(folder)
    repo = demo["repo"]
    try:
        from kernel_models import capture_all

        from modulelens.kernels.options import CandidatePolicy
        from modulelens.kernels.verify import verify_kernel

        capture_all(str(folder))
        verify_kernel("km/act", ROOT / "tests" / "support" / "kernel_candidates" / "scaled_gelu.py", repo=repo,
                      policy=CandidatePolicy(timeout=300))
    except ImportError as error:  # no triton: the reports screenshot shows the demo's reports only
        print(f"no kernel report ({error})", file=sys.stderr)
    return repo, demo


def _save(driver: Any, name: str, server_url: str) -> None:
    from PIL import Image

    from stress.browser import requested_urls

    elsewhere = [u for u in requested_urls(driver) if not (u.startswith(server_url) or u.startswith("data:"))]
    if elsewhere:
        raise SystemExit(f"{name}: the page requested {elsewhere[:3]}")
    raw = OUT / f"{name}.raw.png"
    driver.save_screenshot(str(raw))
    with Image.open(raw) as image:
        image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(OUT / f"{name}.png", optimize=True)
    raw.unlink()
    print(f"{name}.png {(OUT / f'{name}.png').stat().st_size // 1024} KiB")


def main() -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    from stress.browser import chromium, requested_urls, ui_server

    work = Path(tempfile.gettempdir()) / "modulelens-screenshots"
    shutil.rmtree(work, ignore_errors=True)
    repo, demo = _repo(work / "repo")
    OUT.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(work), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with ui_server(repo.location, allow_run=True, allow_write=True, env=env) as server, chromium() as driver:
        driver.set_window_size(*WINDOW)
        wait = WebDriverWait(driver, 240)
        url = server.url

        def visit(path: str, element: str) -> None:
            driver.get(url + path)
            wait.until(ready.presence_of_element_located((By.ID, element)))

        requested_urls(driver)
        visit(f"/capture/{demo['top_v2']}", "describe-form")  # write through the page, as a user would
        driver.find_element(By.CSS_SELECTOR, "#describe-form textarea").send_keys(
            "Retrained for 8 more steps: the candidate for the next release.")
        driver.find_element(By.ID, "save-description").click()
        wait.until(ready.presence_of_element_located((By.ID, "description")))
        for form, value in (("add-tag", "reviewed"), ("add-alias", "candidate")):
            box = driver.find_element(By.ID, form)
            box.find_element(By.NAME, "value").send_keys(value)
            box.find_element(By.TAG_NAME, "button").click()
            wait.until(ready.presence_of_element_located((By.ID, "capture-ref")))

        visit("/", "captures")
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, "#captures [title='being read']"))
        _save(driver, "repo", url)
        visit("/name/demo/top_mlp", "timeline")
        _save(driver, "name", url)
        visit(f"/capture/{demo['top_v2']}", "capture-ref")
        _save(driver, "capture", url)
        driver.execute_script("document.getElementById('use').scrollIntoView()")
        _save(driver, "capture-use-lineage", url)
        visit(f"/capture/{demo['top_v2']}/call/0", "call-title")
        _save(driver, "call", url)
        visit(f"/capture/{demo['top_v2']}/reports", "history-plot")
        _save(driver, "reports", url)
        visit(f"/diff?a={demo['top_v1']}&b={demo['top_v2']}", "diff-weights")
        driver.execute_script("document.getElementById('diff-weights').scrollIntoView()")
        driver.execute_script("window.scrollBy(0, -60)")
        _save(driver, "diff", url)
        if repo.list("km/act"):
            visit("/capture/km/act:v1/reports", "back-to-capture")
            _save(driver, "kernel-report", url)
        visit(f"/diff?a={demo['top_v1']}&b={demo['top_v2']}", "run-diff")
        driver.find_element(By.ID, "run-diff").click()
        wait.until(lambda d: d.find_element(By.ID, "job-state").text in ("done", "failed"))
        _save(driver, "diff-action", url)
        saved = work / "top_mlp.html"  # the saved file (`modulelens report`), opened from disk
        driver.get(f"{url}/capture/{demo['top_v2']}")
        from modulelens.interfaces.ui.export import standalone_html
        from modulelens.interfaces.ui.repo_view import RepoView

        view = RepoView(repo, scan_jobs=False)
        saved.write_text(standalone_html(view, view.capture(*repo.resolve(demo["top_v2"]))), encoding="utf-8")
        requested_urls(driver)
        driver.get(saved.as_uri())
        wait.until(ready.presence_of_element_located((By.ID, "capture-ref")))
        _save(driver, "saved-file", "file://")


if __name__ == "__main__":
    main()
