"""A real ``modulelens ui`` server and a real headless Chromium, for the UI's browser tests
(tests/ui) and the stress suite's hostile-UI row (stress/hostile_ui.py).

The browser is Debian's ``chromium`` driven through its ``chromedriver`` by Selenium (nothing is
downloaded: Selenium is pointed at both binaries). Its performance log records every request the
page makes, so "the page fetched nothing from elsewhere" is checked, not assumed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("MODULELENS_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("MODULELENS_CHROMEDRIVER", "/usr/bin/chromedriver")
INSTALL_HINT = "apt-get install -y chromium chromium-driver (as root; .ci/run does this)"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000", "--hide-scrollbars")


def browser_missing() -> str | None:
    """Why no browser test can run here (``None`` when Chromium, its driver and Selenium are there)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{path} not found: the browser tests need Debian's Chromium and its driver: {INSTALL_HINT}"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[test]'"
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Selenium WebDriver) with an empty profile, logging every request."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="modulelens-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def requested_urls(driver: Any) -> list[str]:
    """Every URL a page requested since the last call (from the browser's performance log;
    the browser's own ``chrome://`` pages left out)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if not url.startswith(("chrome://", "chrome-untrusted://", "devtools://")):
                urls.append(url)
    return urls


def console_messages(driver: Any) -> list[str]:
    """The browser console's messages since the last call (CSP reports, script errors)."""
    return [entry["message"] for entry in driver.get_log("browser")]


class UiServer:
    """``modulelens ui`` in a child process, on a free port of 127.0.0.1."""

    def __init__(self, process: subprocess.Popen[str], url: str, token: str | None) -> None:
        self.process = process
        self.url = url
        self.token = token


@contextmanager
def ui_server(repo: str | Path, *, allow_run: bool = False, allow_write: bool = False, host: str = "127.0.0.1",
              env: dict[str, str] | None = None, timeout: float = 120.0) -> Iterator[UiServer]:
    """Start ``modulelens ui --repo REPO --port 0 --no-open`` and yield once it prints its address;
    stop it with SIGINT (as Ctrl+C would) afterwards."""
    command = [sys.executable, "-m", "modulelens", "ui", "--repo", str(repo), "--port", "0", "--no-open",
               "--host", host, *(["--allow-run"] if allow_run else []), *(["--allow-write"] if allow_write else [])]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               stdin=subprocess.DEVNULL, env=env)
    lines: list[str] = []
    url = token = None
    deadline = time.monotonic() + timeout
    assert process.stderr is not None
    while url is None:
        line = process.stderr.readline()
        if not line:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"modulelens ui did not start: {''.join(lines)}")
            continue
        lines.append(line)
        if " at http://" in line:
            address = line.split(" at ", 1)[1].split(" ", 1)[0]
            url, _, query = address.partition("?")
            url = url.rstrip("/")
            token = query.removeprefix("token=") or None
    drain = threading.Thread(target=lambda: [lines.append(x) for x in process.stderr], daemon=True)  # type: ignore[union-attr]
    drain.start()
    try:
        yield UiServer(process, url, token)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class Beacon:
    """An HTTP server on loopback that counts every request: hostile strings point their fetches,
    images and styles at it, so any request it gets is a request a page should not have made."""

    def __init__(self) -> None:
        hits: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                self.send_response(204)
                self.end_headers()

            do_POST = do_GET  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self.hits = hits
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
