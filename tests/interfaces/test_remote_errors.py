"""Every remote failure is one line and exit 7 (a JSON error object under --json), for every command.

The failures are real: a SeaweedFS server on loopback with users (an admin and a read-only user,
``weed shell s3.configure``) and, for throttling, its circuit breaker set to refuse every request
(``s3.circuitBreaker``); "unreachable" is a closed port. Commands run in-process through typer's
runner (one subprocess per entry point: ``run``, which starts the user's job, and ``ui``).
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import torch
from child_process import PYTHON, subprocess_env
from seaweed import SeaweedServer
from typer.testing import CliRunner

import modulelens
from modulelens.interfaces.cli import app

BUCKET = "modulelens-errors"
URL = f"s3://{BUCKET}/team"
ADMIN = {"AWS_ACCESS_KEY_ID": "admin-key", "AWS_SECRET_ACCESS_KEY": "admin-secret"}
READER = {"AWS_ACCESS_KEY_ID": "reader-key", "AWS_SECRET_ACCESS_KEY": "reader-secret"}
# No credentials anywhere botocore looks: environment, files, the instance metadata service.
NO_CREDENTIALS = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_PROFILE": None,
                  "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent"}

JOB = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
for _ in range(3):
    model(torch.randn(2, 4))
print("the job ran to its end", flush=True)
"""


def _closed_port() -> int:
    with socket.socket() as sock:  # bound, never listening, then closed: connections are refused
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """SeaweedFS holding one capture at :data:`URL`, then with authentication on (two users)."""
    server = SeaweedServer(tmp_path_factory.mktemp("weed")).start()
    try:
        env = {**server.env, "MODULELENS_CACHE": str(tmp_path_factory.mktemp("cache"))}
        code = ("import modulelens, torch\nmodulelens.track_init()\nm = torch.nn.Linear(3, 3)\n"
                f"with modulelens.capture(m, targets='Linear', name='lin', repo={URL!r}) as cap:\n    m(torch.randn(2, 3))\n"
                "assert cap.wait(), 'upload failed'\n")
        subprocess.run([PYTHON, "-c", code], env=subprocess_env(**env), check=True, timeout=300)
        server.shell("s3.configure -user admin -access_key admin-key -secret_key admin-secret "
                     "-actions Admin,Read,Write,List,Tagging -apply",
                     "s3.configure -user reader -access_key reader-key -secret_key reader-secret -actions Read,List -apply")
        yield server
    finally:
        server.stop()


@pytest.fixture
def local_repo(tmp_path: Path) -> Path:
    """A local repo holding ``lin`` (what ``push`` sends)."""
    module = torch.nn.Linear(3, 3)
    with modulelens.capture(module, targets="Linear", name="lin", repo=tmp_path / "local") as cap:
        module(torch.randn(2, 3))
    assert cap.saved
    return tmp_path / "local"


def _commands(tmp_path: Path, local: Path, url: str) -> dict[str, list[str]]:
    """A command line of every command that reaches a repo, each aimed at ``url``."""
    candidate = tmp_path / "candidate.py"
    candidate.write_text("import torch\nclass Same(torch.nn.Linear):\n    pass\n")
    repo = ["--repo", url]
    return {
        "ls": ["ls", *repo],
        "show": ["show", "lin", *repo],
        "replay": ["replay", "lin", *repo],
        "alias": ["alias", "lin:v1", "golden", *repo],
        "rm": ["rm", "lin:v1", "--yes", *repo],
        "gc": ["gc", "--dry-run", *repo],
        "fsck": ["fsck", *repo],
        "diff": ["diff", "lin:v1", "lin:v1", *repo],
        "profile": ["profile", "lin", *repo],
        "verify": ["verify", "lin", "--candidate", f"{candidate}:Same", *repo],
        "export": ["export", "lin", "-o", str(tmp_path / "problem"), *repo],
        "report": ["report", "lin", "-o", str(tmp_path / "lin.html"), *repo],
        "pull": ["pull", url, "lin", "--repo", str(tmp_path / "pulled")],
        "push": ["push", "lin", "--repo", str(local), "--to", url],
    }


def _environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, values: dict[str, str | None]) -> None:
    """This process talks to the server as ``values`` say, with a fresh cache (no mirror to fall back
    on) and one attempt per request (botocore's retries only make each failure slower)."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # a filesystem keeps the credentials it was made with
    monkeypatch.setenv("MODULELENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.delenv("MODULELENS_OFFLINE", raising=False)
    for key, value in values.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)


def _check_every_command(commands: dict[str, list[str]], expected: str, tmp_path: Path) -> None:
    """Each command, with --json and without: exit 7, one JSON error object / one line on stderr
    that says ``expected``; nothing half-made left behind."""
    wrong = []
    runner = CliRunner()
    for name, argv in commands.items():
        as_json = runner.invoke(app, [*argv, "--json"])
        plain = runner.invoke(app, argv)
        try:
            envelope = json.loads(as_json.stdout)
            error = envelope["error"]
            assert (as_json.exit_code, envelope["ok"], error["type"], error["exit_code"]) == (7, False, "RemoteRepoError", 7)
            assert expected in error["message"] and "\n" not in error["message"]
            lines = plain.stderr.strip().splitlines()
            assert plain.exit_code == 7 and len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
        except (AssertionError, KeyError, ValueError) as failure:
            wrong.append(f"{name}: {failure!r}\n  --json: exit {as_json.exit_code} {as_json.stdout[-600:]!r} "
                         f"{as_json.exception!r}\n  plain: exit {plain.exit_code} {plain.stderr[-600:]!r}")
    assert not (tmp_path / "pulled").exists(), "a failed pull left a repo behind"
    assert not wrong, "\n".join(wrong)


def test_no_credentials(server: SeaweedServer, local_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _environment(monkeypatch, tmp_path, {**server.env, **NO_CREDENTIALS})
    _check_every_command(_commands(tmp_path, local_repo, URL), f"no credentials for {URL}", tmp_path)


def test_unreachable_endpoint(server: SeaweedServer, local_repo: Path, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    port = _closed_port()
    _environment(monkeypatch, tmp_path, {**server.env, **ADMIN, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"})
    _check_every_command(_commands(tmp_path, local_repo, URL), f"{URL} is unreachable at http://127.0.0.1:{port}", tmp_path)


def test_missing_bucket(server: SeaweedServer, local_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a repo in a bucket that does not exist (writing into one creates the bucket: push, run)."""
    _environment(monkeypatch, tmp_path, {**server.env, **ADMIN})
    commands = _commands(tmp_path, local_repo, "s3://no-such-bucket/team")
    del commands["push"]
    _check_every_command(commands, "the bucket of s3://no-such-bucket/team (no-such-bucket) does not exist", tmp_path)


def test_unknown_access_key(server: SeaweedServer, local_repo: Path, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    _environment(monkeypatch, tmp_path, {**server.env, "AWS_ACCESS_KEY_ID": "nobody", "AWS_SECRET_ACCESS_KEY": "wrong"})
    _check_every_command(_commands(tmp_path, local_repo, URL), f"permission denied by {URL} (InvalidAccessKeyId", tmp_path)


def test_permission_denied_to_write(server: SeaweedServer, local_repo: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A user who may read but not write: every writing command says so; reading still works."""
    _environment(monkeypatch, tmp_path, {**server.env, **READER})
    commands = _commands(tmp_path, local_repo, URL)
    _check_every_command({name: commands[name] for name in ("alias", "rm", "push")},
                         f"permission denied by {URL} (AccessDenied", tmp_path)
    listed = CliRunner().invoke(app, [*commands["ls"], "--json"])
    assert listed.exit_code == 0 and [v["ref"] for v in json.loads(listed.stdout)["result"]] == ["lin:v1"]


def test_throttling(server: SeaweedServer, local_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server refuses every request as too many (its circuit breaker at 0 requests at a time)."""
    _environment(monkeypatch, tmp_path, {**server.env, **ADMIN})
    server.shell("s3.circuitBreaker -global -type Count -actions Read,Write,List -values 0,0,0 -apply")
    try:
        _check_every_command(_commands(tmp_path, local_repo, URL), f"{URL} is throttling requests (ErrTooManyRequest", tmp_path)
    finally:
        server.shell("s3.circuitBreaker -global -delete -apply")


def test_run_keeps_the_job_running_and_says_how_to_push(server: SeaweedServer, tmp_path: Path) -> None:
    """``modulelens run`` with an unreachable remote: the job runs to its end, its captures are kept
    locally, the one error line (exit 7) is the command that pushes them; that command works once
    the server is reachable."""
    (tmp_path / "job.py").write_text(JOB)
    cache = tmp_path / "cache"
    down = {**server.env, **ADMIN, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{_closed_port()}", "AWS_MAX_ATTEMPTS": "1",
            "MODULELENS_CACHE": str(cache)}
    done = subprocess.run([PYTHON, "-m", "modulelens", "run", "-t", "0", "--name", "job", "--repo", f"{URL}/runs",
                           "--", sys.executable, "job.py"], cwd=tmp_path, env=subprocess_env(**down),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 7, done.stderr
    assert "the job ran to its end" in done.stdout
    assert "Traceback" not in done.stderr
    # what is captured is said before the job starts (the banner), after the one line about the repo
    banner = [line for line in done.stderr.splitlines() if line.startswith("modulelens: capturing ")]
    assert banner == [f"modulelens: capturing 0 (its first call) as job/<module> into {cache}/staging/"
                      f"{quote(URL + '/runs', safe='')}; running {sys.executable} job.py"], done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "is unreachable" in errors[0] and "the job ran and 1 capture(s) are kept in" in errors[0]
    push = errors[0].split("push them with: ", 1)[1]
    assert push.startswith("modulelens push job/0 --repo ") and push.endswith(f"--to {URL}/runs")

    up = {**server.env, **ADMIN, "MODULELENS_CACHE": str(cache)}
    pushed = subprocess.run([PYTHON, "-m", "modulelens", *shlex.split(push)[1:]], cwd=tmp_path,
                            env=subprocess_env(**up), capture_output=True, text=True, timeout=300)
    assert pushed.returncode == 0, pushed.stderr
    listed = subprocess.run([PYTHON, "-m", "modulelens", "ls", "--repo", f"{URL}/runs", "--json"], env=subprocess_env(**up),
                            capture_output=True, text=True, timeout=120)
    assert [v["ref"] for v in json.loads(listed.stdout)["result"]] == ["job/0:v1"]

    as_json = subprocess.run([PYTHON, "-m", "modulelens", "run", "-t", "0", "--name", "job", "--repo", f"{URL}/runs",
                              "--json", "--", sys.executable, "job.py"], cwd=tmp_path, env=subprocess_env(**down),
                             capture_output=True, text=True, timeout=300)
    envelope = json.loads(as_json.stdout)  # the cache now mirrors the repo: the upload at the end fails instead
    assert as_json.returncode == 7 and envelope["error"]["type"] == "RemoteRepoError", as_json.stdout
    assert "is unreachable" in envelope["error"]["message"] and "push them with: modulelens push job/0" in envelope["error"]["message"]
    assert "the job ran to its end" in as_json.stderr  # the job's own output goes to stderr under --json


def test_ui_on_an_unreachable_remote_is_one_line(server: SeaweedServer, tmp_path: Path) -> None:
    env = {**server.env, **ADMIN, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{_closed_port()}", "AWS_MAX_ATTEMPTS": "1",
           "MODULELENS_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([PYTHON, "-m", "modulelens", "ui", "--repo", URL, "--port", "0", "--no-open"],
                          env=subprocess_env(**env), capture_output=True, text=True, timeout=120)
    assert done.returncode == 7
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "is unreachable" in done.stderr, done.stderr


def test_an_offline_refusal_comes_before_torch_is_imported(tmp_path: Path) -> None:
    """``MODULELENS_OFFLINE=1 modulelens replay`` with nothing cached refuses at once: the repo and
    the ref are resolved before torch (seconds) is imported."""
    env = {"MODULELENS_OFFLINE": "1", "MODULELENS_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([PYTHON, "-X", "importtime", "-m", "modulelens", "replay", "ranker/top_mlp:golden",
                           "--repo", URL], env=subprocess_env(**env), capture_output=True, text=True, timeout=120)
    assert done.returncode == 7
    assert f"error: MODULELENS_OFFLINE is set and the cache has nothing from {URL}" in done.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert imported and "torch" not in imported
