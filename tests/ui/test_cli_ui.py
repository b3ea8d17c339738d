"""``modulelens ui`` and ``modulelens report`` as commands, and the deep links ``show`` prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from modulelens.interfaces.ui import discovery
from stress.browser import ui_server


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "modulelens", *args], capture_output=True, text=True, env=env,
                          timeout=300, stdin=subprocess.DEVNULL)


def test_show_prints_the_page_of_a_running_ui_and_not_after_it_stops(demo: dict[str, Any], child_env: dict[str, str],
                                                                     runtime_dir: Path) -> None:
    repo = demo["repo"].location
    with ui_server(repo, env=child_env) as server:
        [announcement] = list((runtime_dir / "modulelens").glob("ui-*.json"))
        assert json.loads(announcement.read_text())["url"] == server.url
        assert oct(announcement.stat().st_mode & 0o777) == "0o600"
        shown = _cli("show", "demo/top_mlp:golden", "--repo", repo, env=child_env)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.strip().endswith(f"in the browser: {server.url}/capture/demo/top_mlp:v1")
        other = _cli("show", "demo/top_mlp", "--repo", str(Path(repo).parent / "elsewhere"), env=child_env)
        assert "in the browser" not in other.stdout  # another repo: no link to this server
    assert not announcement.exists()  # removed on exit (Ctrl+C)
    after = _cli("show", "demo/top_mlp", "--repo", repo, env=child_env)
    assert after.returncode == 0 and "in the browser" not in after.stdout


def test_a_stale_announcement_is_ignored_and_removed(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    folder = tmp_path / "modulelens"
    folder.mkdir()
    stale = folder / f"ui-{dead.stdout.strip()}.json"
    stale.write_text(json.dumps({"url": "http://127.0.0.1:9", "pid": int(dead.stdout), "repo": "/r", "token": None}))
    alive_but_closed = folder / f"ui-{os.getpid()}.json"  # a live pid whose port nobody listens on (pid reused)
    alive_but_closed.write_text(json.dumps({"url": "http://127.0.0.1:9", "pid": os.getpid(), "repo": "/r", "token": None}))
    assert discovery.capture_url("/r", "a:v1") is None
    assert not stale.exists() and not alive_but_closed.exists()


def test_report_writes_one_file_and_refuses_a_folder(demo: dict[str, Any], child_env: dict[str, str], tmp_path: Path) -> None:
    target = tmp_path / "out.html"
    done = _cli("report", "demo/top_mlp:golden", "-o", str(target), "--repo", demo["repo"].location, "--json", env=child_env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)["result"]
    assert result["ref"] == "demo/top_mlp:v1" and result["bytes"] == len(target.read_bytes())
    refused = _cli("report", "demo/top_mlp", "-o", str(tmp_path), "--repo", demo["repo"].location, env=child_env)
    assert refused.returncode == 2 and refused.stderr.startswith("error: -o") and refused.stderr.count("\n") == 1
    missing = _cli("report", "demo/nope", "-o", str(target), "--repo", demo["repo"].location, env=child_env)
    assert missing.returncode == 2 and missing.stderr.startswith("error: ") and missing.stderr.count("\n") == 1


def test_ui_refuses_a_taken_port_and_an_open_host_gets_a_token(demo: dict[str, Any], child_env: dict[str, str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        busy = _cli("ui", "--repo", demo["repo"].location, "--port", str(port), "--no-open", env=child_env)
    assert busy.returncode == 2 and busy.stderr.startswith("error: cannot listen on 127.0.0.1:") and "--port" in busy.stderr
    with ui_server(demo["repo"].location, env=child_env, host="0.0.0.0") as server:
        assert server.token and len(server.token) >= 24
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(server.url.replace("0.0.0.0", "127.0.0.1") + "/", timeout=30)
            raise AssertionError("served without the token")
        except urllib.error.HTTPError as refused:
            assert refused.code == 401
        request = urllib.request.Request(server.url.replace("0.0.0.0", "127.0.0.1") + "/",
                                         headers={"Authorization": f"Bearer {server.token}"})
        with urllib.request.urlopen(request, timeout=30) as page:
            assert page.status == 200 and b"demo/top_mlp:v2" in page.read()
