"""``modulelens mcp``: a stdio MCP server exposing captures to coding agents.

Tools (results are structured JSON, the same data as the CLI's ``--json`` ``result``)::

    list_captures(prefix?)                                  versions in the repo
    show_capture(ref, stats?, max_parameters?)              metadata, shapes, tensor statistics
    replay_capture(ref, device?, dtype?, rtol?, atol?, ulps?)  replay report (a mismatch is a result, not an error)
    profile_capture(ref, device?, dtype?, call?, ...)       latency, memory, FLOPs, top operators
    verify_candidate(ref, candidate, ..., timeout_s?)       a rewrite checked in a child process
    verify_kernel(ref, candidate, ..., timeout_s?)          ``modulelens kernel verify``
    locate_divergence(ref, candidate?, call?, ...)          the first op where a rewrite or a replay differs
    diff_captures(a, b, device?, outputs?, rtol?, atol?)    what changed between two captures
    export_kernel_problem(ref, output_dir, ...)             a KernelBench/KernelAgent problem folder

Candidates never run inside the server: ``verify_candidate`` runs ``modulelens verify --json`` (and
``locate_divergence`` with a candidate ``modulelens diverge --json``) in a child process with a
timeout (a candidate calling ``os._exit`` or looping forever costs that call, not the server), and
``verify_kernel`` has its own worker processes. Every tool has typed arguments; user-caused
failures come back as MCP tool errors with one line naming the tool and what failed (the mapping is
:mod:`modulelens.interfaces._errors`); anything else is a bug and keeps the SDK's generic error.
The protocol owns stdout: the SDK points file descriptor 1 at stderr while serving, and this
module never prints.

Register with Claude Code: ``claude mcp add modulelens -- modulelens mcp --repo /path/to/repo``.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from modulelens.errors import CandidateError
from modulelens.errors import ToolError as ModulelensToolError
from modulelens.interfaces import session
from modulelens.interfaces._errors import KNOWN_ERRORS, error_message
from modulelens.interfaces.output import JSON_SCHEMA, jsonable

INSTRUCTIONS = """\
modulelens stores PyTorch submodules captured from real jobs: constructor arguments, weights and the
real inputs/outputs of recorded calls. Loop: list_captures -> show_capture -> replay_capture (must
pass before changes) -> edit the module or write a candidate file (a subclass of the captured class
overriding forward) -> verify_candidate until passed -> profile_capture. Custom kernels:
export_kernel_problem, then verify_kernel. References look like NAME, NAME:v3 or NAME:alias."""

RefArg = Annotated[str, Field(description="Capture reference: NAME, NAME:vN or NAME:alias (see list_captures).")]
DeviceArg = Annotated[str | None, Field(description="Device to run on, e.g. cpu, cuda, cuda:1 (default: cpu).")]
DtypeArg = Annotated[str | None, Field(description="Cast floating weights and inputs, e.g. bfloat16.")]
RtolArg = Annotated[float | None, Field(description="Relative tolerance (default: by dtype; bit-exact for replay).")]
AtolArg = Annotated[float | None, Field(description="Absolute tolerance (default: by dtype).")]
UlpsArg = Annotated[str | None, Field(description=(
    "Judge float outputs within this many ULPs instead of rtol/atol: \"4\", or per dtype \"bfloat16=2,float32=64\"."))]
OracleArg = Annotated[bool | None, Field(description=(
    "Judge float outputs by their error against a float64 run of the reference, within k times the reference's "
    "own (docs/tools.md, \"Verdicts in ULPs\"). Default: on for verify_kernel, and for verify_candidate when the "
    "outputs are float16/bfloat16/float8; off when rtol/atol/ulps are given."))]
CallsArg = Annotated[list[int] | None, Field(description="Recorded calls to use, by position (default: all).")]
StoreArg = Annotated[bool, Field(description="Keep the report with the capture's version in the repo.")]
TimeoutArg = Annotated[float, Field(gt=0, description="Seconds before the candidate's process is killed.")]

# Annotations say what a tool does to its environment: reading the repo is read-only; storing a
# report or writing a problem folder is not; running a candidate runs code the agent wrote.
_READS = ToolAnnotations(read_only_hint=True, open_world_hint=False)
_WRITES_REPORT = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                                 open_world_hint=False)
_RUNS_CANDIDATE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                                  open_world_hint=False)
_WRITES_FILES = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                                open_world_hint=False)

P = ParamSpec("P")
R = TypeVar("R")


def _result(value: object) -> dict[str, object]:
    """A tool's structured content: a JSON object."""
    data = jsonable(value)
    return data if isinstance(data, dict) else {"result": data}


def _one_line_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Known errors become MCP tool errors with one line saying what failed (the SDK puts
    ``Error executing tool <name>:`` in front)."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except KNOWN_ERRORS as error:
            raise ToolError(error_message(error)) from None

    return wrapper


def _check_candidate_path(candidate: str) -> None:
    path_part, sep, attribute = candidate.rpartition(":")
    if not sep or not attribute.isidentifier():
        path_part = candidate
    if path_part.endswith(".py") and not Path(path_part).expanduser().is_file():
        raise CandidateError(f"candidate file {path_part} does not exist (relative to {os.getcwd()})")


def verify_in_subprocess(repo: str | None, ref: str, candidate: str, *, device: str | None, dtype: str | None,
                         rtol: float | None, atol: float | None, timing: bool, store: bool,
                         timeout_s: float, ulps: str | None = None, oracle: bool | None = None) -> dict[str, object]:
    """``modulelens verify --json`` in a child process: the candidate's crash or hang stays there.

    Returns:
        The verification report (``VerifyReport.to_dict()``); ``passed`` false is a result.

    Raises:
        ToolError: the child timed out, died before reporting, or reported a known error.
    """
    verdicts = ([] if ulps is None else ["--ulps", ulps]) + ([] if oracle is None else
                                                            ["--oracle" if oracle else "--no-oracle"])
    return run_cli_json(["verify", ref, "--candidate", candidate, "--timing" if timing else "--no-timing", *verdicts],
                        repo, device=device, dtype=dtype, rtol=rtol, atol=atol, store=store, timeout_s=timeout_s)


def run_cli_json(arguments: list[str], repo: str | None, *, device: str | None, dtype: str | None, rtol: float | None,
                 atol: float | None, store: bool, timeout_s: float) -> dict[str, object]:
    """``modulelens ARGUMENTS --json`` in a child process (a candidate's crash or hang stays there).

    Returns:
        The command's ``result`` (docs/cli-json.md).

    Raises:
        ToolError: the child timed out, died before reporting, or reported a known error.
    """
    command = [sys.executable, "-m", "modulelens", *arguments, "--json", "--store" if store else "--no-store"]
    for flag, value in (("--repo", repo), ("--device", device), ("--dtype", dtype), ("--rtol", rtol),
                        ("--atol", atol)):
        if value is not None:
            command += [flag, str(value)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise ModulelensToolError(f"the candidate did not finish within {timeout_s:g} s (process killed)") from None
    start = done.stdout.rfind('{\n "schema": "' + JSON_SCHEMA + '"')
    if start < 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModulelensToolError(f"the candidate's process exited with code {done.returncode} "
                                  f"before reporting ({tail})")
    reply = json.loads(done.stdout[start:])
    if not reply["ok"]:
        raise ModulelensToolError(reply["error"]["message"])
    return reply["result"]


def build_server(repo: str | None = None) -> MCPServer:
    """An :class:`MCPServer` whose tools read captures from ``repo`` (default: ``$MODULELENS_REPO``).

    Example::

        build_server("/data/captures").run("stdio")
    """
    from modulelens import __version__

    server = MCPServer("modulelens", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING")
    _register_reading_tools(server, repo)
    _register_running_tools(server, repo)
    _register_kernel_tools(server, repo)
    return server


def _register_reading_tools(server: MCPServer, repo: str | None) -> None:
    @server.tool(annotations=_READS)
    @_one_line_errors
    def list_captures(
        prefix: Annotated[str | None, Field(description="Only names equal to or under this prefix.")] = None,
    ) -> dict[str, object]:
        """List stored captures (every version): ref, module class, aliases, size, creation time."""
        store = session.open_repo(repo, create=True)
        return _result({"repo": store.location, "captures": session.list_versions(store, prefix)})

    @server.tool(annotations=_READS)
    @_one_line_errors
    def show_capture(
        ref: RefArg,
        stats: Annotated[bool, Field(description="Compute min/max/mean/std/non-finite of recorded tensors.")] = True,
        max_parameters: Annotated[int, Field(ge=0, description="At most this many parameter rows.")] = 50,
    ) -> dict[str, object]:
        """Describe a capture: class, constructor arguments, parameters, and each recorded call's
        input/output tensors with shape, dtype, device and summary statistics."""
        from modulelens.interfaces.tensor_info import call_rows, state_rows
        from modulelens.restore.summary import describe

        capture = session.load_capture(ref, repo)
        result = describe(capture.repo, capture.ref)
        for summary, call in zip(result["calls"], capture.calls, strict=True):
            rows = call_rows(call, stats=stats)
            summary["inputs"], summary["outputs"] = rows["inputs"], rows["outputs"]
        total = len(result["parameters"]) + len(result["buffers"])
        result["tensors"] = state_rows(capture, 0, stats=stats, limit=max_parameters)
        result["tensors_truncated"] = total > max_parameters
        return _result(result)

    @server.tool(annotations=_READS)
    @_one_line_errors
    def replay_capture(ref: RefArg, device: DeviceArg = None, dtype: DtypeArg = None, rtol: RtolArg = None,
                       atol: AtolArg = None, ulps: UlpsArg = None) -> dict[str, object]:
        """Rebuild the module and run every recorded call, comparing with the recorded outputs (each
        float leaf's error in ULPs: ``max_ulps``). ``status``: PASS, FAIL on a mismatch (a result, not an
        error), or UNVERIFIED (never a pass) with ``unverified`` naming why nothing could be compared
        (outputs shape-only, None, empty or only NaN, no calls). ``passed`` is true only for PASS."""
        from modulelens.restore.compare import parse_ulps

        capture = session.load_capture(ref, repo, device=device, dtype=dtype)
        return _result(capture.replay(rtol=rtol, atol=atol, ulps=None if ulps is None else parse_ulps(ulps)))

    @server.tool(annotations=_READS)
    @_one_line_errors
    def diff_captures(
        a: Annotated[str, Field(description="The baseline capture: NAME, NAME:vN or NAME:alias.")],
        b: Annotated[str, Field(description="The capture compared with A.")],
        device: DeviceArg = None,
        outputs: Annotated[bool, Field(description="Replay B's module on A's inputs and compare outputs.")] = True,
        rtol: RtolArg = None,
        atol: AtolArg = None,
    ) -> dict[str, object]:
        """What differs between two captures: constructor arguments, weights, input statistics, outputs."""
        from modulelens.tools.diff import diff

        first = session.load_capture(a, repo, device=device)
        second = session.load_capture(b, repo, device=device)
        return _result(diff(first, second, device=device, outputs=outputs, rtol=rtol, atol=atol))


def _register_running_tools(server: MCPServer, repo: str | None) -> None:
    @server.tool(annotations=_WRITES_REPORT)
    @_one_line_errors
    def profile_capture(
        ref: RefArg,
        device: DeviceArg = None,
        dtype: DtypeArg = None,
        call: Annotated[int, Field(ge=0, description="Which recorded call to time (position).")] = 0,
        backward: Annotated[bool, Field(description="Time forward+backward instead of forward only.")] = False,
        iters: Annotated[int | None, Field(gt=0, description="Timed iterations (default: ~1 s worth).")] = None,
        warmup: Annotated[int, Field(ge=0, description="Untimed iterations first.")] = 5,
        batch_sizes: Annotated[list[int] | None, Field(description="Sweep the batch size on synthetic inputs.")] = None,
        store: StoreArg = False,
    ) -> dict[str, object]:
        """Latency (median/p10/p90), peak memory, FLOPs, bytes moved and top operators on a recorded call."""
        from modulelens.tools.profile import profile
        from modulelens.tools.timing import TimingConfig

        capture = session.load_capture(ref, repo, device=device, dtype=dtype)
        return _result(profile(capture, call=call, backward=backward, timing=TimingConfig(warmup=warmup, iters=iters),
                               batch_sizes=batch_sizes, store=store))

    @server.tool(annotations=_RUNS_CANDIDATE)
    @_one_line_errors
    def verify_candidate(
        ref: RefArg,
        candidate: Annotated[str, Field(description=(
            "The candidate implementation: /abs/path/to/file.py:ClassName (or file.py with one candidate) "
            "or package.module:ClassName."))],
        device: DeviceArg = None,
        dtype: DtypeArg = None,
        rtol: RtolArg = None,
        atol: AtolArg = None,
        ulps: UlpsArg = None,
        oracle: OracleArg = None,
        timing: Annotated[bool, Field(description="Time reference and candidate.")] = True,
        timeout_s: TimeoutArg = 300.0,
        store: StoreArg = False,
    ) -> dict[str, object]:
        """Run a candidate implementation on every recorded call, in a child process with a timeout,
        and compare with the recorded outputs (each float leaf's error in ULPs). ``passed`` false is a
        result: ``status`` FAIL with ``failures``, or UNVERIFIED with ``unverified`` (nothing recorded
        could be compared by value: shape-only or None outputs, only NaN, no calls; never a pass)."""
        _check_candidate_path(candidate)
        session.resolve(*session.open_ref(ref, repo))  # an unknown ref fails here, with suggestions
        return verify_in_subprocess(repo, ref, candidate, device=device, dtype=dtype, rtol=rtol, atol=atol,
                                    timing=timing, store=store, timeout_s=timeout_s, ulps=ulps, oracle=oracle)


    @server.tool(annotations=_RUNS_CANDIDATE)
    @_one_line_errors
    def locate_divergence(
        ref: RefArg,
        candidate: Annotated[str | None, Field(description=(
            "A rewrite to compare with the rebuilt module: /abs/path/to/file.py:ClassName or package.module:ClassName. "
            "Without one, a replay is compared with the op trace the recorded job left (capture with --op-trace)."))] = None,
        call: Annotated[int | None, Field(ge=0, description="One recorded call (position; default: all, the first "
                                                             "failing one located).")] = None,
        device: DeviceArg = None,
        dtype: DtypeArg = None,
        rtol: RtolArg = None,
        atol: AtolArg = None,
        timeout_s: TimeoutArg = 300.0,
        store: StoreArg = False,
    ) -> dict[str, object]:
        """Name the first op where a rewrite (or this machine's replay) parts from the reference: module path,
        op, source line, error in ULPs, and the last op that still agreed. ``passed`` false is a result; ``status``
        UNVERIFIED (never a pass): nothing could be compared (outputs shape-only, None, only NaN, no calls)."""
        if candidate is None:
            from modulelens.tools.diverge import find_divergence

            capture = session.load_capture(ref, repo, device=device, dtype=dtype)
            return _result(find_divergence(capture, None, call=call, rtol=rtol, atol=atol, store=store))
        _check_candidate_path(candidate)
        session.resolve(*session.open_ref(ref, repo))  # an unknown ref fails here, with suggestions
        arguments = ["diverge", ref, "--candidate", candidate, *(["--call", str(call)] if call is not None else [])]
        return run_cli_json(arguments, repo, device=device, dtype=dtype, rtol=rtol, atol=atol, store=store,
                            timeout_s=timeout_s)


def _register_kernel_tools(server: MCPServer, repo: str | None) -> None:
    @server.tool(annotations=_RUNS_CANDIDATE)
    @_one_line_errors
    def verify_kernel(
        ref: RefArg,
        candidate: Annotated[str, Field(description="A ModelNew/kernel_function .py file, or KernelAgent's result JSON.")],
        device: Annotated[str | None, Field(description="cuda or cpu (default: cuda when available).")] = None,
        calls: CallsArg = None,
        random_samples: Annotated[int, Field(ge=0, description="Seeded random inputs of the recorded shapes.")] = 5,
        seed: Annotated[int, Field(description="Seed of the random inputs.")] = 0,
        rtol: RtolArg = None,
        atol: AtolArg = None,
        ulps: UlpsArg = None,
        oracle: OracleArg = None,
        timeout_s: TimeoutArg = 300.0,
        store: StoreArg = False,
    ) -> dict[str, object]:
        """``modulelens kernel verify``: static checks, then the candidate kernel on the recorded calls and
        random inputs in worker processes with a timeout, judged in ULPs against a float64 oracle and
        probed for known exploits (``failed_checks`` names what failed); ``passed`` false is a result.
        ``status`` UNVERIFIED (never a pass): a recorded output had no values to compare (stored shape-only,
        only NaN); ``unverified`` says which."""
        from modulelens.kernels.options import CandidatePolicy, KernelChecks
        from modulelens.kernels.verify import verify_kernel as run_verify_kernel
        from modulelens.restore.compare import parse_ulps

        _check_candidate_path(candidate)
        checks = KernelChecks(calls=calls, random_samples=random_samples, seed=seed, rtol=rtol, atol=atol,
                              ulps=None if ulps is None else parse_ulps(ulps), oracle=oracle is not False)
        store_repo, ref = session.open_ref(ref, repo)
        name, version = session.resolve(store_repo, ref)
        return _result(run_verify_kernel(f"{name}:v{version}", candidate, repo=store_repo, device=device,
                                         checks=checks, policy=CandidatePolicy(timeout=timeout_s), store=store))

    @server.tool(annotations=_WRITES_FILES)
    @_one_line_errors
    def export_kernel_problem(
        ref: RefArg,
        output_dir: Annotated[str, Field(description="Directory to write the kernel problem into.")],
        calls: CallsArg = None,
        max_calls: Annotated[int, Field(gt=0, description="Use at most this many recorded calls.")] = 8,
        inline: Annotated[bool, Field(description="Inline the module's source (else import its class).")] = True,
        overwrite: Annotated[bool, Field(description="Replace the problem files of a non-empty folder.")] = False,
        check: Annotated[bool, Field(description="Exec problem.py as KernelBench does and compare.")] = True,
        rtol: RtolArg = None,
        atol: AtolArg = None,
    ) -> dict[str, object]:
        """Export the capture as a self-contained KernelBench/KernelAgent problem (reference module, inputs, checker)."""
        from modulelens.kernels.export import export_kernelbench

        capture = session.load_capture(ref, repo)
        return _result(export_kernelbench(capture, output_dir, calls=calls, max_calls=max_calls, inline=inline,
                                          overwrite=overwrite, check=check, rtol=rtol, atol=atol))


def serve(repo: str | None = None) -> None:
    """Run the server on stdin/stdout until the client closes the connection."""
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    warnings.simplefilter("default")  # warnings go to stderr, never to the protocol stream
    if repo is not None:
        repo = str(Path(repo).expanduser().absolute())
        os.environ["MODULELENS_REPO"] = repo
    build_server(repo).run("stdio")
