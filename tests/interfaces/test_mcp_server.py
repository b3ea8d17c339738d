"""The MCP server: in-process through the SDK client, and as a real ``modulelens mcp`` stdio subprocess."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import agents_support as support
import pytest

mcp = pytest.importorskip("mcp")
from mcp import Client, StdioServerParameters  # noqa: E402

from modulelens.interfaces.mcp_server import build_server  # noqa: E402
from modulelens.restore.loader import Capture  # noqa: E402

TOOLS = {"list_captures", "show_capture", "replay_capture", "profile_capture", "verify_candidate",
         "export_kernel_problem"}
HAS_EXPORT = importlib.util.find_spec("modulelens.kernels.export") is not None \
    if importlib.util.find_spec("modulelens.tools") else False


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
    r = await client.call_tool("show_capture", {"ref": "toy/nope"})
    assert r.is_error and "no capture named 'toy/nope'" in text_of(r)
    r = await client.call_tool("replay_capture", {"ref": "Bad Name!"})
    assert r.is_error
    r = await client.call_tool("show_capture", {})  # missing argument
    assert r.is_error and "validation error" in text_of(r)
    r = await client.call_tool("replay_capture", {"ref": "toy/gate", "rtol": "loose"})  # wrong type
    assert r.is_error and "validation error" in text_of(r)
    r = await client.call_tool("verify_candidate", {"ref": "toy/gate", "candidate": str(repo / "missing.py:Fast")})
    assert r.is_error and "does not exist" in text_of(r)
    r = await client.call_tool("no_such_tool", {})
    assert r.is_error

    if not HAS_EXPORT:
        r = await client.call_tool("export_kernel_problem", {"ref": "toy/gate", "output_dir": str(repo / "k")})
        assert r.is_error and "not available" in text_of(r) and "export_kernelbench" in text_of(r)
    if not support.has_method("profile"):
        r = await client.call_tool("profile_capture", {"ref": "toy/gate"})
        assert r.is_error and "not available" in text_of(r)


@pytest.mark.anyio
async def test_in_process(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = build_server(str(repo))
    async with Client(server, raise_exceptions=True) as client:
        await check_common_tools(client, repo)

        # profile / verify go through Capture.profile / Capture.verify (modulelens.tools)
        seen: dict[str, Any] = {}

        def profile(self: Capture, **options: Any) -> support.FakeReport:
            seen["profile"] = (self.device, options)
            return support.FakeReport({"ref": self.ref, "mean_ms": float("nan")})

        def verify(self: Capture, candidate: Any) -> support.FakeReport:
            seen["verify"] = candidate
            return support.FakeReport({"ref": self.ref, "passed": True}, passed=True)

        monkeypatch.setattr(Capture, "profile", profile, raising=False)
        monkeypatch.setattr(Capture, "verify", verify, raising=False)
        r = await client.call_tool("profile_capture", {"ref": "toy/head", "options": {"iters": 5}})
        assert not r.is_error, text_of(r)
        assert r.structured_content == {"ref": "toy/head:v1", "mean_ms": "nan"}
        assert seen["profile"] == (None, {"iters": 5})
        candidate = repo.parent / "cand.py"
        candidate.write_text("import torch\nclass Fast(torch.nn.Linear):\n    pass\n")
        r = await client.call_tool("verify_candidate", {"ref": "toy/head", "candidate": f"{candidate}:Fast"})
        assert r.structured_content == {"ref": "toy/head:v1", "passed": True}
        assert seen["verify"] == f"{candidate}:Fast"

        def broken(self: Capture, candidate: Any) -> Any:
            raise ValueError("candidate class Fast not found")

        monkeypatch.setattr(Capture, "verify", broken, raising=False)
        r = await client.call_tool("verify_candidate", {"ref": "toy/head", "candidate": f"{candidate}:Fast"})
        assert r.is_error and "candidate class Fast not found" in text_of(r)

        monkeypatch.delattr(Capture, "profile")
        r = await client.call_tool("profile_capture", {"ref": "toy/gate"})
        assert r.is_error and "Profiling is not available" in text_of(r)


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
