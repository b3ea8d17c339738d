"""The MCP server: in-process through the SDK client, and as a real ``modulelens mcp`` stdio subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import agents_support as support

mcp = pytest.importorskip("mcp")
from mcp import Client, StdioServerParameters  # noqa: E402

from modulelens.interfaces.mcp_server import build_server  # noqa: E402

TOOLS = {"list_captures", "show_capture", "replay_capture", "diff_captures", "profile_capture", "verify_candidate",
         "verify_kernel", "export_kernel_problem", "locate_divergence"}
READ_ONLY = {"list_captures", "show_capture", "replay_capture", "diff_captures"}

CANDIDATES = """
import os
import time

import torch


class SameHead(torch.nn.Linear):
    pass


class ScaledHead(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


class Exits(torch.nn.Linear):
    def forward(self, x):
        os._exit(7)


class Hangs(torch.nn.Linear):
    def forward(self, x):
        time.sleep(600)
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return support.make_repo(tmp_path_factory.mktemp("repo"))


def text_of(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


async def check_common_tools(client: Any, repo: Path) -> None:
    """Assertions shared by the in-process and the stdio runs."""
    tools = (await client.list_tools()).tools
    assert {t.name for t in tools} == TOOLS
    for tool in tools:
        assert tool.description and tool.input_schema["type"] == "object" and tool.output_schema is not None
        assert tool.annotations.read_only_hint is (tool.name in READ_ONLY), tool.name
        assert "options" not in tool.input_schema["properties"], tool.name  # typed arguments only

    r = await client.call_tool("list_captures", {})
    assert not r.is_error
    assert [c["ref"] for c in r.structured_content["captures"]] == ["toy/gate:v1", "toy/head:v1", "toy/noisy:v1"]
    assert r.structured_content["repo"] == str(repo)
    r = await client.call_tool("list_captures", {"prefix": "toy/head"})
    assert [c["ref"] for c in r.structured_content["captures"]] == ["toy/head:v1"]

    r = await client.call_tool("show_capture", {"ref": "toy/gate"})
    assert not r.is_error, text_of(r)
    shown = r.structured_content
    assert shown["ref"] == "toy/gate:v1" and shown["module_class"] == "agents_support:Gate"
    assert shown["construction"]["kwargs"]["scale"] == 0.5
    inputs = {row["path"]: row for row in shown["calls"][0]["inputs"]}
    assert inputs["args[0]"]["shape"] == [3, 8] and inputs["args[0]"]["dtype"] == "float32"
    assert inputs["args[0]"]["device"] == "cpu" and set(inputs["args[0]"]["stats"]) >= {"min", "max", "mean", "std"}
    assert inputs["kwargs['mask']"]["stats"]["mean"] == 1.0
    assert [row["path"] for row in shown["calls"][1]["outputs"]] == ["output[0]", "output[1]"]
    assert {row["path"] for row in shown["tensors"]} == {"up.weight", "up.bias", "down.weight", "down.bias", "calls"}
    assert json.loads(text_of(r))["ref"] == "toy/gate:v1"  # the text content carries the same JSON

    r = await client.call_tool("replay_capture", {"ref": "toy/gate:v1"})
    assert not r.is_error and r.structured_content["passed"] is True
    assert [c["passed"] for c in r.structured_content["calls"]] == [True, True]
    r = await client.call_tool("replay_capture", {"ref": "toy/gate", "rtol": 1e-3, "atol": 1e-5})
    assert r.structured_content["mode"] == "tolerance" and r.structured_content["passed"]

    # user errors are tool errors with their message, not crashes
    r = await client.call_tool("show_capture", {"ref": "toy/gat"})
    assert r.is_error and text_of(r).startswith("Error executing tool show_capture: no capture named 'toy/gat'")
    assert text_of(r).endswith("did you mean: toy/gate?") and "\n" not in text_of(r)
    r = await client.call_tool("replay_capture", {"ref": "Bad Name!"})
    assert r.is_error and text_of(r).startswith("Error executing tool replay_capture: ")
    r = await client.call_tool("replay_capture", {"ref": "toy/gate", "dtype": "float33"})
    assert r.is_error and "unknown dtype 'float33'" in text_of(r)
    r = await client.call_tool("show_capture", {})  # missing argument
    assert r.is_error and "validation error" in text_of(r)
    r = await client.call_tool("replay_capture", {"ref": "toy/gate", "rtol": "loose"})  # wrong type
    assert r.is_error and "validation error" in text_of(r)
    r = await client.call_tool("verify_candidate", {"ref": "toy/gate", "candidate": str(repo / "missing.py:Fast")})
    assert r.is_error and "does not exist" in text_of(r)
    r = await client.call_tool("no_such_tool", {})
    assert r.is_error

    r = await client.call_tool("diff_captures", {"a": "toy/gate", "b": "toy/gate:v1"})
    assert not r.is_error, text_of(r)
    assert r.structured_content["summary"]["tensors"] == 5 and r.structured_content["constructor"] == []


@pytest.mark.anyio
async def test_in_process(repo: Path) -> None:
    server = build_server(str(repo))
    async with Client(server, raise_exceptions=True) as client:
        await check_common_tools(client, repo)


@pytest.mark.anyio
async def test_in_process_tools_run_for_real(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", support.subprocess_env(tmp_path)["PYTHONPATH"])
    (tmp_path / "cands.py").write_text(CANDIDATES)
    server = build_server(str(repo))
    async with Client(server, raise_exceptions=True) as client:
        r = await client.call_tool("profile_capture", {"ref": "toy/head", "iters": 3, "warmup": 1})
        assert not r.is_error, text_of(r)
        assert r.structured_content["ref"] == "toy/head:v1" and r.structured_content["latency"]["iterations"] == 3

        # candidates run in a child process: a pass, a fail with its failures, a crash and a hang
        r = await client.call_tool("verify_candidate", {"ref": "toy/head", "candidate": "cands.py:SameHead",
                                                        "timing": False})
        assert not r.is_error, text_of(r)
        assert r.structured_content["passed"] is True and r.structured_content["ref"] == "toy/head:v1"
        r = await client.call_tool("verify_candidate", {"ref": "toy/head", "candidate": "cands.py:ScaledHead",
                                                        "timing": False})
        assert r.structured_content["passed"] is False and "output" in r.structured_content["failures"][0]
        r = await client.call_tool("verify_candidate", {"ref": "toy/head", "candidate": "cands.py:Exits"})
        assert r.is_error and "exited with code 7" in text_of(r)
        r = await client.call_tool("verify_candidate", {"ref": "toy/head", "candidate": "cands.py:Hangs",
                                                        "timeout_s": 8})
        assert r.is_error and "did not finish within 8 s" in text_of(r)
        r = await client.call_tool("verify_candidate", {"ref": "toy/head", "candidate": "cands.py:Missing",
                                                        "timing": False})
        assert r.is_error and "Missing" in text_of(r)
        r = await client.call_tool("replay_capture", {"ref": "toy/head"})  # the server survived all of it
        assert r.structured_content["passed"] is True

        out = tmp_path / "problem"
        r = await client.call_tool("export_kernel_problem", {"ref": "toy/head", "output_dir": str(out)})
        assert not r.is_error, text_of(r)
        assert (out / "problem.py").is_file() and r.structured_content["directory"] == str(out)
        r = await client.call_tool("export_kernel_problem", {"ref": "toy/head", "output_dir": str(out)})
        assert r.is_error and "is not empty" in text_of(r) and "\n" not in text_of(r)
        r = await client.call_tool("verify_kernel", {"ref": "toy/head", "candidate": "nope.py"})
        assert r.is_error and "nope.py does not exist" in text_of(r)


@pytest.mark.anyio
async def test_stdio_subprocess(repo: Path, tmp_path: Path) -> None:
    params = StdioServerParameters(command=support.python(),
                                   args=["-m", "modulelens", "mcp", "--repo", str(repo)],
                                   cwd=str(tmp_path), env=support.subprocess_env(tmp_path))
    async with Client(params) as client:
        await check_common_tools(client, repo)
        # a module that prints to stdout and warns: the protocol stream survives
        r = await client.call_tool("replay_capture", {"ref": "toy/noisy"})
        assert not r.is_error and r.structured_content["passed"] is True


def test_stdout_carries_only_protocol(repo: Path, tmp_path: Path) -> None:
    """Raw newline-delimited JSON-RPC: every stdout line is a JSON-RPC message."""
    proc = subprocess.Popen([support.python(), "-m", "modulelens", "mcp", "--repo", str(repo)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=support.subprocess_env(tmp_path), cwd=tmp_path)
    assert proc.stdin and proc.stdout
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "replay_capture", "arguments": {"ref": "toy/noisy"}}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "show_capture", "arguments": {"ref": "toy/missing"}}},
    ]
    lines: list[str] = []
    try:
        for message in messages:
            proc.stdin.write(json.dumps(message) + "\n")
            proc.stdin.flush()
        deadline = time.monotonic() + 120
        replies: dict[int, Any] = {}
        while len(replies) < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            data = json.loads(line)  # anything that is not JSON would fail here
            assert data["jsonrpc"] == "2.0"
            if "id" in data:
                replies[data["id"]] = data
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    rest = proc.stdout.read()
    stderr = proc.stderr.read() if proc.stderr else ""
    assert all(json.loads(line) for line in rest.splitlines() if line.strip())
    assert set(replies) == {1, 2, 3}, (lines, stderr[-2000:])
    assert replies[1]["result"]["serverInfo"]["name"] == "modulelens"
    assert replies[2]["result"]["isError"] is False and replies[2]["result"]["structuredContent"]["passed"] is True
    assert replies[3]["result"]["isError"] is True
    assert "noisy forward on stdout" in stderr  # the module's print went to stderr
    assert "noisy forward warning" in stderr


@pytest.mark.anyio
async def test_a_remote_repo_is_named_by_its_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Listing and describing a capture of a remote repo name the URL, never the local cache mirror."""
    import torch

    import modulelens

    monkeypatch.setenv("MODULELENS_CACHE", str(tmp_path / "cache"))
    url = f"memory://mcp-{tmp_path.name}"
    module = torch.nn.Linear(4, 4)
    with modulelens.capture(module, targets="Linear", repo=url, name="remote/lin") as cap:
        module(torch.randn(2, 4))
    cap.wait()  # uploaded in the background
    async with Client(build_server(url), raise_exceptions=True) as client:
        listed = (await client.call_tool("list_captures", {})).structured_content
        shown = (await client.call_tool("show_capture", {"ref": "remote/lin"})).structured_content
    assert listed["repo"] == url
    assert listed["captures"][0]["path"] == shown["path"] == f"{url}/names/remote%2Flin/versions/1"
    assert str(tmp_path / "cache") not in json.dumps([listed, shown])
