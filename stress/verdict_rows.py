"""Verdicts that cannot fail, and export's raw traceback (issue 35, items 4 and 8), two rows of
``python -m stress``:

* **vacuous verdicts**: ``verify`` of captures with nothing real to compare (an output stored
  shape-only, as large outputs are by design; a ``None`` output; an output that is NaN throughout;
  no recorded calls), each with the true implementation and with one that is wrong (zeros, a tensor
  where ``None`` was recorded), through the Python API (``verify`` and ``diverge``), ``assert_matches``, ``modulelens verify
  --json`` and its human output, and the MCP ``verify_candidate`` tool; and ``replay`` of the same
  captures (the API, ``modulelens replay --json`` and its human output, the MCP ``replay_capture``
  tool), which must say UNVERIFIED too. **wrong**: a PASS; a wrong
  candidate that is not a FAIL (zeros against a shape-only output contradict its recorded
  statistics); a true one that FAILS; an exit code of 0; a human output without ``cannot verify:``.
* **export of a module whose forward raises**: a capture whose recorded ``functools.partial``
  names a keyword its function does not take, exported in training mode (export runs the module to
  find its random ops) through the API, the CLI and the MCP tool. **wrong**: anything but a
  one-line modulelens error.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import modulelens
from modulelens.errors import MatchError, ModulelensError
from modulelens.testing import assert_matches
from stress.huge_captures import capture_of, rewrite
from stress.table import Row

# ------------------------------------------------------------------------------------------ modules
# Captures name their class by import path: these live here so that a fresh process finds them.


class NoneOut(nn.Module):
    """Does its work and returns ``None`` (a module whose job is a side effect)."""

    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x: torch.Tensor) -> None:
        self.lin(x)


class NanOut(nn.Module):
    """Returns NaN throughout (a diverged layer)."""

    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * float("nan")


class EmptyOut(nn.Module):
    """Returns a tensor with no elements (a batch filtered down to nothing)."""

    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)[:0]


class WritesInPlace(nn.Module):
    """Returns ``None`` and writes its result into the buffer it was given (a cache update)."""

    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(self.lin(x))


class ZerosLinear(nn.Linear):
    """A wrong rewrite of ``nn.Linear``: zeros of the right shape."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*x.shape[:-1], self.out_features)


class TensorNotNone(NoneOut):
    """A wrong rewrite of :class:`NoneOut`: returns a tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.lin(x)


class ZerosNan(NanOut):
    """A wrong rewrite of :class:`NanOut`: zeros where NaN was recorded."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(self.lin(x))


def scaled(x: torch.Tensor, factor: float = 1.0) -> torch.Tensor:
    return torch.tanh(x) * factor


class Activated(nn.Module):
    """A linear layer and an activation given as a ``functools.partial``."""

    def __init__(self, n: int = 4, act: Any = None) -> None:
        super().__init__()
        self.lin = nn.Linear(n, n)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.lin(x))


# ------------------------------------------------------------------------------------------ captures


def vacuous_captures(repo: modulelens.Repo) -> dict[str, str]:
    """``{"shape-only", "none", "nan", "no calls"}`` -> ref."""
    refs = {
        "shape-only": capture_of(repo, "vacuous/shape-only", lambda: nn.Linear(8, 512), torch.randn(2, 8),
                               payload=modulelens.PayloadPolicy(shape_only_over=1024)),
        "none": capture_of(repo, "vacuous/none", NoneOut, torch.randn(2, 4)),
        "nan": capture_of(repo, "vacuous/nan", NanOut, torch.randn(2, 4)),
        "no calls": capture_of(repo, "vacuous/no-calls", lambda: nn.Linear(4, 4), torch.randn(2, 4)),
    }
    rewrite(repo, refs["no calls"], lambda meta: meta.update(calls=[]))
    return refs


HERE = "stress.verdict_rows"
# (capture, candidate, verdict it must get): the true implementation cannot be verified, a wrong one fails
CASES = [("shape-only", "torch.nn:Linear", "UNVERIFIED"), ("shape-only", f"{HERE}:ZerosLinear", "FAIL"),
         ("none", f"{HERE}:NoneOut", "UNVERIFIED"), ("none", f"{HERE}:TensorNotNone", "FAIL"),
         ("nan", f"{HERE}:NanOut", "UNVERIFIED"), ("nan", f"{HERE}:ZerosNan", "FAIL"),
         ("no calls", "torch.nn:Linear", "UNVERIFIED")]


def _verdict(result: dict[str, Any]) -> str:
    return str(result.get("status") or ("PASS" if result.get("passed") else "FAIL"))


def _check(row: Row, label: str, got: str, want: str) -> None:
    row.record(None if got == want else f"{label}: {got}, not {want}")


def vacuous_verdict_row(tmp: Path, quick: bool = False) -> Row:
    """Verdicts on captures with nothing real to compare, through every way of asking for one."""
    from modulelens.tools.diverge import find_divergence
    from modulelens.tools.verify import verify

    row = Row("verify and replay on vacuous captures: shape-only, None, NaN outputs, no calls (issue 35.4)")
    start = time.perf_counter()
    repo = modulelens.Repo(tmp / "vacuous-repo")
    refs = vacuous_captures(repo)
    for capture_kind, candidate, want in CASES:
        capture = modulelens.load(refs[capture_kind], repo=repo)
        label = f"{capture_kind} / {candidate.rpartition(':')[2]}"
        try:
            report = verify(capture, candidate, timing=None, store=False)
            _check(row, f"API {label}", _verdict(report.to_dict()), want)
        except ModulelensError as error:
            _check(row, f"API {label}", f"{type(error).__name__}: {error}"[:120], want)
        try:  # diverge runs the candidate through verify: the same verdict, never a vacuous PASS
            _check(row, f"diverge {label}", _verdict(find_divergence(capture, candidate, store=False)), want)
        except ModulelensError as error:
            _check(row, f"diverge {label}", f"{type(error).__name__}: {error}"[:120], want)
        try:
            assert_matches(_candidate_class(candidate), capture)
            row.record(f"assert_matches {label}: passed")
        except MatchError:
            row.record(None)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                        os.environ.get("PYTHONPATH", "")])}
    cli_cases = [c for c in CASES if c[2] == "UNVERIFIED"] if quick else CASES
    for capture_kind, candidate, want in cli_cases:
        done = _cli(["verify", refs[capture_kind], "-c", candidate, "--json", "--no-timing", "--no-store",
                     "--repo", repo.location], env)
        label = f"CLI --json {capture_kind} / {candidate.rpartition(':')[2]}"
        try:
            envelope = json.loads(done.stdout)
            got = _verdict(envelope["result"]) if envelope["ok"] else f"error {envelope['error']['message'][:80]}"
        except (ValueError, KeyError):
            got = f"no JSON (exit {done.returncode}): {done.stdout[-80:]!r} {done.stderr[-120:]!r}"
        if done.returncode == 0 and got == want:
            got = f"{got} with exit code 0"
        _check(row, label, got, want)
    human = _cli(["verify", refs["shape-only"], "-c", "torch.nn:Linear", "--no-timing", "--no-store",
                  "--repo", repo.location], env)
    bad = human.returncode == 0 or "cannot verify:" not in human.stdout or human.stdout.strip() == "}"
    row.record(f"CLI human output (exit {human.returncode}): {human.stdout[-160:]!r}" if bad else None)
    _mcp(row, repo, refs, env, CASES[:2] if quick else CASES)
    _replays(row, repo, refs, env, quick)
    row.seconds = time.perf_counter() - start
    return row


def _replays(row: Row, repo: modulelens.Repo, refs: dict[str, str], env: dict[str, str], quick: bool) -> None:
    """``replay`` of the vacuous captures: UNVERIFIED (never PASS) through the API, the CLI and MCP."""
    import anyio

    for capture_kind, ref in refs.items():
        try:
            _check(row, f"replay API {capture_kind}", modulelens.load(ref, repo=repo).replay().status, "UNVERIFIED")
        except ModulelensError as error:
            _check(row, f"replay API {capture_kind}", f"{type(error).__name__}: {error}"[:120], "UNVERIFIED")
    for capture_kind in ["none"] if quick else list(refs):
        done = _cli(["replay", refs[capture_kind], "--json", "--repo", repo.location], env)
        try:
            envelope = json.loads(done.stdout)
            got = _verdict(envelope["result"]) if envelope["ok"] else f"error {envelope['error']['message'][:80]}"
        except (ValueError, KeyError):
            got = f"no JSON (exit {done.returncode}): {done.stdout[-80:]!r} {done.stderr[-120:]!r}"
        _check(row, f"replay CLI --json {capture_kind}", f"{got} with exit code 0" if done.returncode == 0 else got,
               "UNVERIFIED")
    human = _cli(["replay", refs["nan"], "--repo", repo.location], env)
    bad = human.returncode == 0 or "cannot verify:" not in human.stdout
    row.record(f"replay CLI human output (exit {human.returncode}): {human.stdout[-160:]!r}" if bad else None)

    async def replay_tool(ref: str) -> str:
        from mcp import Client

        from modulelens.interfaces.mcp_server import build_server

        async with Client(build_server(repo.location), raise_exceptions=True) as client:
            result = await client.call_tool("replay_capture", {"ref": ref})
        return _verdict(result.structured_content or {}) if not result.is_error else "a tool error"

    for capture_kind in ["shape-only"] if quick else list(refs):
        _check(row, f"replay MCP {capture_kind}", anyio.run(replay_tool, refs[capture_kind]), "UNVERIFIED")


def _candidate_class(spec: str) -> type[nn.Module]:
    module, _, name = spec.partition(":")
    return getattr(sys.modules.get(module) or __import__(module, fromlist=[name]), name)  # type: ignore[no-any-return]


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "modulelens", *args], capture_output=True, text=True, env=env,
                          timeout=600, stdin=subprocess.DEVNULL)


def _mcp(row: Row, repo: modulelens.Repo, refs: dict[str, str], env: dict[str, str],
         cases: list[tuple[str, str, str]]) -> None:
    """The MCP tool's way: ``verify_in_subprocess`` (what ``verify_candidate`` returns)."""
    from modulelens.interfaces.mcp_server import verify_in_subprocess

    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]
    try:
        for capture_kind, candidate, want in cases:
            label = f"MCP {capture_kind} / {candidate.rpartition(':')[2]}"
            try:
                result = verify_in_subprocess(repo.location, refs[capture_kind], candidate, device=None, dtype=None,
                                              rtol=None, atol=None, timing=False, store=False, timeout_s=600)
                _check(row, label, _verdict(result), want)
            except ModulelensError as error:
                _check(row, label, f"{type(error).__name__}: {error}"[:120], want)
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


# ------------------------------------------------------------------------------------------ export


def export_forward_row(tmp: Path) -> Row:
    """Export of a module whose own forward raises: a one-line refusal through the API, the CLI and MCP."""
    from modulelens.kernels.export import export_kernelbench
    from stress.hostile_export import ToolRefusedError, _export_mcp

    row = Row("export of a module whose own forward raises (issue 35.8)")
    start = time.perf_counter()
    repo = modulelens.Repo(tmp / "export-forward-repo")
    ref = capture_of(repo, "raising/partial", lambda: Activated(4, functools.partial(scaled, factor=2.0)), torch.randn(2, 4))

    def unknown_keyword(meta: dict[str, Any]) -> None:
        # the partial is a constructor argument and, kept on the module, one of its attributes
        attributes = [value for values in meta["module"].get("attributes", {}).values() for value in values.values()]
        for construction in meta["constructions"].values():
            for arg in [*construction["args"], *attributes]:
                if isinstance(arg, dict) and arg.get("codec") == "partial":
                    keywords = dict(arg["value"]["items"])["keywords"]
                    keywords["items"] = [["no_such_keyword", 2.0]]

    rewrite(repo, ref, unknown_keyword)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                        os.environ.get("PYTHONPATH", "")])}
    ways = {"API": lambda out: export_kernelbench(ref, out, repo=repo), "MCP": lambda out: _export_mcp(repo, ref, out)}
    for i, (how, export) in enumerate(ways.items()):
        try:
            export(tmp / f"export-forward-{i}")
            row.record(f"{how}: exported a module whose forward raises")
        except (ModulelensError, ToolRefusedError) as error:
            row.record(f"{how}: a refusal of several lines" if "\n" in str(error).strip() else None)
        except Exception as error:  # a raw traceback: the defect
            row.record(f"{how}: {type(error).__name__}: {str(error)[:120]}")
    done = _cli(["export", ref, "-o", str(tmp / "export-forward-cli"), "--repo", repo.location], env)
    lines = done.stderr.strip().splitlines()
    one_line = done.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: ")
    row.record(None if one_line else f"CLI: exit {done.returncode}, {len(lines)} lines: {done.stderr.strip()[-160:]!r}")
    row.seconds = time.perf_counter() - start
    return row
