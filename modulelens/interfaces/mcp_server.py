"""``modulelens mcp``: a stdio MCP server exposing captures to coding agents.

Tools (results are structured JSON, the same data as the CLI's ``--json`` ``result``)::

    list_captures(prefix?)                              versions in the repo
    show_capture(ref, stats?)                           metadata, shapes, tensor statistics
    replay_capture(ref, device?, dtype?, rtol?, atol?)  replay report (a mismatch is a result, not an error)
    profile_capture(ref, device?, options?)             modulelens.tools.profile
    verify_candidate(ref, candidate, device?)           modulelens.tools.verify
    export_kernel_problem(ref, output_dir, options?)    modulelens.kernels.export

User-caused failures (unknown capture, bad candidate path, a tool not installed) come back as MCP
tool errors with a one-line message. The protocol owns stdout: the SDK points file descriptor 1 at
stderr while serving, and this module never prints.

Register with Claude Code: ``claude mcp add modulelens -- modulelens mcp --repo /path/to/repo``.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import warnings
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from modulelens.errors import ModulelensError

INSTRUCTIONS = """\
modulelens stores PyTorch submodules captured from real jobs: constructor arguments, weights and the
real inputs/outputs of recorded calls. Loop: list_captures -> show_capture -> replay_capture (must
pass before changes) -> edit the module or write a candidate file (a subclass of the captured class
overriding forward) -> verify_candidate until passed -> profile_capture. References look like
NAME, NAME:v3 or NAME:alias."""

RefArg = Annotated[str, Field(description="Capture reference: NAME, NAME:vN or NAME:alias (see list_captures).")]
DeviceArg = Annotated[str | None, Field(description="Device to run on, e.g. cpu, cuda, cuda:1 (default: cpu).")]
OptionsArg = Annotated[dict[str, Any] | None, Field(description="Extra keyword options passed to the tool.")]

_READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
_RUNS_CODE = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)


def _jsonable(value: Any) -> Any:
    """Plain JSON data (``to_dict()`` objects, paths and non-finite floats become JSON values)."""
    def default(obj: Any) -> Any:
        if hasattr(obj, "to_dict"):
            return obj.to_dict()
        return str(obj)

    def clean(obj: Any) -> Any:
        if isinstance(obj, float) and not math.isfinite(obj):
            return str(obj)
        if isinstance(obj, dict):
            return {str(k): clean(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [clean(v) for v in obj]
        return obj

    return clean(json.loads(json.dumps(value, default=default)))


def _tool_result(value: Any) -> dict[str, Any]:
    data = value.to_dict() if hasattr(value, "to_dict") else value
    if isinstance(data, (str, os.PathLike)):
        data = {"path": os.fspath(data)}
    data = _jsonable(data)
    return data if isinstance(data, dict) else {"result": data}


def _missing_tool(what: str, module: str, detail: str) -> ToolError:
    return ToolError(f"{what} is not available in this modulelens installation ({detail}); "
                     f"it comes with modulelens.tools.{module}")


def build_server(repo: str | None = None) -> MCPServer:
    """An :class:`MCPServer` whose tools read captures from ``repo`` (default: ``$MODULELENS_REPO``)."""
    from modulelens import __version__

    server = MCPServer("modulelens", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING")

    def open_repo(create: bool = False) -> Any:
        from modulelens.repo.local import Repo

        try:
            return Repo(repo, create=create)
        except ModulelensError as error:
            raise ToolError(str(error)) from None

    def load(ref: str, device: str | None = None, dtype: str | None = None) -> Any:
        from modulelens.format.tensors import dtype_from_name
        from modulelens.restore.loader import load as load_capture

        try:
            return load_capture(ref, repo=open_repo(), device=device, dtype=dtype_from_name(dtype) if dtype else None)
        except (ModulelensError, ValueError, RuntimeError) as error:
            raise ToolError(str(error)) from None

    @server.tool(annotations=_READ_ONLY)
    def list_captures(
        prefix: Annotated[str | None, Field(description="Only names equal to or under this prefix.")] = None,
    ) -> dict[str, Any]:
        """List stored captures (every version): ref, module class, aliases, size, creation time."""
        store = open_repo(create=True)
        names = [n for n in store.names() if prefix is None or n == prefix or n.startswith(prefix.rstrip("/") + "/")]
        return _tool_result({"repo": str(store.root), "captures": [i.to_dict() for n in names for i in store.list(n)]})

    @server.tool(annotations=_READ_ONLY)
    def show_capture(
        ref: RefArg,
        stats: Annotated[bool, Field(description="Compute min/max/mean/std/nan/inf of recorded tensors.")] = True,
        max_parameters: Annotated[int, Field(ge=0, description="At most this many parameter rows.")] = 50,
    ) -> dict[str, Any]:
        """Describe a capture: class, constructor arguments, parameters, and each recorded call's
        input/output tensors with shape, dtype, device and summary statistics."""
        from modulelens.interfaces.tensor_info import call_rows, state_rows
        from modulelens.restore.summary import describe

        capture = load(ref)
        try:
            result = describe(capture.repo, capture.ref)
        except ModulelensError as error:
            raise ToolError(str(error)) from None
        for summary, call in zip(result["calls"], capture.calls, strict=True):
            rows = call_rows(call, stats=stats)
            summary["inputs"], summary["outputs"] = rows["inputs"], rows["outputs"]
        total = len(result["parameters"]) + len(result["buffers"])
        result["tensors"] = state_rows(capture, 0, stats=stats, limit=max_parameters)
        result["tensors_truncated"] = total > max_parameters
        return _tool_result(result)

    @server.tool(annotations=_RUNS_CODE)
    def replay_capture(
        ref: RefArg,
        device: DeviceArg = None,
        dtype: Annotated[str | None, Field(description="Cast floating weights and inputs, e.g. bfloat16.")] = None,
        rtol: Annotated[float | None, Field(description="Relative tolerance (default: bit-exact).")] = None,
        atol: Annotated[float | None, Field(description="Absolute tolerance.")] = None,
    ) -> dict[str, Any]:
        """Rebuild the module and run every recorded call, comparing with the recorded outputs.
        ``passed`` is false on a mismatch (that is a result, not an error)."""
        capture = load(ref, device, dtype)
        try:
            return _tool_result(capture.replay(rtol=rtol, atol=atol))
        except ModulelensError as error:
            raise ToolError(str(error)) from None

    @server.tool(annotations=_RUNS_CODE)
    def profile_capture(ref: RefArg, device: DeviceArg = None, options: OptionsArg = None) -> dict[str, Any]:
        """Time the module on its recorded inputs (options go to Capture.profile)."""
        capture = load(ref, device)
        return _tool_result(_call(capture, "profile", "Profiling", (), options or {}))

    @server.tool(annotations=_RUNS_CODE)
    def verify_candidate(
        ref: RefArg,
        candidate: Annotated[str, Field(description=(
            "The candidate implementation: /abs/path/to/file.py:ClassName (or file.py with one candidate) "
            "or package.module:ClassName."))],
        device: DeviceArg = None,
    ) -> dict[str, Any]:
        """Run a candidate implementation on the recorded inputs and compare with the recorded outputs."""
        path_part, sep, attribute = candidate.rpartition(":")
        if not sep or not attribute.isidentifier():
            path_part = candidate
        if path_part.endswith(".py") and not Path(path_part).expanduser().is_file():
            raise ToolError(f"candidate file {path_part} does not exist (relative to {os.getcwd()})")
        capture = load(ref, device)
        return _tool_result(_call(capture, "verify", "Verification", (candidate,), {}))

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False))
    def export_kernel_problem(
        ref: RefArg,
        output_dir: Annotated[str, Field(description="Directory to write the kernel problem into.")],
        options: OptionsArg = None,
    ) -> dict[str, Any]:
        """Export the capture as a self-contained kernel problem (reference module, inputs, checker)."""
        try:
            export_kernelbench = importlib.import_module("modulelens.kernels.export")
        except ModuleNotFoundError as error:
            if not (error.name or "").startswith("modulelens"):
                raise ToolError(f"kernel export needs a package that is missing: {error}") from None
            raise _missing_tool("Kernel export", "export_kernelbench", f"no module {error.name}") from None
        except ImportError as error:
            raise ToolError(f"kernel export cannot be imported: {error}") from None
        export = getattr(export_kernelbench, "export_kernelbench", None) or getattr(export_kernelbench, "export", None)
        if export is None:
            raise _missing_tool("Kernel export", "export_kernelbench", "it has no export function")
        capture = load(ref)
        try:
            return _tool_result(export(capture, output_dir, **(options or {})))
        except (ModulelensError, TypeError, ValueError, OSError) as error:
            raise ToolError(f"export failed: {error}") from None

    return server


def _call(capture: Any, method: str, what: str, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
    func = getattr(capture, method, None)
    if func is None:
        raise _missing_tool(what, method, f"Capture.{method} is missing")
    try:
        return func(*args, **options)
    except ModuleNotFoundError as error:
        if (error.name or "").startswith("modulelens"):
            raise _missing_tool(what, method, f"no module {error.name}") from None
        raise ToolError(f"{method} failed: {error}") from None
    except (ModulelensError, TypeError, ValueError, OSError, ImportError, AttributeError) as error:
        raise ToolError(f"{method} failed: {error}") from None


def serve(repo: str | None = None) -> None:
    """Run the server on stdin/stdout until the client closes the connection."""
    import logging
    import sys

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    warnings.simplefilter("default")  # warnings go to stderr, never to the protocol stream
    if repo is not None:
        os.environ["MODULELENS_REPO"] = str(Path(repo).expanduser().absolute())
    server = build_server(repo)
    server.run("stdio")
