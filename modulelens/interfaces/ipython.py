"""IPython / Jupyter extension: ``%load_ext modulelens`` registers the ``%ml_*`` magics.

Magics::

    %ml_ls [PREFIX] [--repo DIR]                       list captures
    %ml_load NAME[:ver] [as VAR] [--repo DIR] [--device D] [--dtype T] [--call N]
                                                       bind the capture, its module and call inputs
    %ml_replay NAME|VAR [--device D] [--dtype T] [--rtol R] [--atol A] [--repo DIR]
    %ml_profile NAME|VAR [--call N] [--backward] [--iters N] [--batch-sizes 1,8,64] [--repo DIR] [--device D]
    %ml_verify NAME|VAR --candidate SPEC|VAR [--rtol R] [--atol A] [--repo DIR] [--device D]
    %ml_diff A B [--no-outputs] [--repo DIR] [--device D]
    %ml_export NAME|VAR --output DIR [--calls 0,2] [--force] [--repo DIR]

``NAME`` is a capture reference in the repo; a bare variable name that holds a loaded
:class:`~modulelens.Capture` (e.g. ``capture`` after ``%ml_load``) is used as is, so edits made to
``capture.module`` in the notebook are what gets replayed. Results show a compact summary (verdict
first, failures visible without scrolling; batch-sweep plots inline). Errors appear as one
``UsageError`` line, never a traceback (the mapping is :mod:`modulelens.interfaces._errors`).
"""

from __future__ import annotations

import contextlib
import keyword
import shlex
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from modulelens.errors import ModulelensError
from modulelens.interfaces import session
from modulelens.interfaces._errors import KNOWN_ERRORS, error_message
from modulelens.interfaces.output import safe_text

if TYPE_CHECKING:
    from modulelens.kernels.export import ExportResult
    from modulelens.restore.loader import Capture
    from modulelens.restore.replay import ReplayReport

MAGICS = ("ml_ls", "ml_load", "ml_replay", "ml_profile", "ml_verify", "ml_diff", "ml_export")


class _Report(Protocol):
    """What a tool report offers the notebook: its JSON form (its text is ``str(report)``)."""

    def to_dict(self) -> dict[str, object]: ...


class ResultView:
    """A tool report shown as a compact HTML summary in Jupyter and as the report's text in a terminal."""

    def __init__(self, report: _Report, render: Callable[[dict[str, object]], str]) -> None:
        self.report = report
        self._render = render

    @property
    def passed(self) -> bool | None:
        passed = getattr(self.report, "passed", None)
        return passed if isinstance(passed, bool) else None

    def __repr__(self) -> str:
        return str(self.report)

    def _repr_html_(self) -> str:
        return self._render(self.report.to_dict())


class CaptureList:
    """The ``%ml_ls`` result: a table in Jupyter, one line per version in a terminal."""

    def __init__(self, rows: list[dict[str, Any]], root: str) -> None:
        self.rows = rows
        self.root = root

    def __repr__(self) -> str:
        if not self.rows:
            return f"no captures in {self.root}"
        return "\n".join(f"{r['ref']:<40} {r['module_class'].rsplit(':', 1)[-1]:<24} "
                         f"{','.join(r['aliases'])}" for r in self.rows)

    def _repr_html_(self) -> str:
        from modulelens.interfaces.html import captures_html

        return captures_html(self.rows, self.root)


@contextlib.contextmanager
def _one_line() -> Iterator[None]:
    """Known errors become IPython's one-line ``UsageError``; anything else keeps its traceback."""
    try:
        yield
    except KNOWN_ERRORS as error:
        raise UsageError(safe_text(error_message(error))) from None


def _split_as(line: str) -> tuple[str, str | None]:
    """``"demo/mlp:v2 as m --repo x"`` -> (``"demo/mlp:v2 --repo x"``, ``"m"``)."""
    tokens = shlex.split(line)
    var = None
    if "as" in tokens:
        at = tokens.index("as")
        if at + 1 >= len(tokens):
            raise UsageError("%ml_load NAME as VAR: VAR is missing")
        var = tokens[at + 1]
        if not var.isidentifier() or keyword.iskeyword(var):
            raise UsageError(f"%ml_load: {var!r} is not a valid Python name")
        del tokens[at:at + 2]
    return shlex.join(tokens), var


def _int_list(text: str | None, option: str) -> list[int] | None:
    with _one_line():
        return session.parse_int_list(text, option, positive=option == "--batch-sizes")


@magics_class
class ModulelensMagics(Magics):
    """The ``%ml_*`` line magics (see the module docstring)."""

    @property
    def _shell(self) -> InteractiveShell:
        """The shell the magics were registered with (``Magics.shell`` is optional only before that)."""
        if self.shell is None:
            raise RuntimeError("the %ml_* magics are used before being registered with a shell")
        return self.shell

    def _capture(self, ref: str, repo: str | None = None, device: str | None = None, dtype: str | None = None) -> Capture:
        """The capture a variable holds (used as is, edits included), else ``ref`` loaded from the repo."""
        from modulelens.restore.loader import Capture

        value = self._shell.user_ns.get(ref) if ref.isidentifier() else None
        if isinstance(value, Capture) and repo is None and device is None and dtype is None:
            return value
        with _one_line():
            return session.load_capture(ref, repo, device=device, dtype=dtype)

    @magic_arguments()
    @argument("prefix", nargs="?", default=None, help="Only names equal to or under this prefix.")
    @argument("--repo", default=None, help="Repo directory (default: $MODULELENS_REPO or the user repo).")
    @line_magic
    def ml_ls(self, line: str) -> CaptureList:
        """List captures in the repo."""
        args = parse_argstring(self.ml_ls, line)
        with _one_line():
            store = session.open_repo(args.repo, create=True)
            rows = [info.to_dict() for info in session.list_versions(store, args.prefix)]
        return CaptureList(rows, store.location)

    @magic_arguments()
    @argument("ref", help="NAME[:vN|:alias]; add 'as VAR' to choose the variable names.")
    @argument("--repo", default=None, help="Repo directory.")
    @argument("--device", default=None, help="Move the module and inputs to this device.")
    @argument("--dtype", default=None, help="Cast floating weights and inputs.")
    @argument("--call", type=int, default=0, help="Which recorded call's inputs to bind (default 0).")
    @line_magic
    def ml_load(self, line: str) -> None:
        """Load a capture and bind it, its module and one call's inputs in the namespace.

        Without ``as VAR`` the names are ``capture``, ``module``, ``args``, ``kwargs``; with
        ``as m`` they are ``m``, ``m_module``, ``m_args``, ``m_kwargs``."""
        from modulelens.interfaces.tensor_info import describe_value

        rest, var = _split_as(line)
        args = parse_argstring(self.ml_load, rest)
        capture = self._capture(args.ref, args.repo, args.device, args.dtype)
        names = ({"capture": "capture", "module": "module", "args": "args", "kwargs": "kwargs"} if var is None else
                 {"capture": var, "module": f"{var}_module", "args": f"{var}_args", "kwargs": f"{var}_kwargs"})
        bound: dict[str, Any] = {names["capture"]: capture}
        problems = []
        try:
            bound[names["module"]] = capture.module
        except ModulelensError as error:
            problems.append(f"module not rebuilt: {error}")
        if capture.calls:
            if not 0 <= args.call < len(capture.calls):
                raise UsageError(f"{capture.ref} has {len(capture.calls)} call(s); --call {args.call} is out of range")
            try:
                call_args, call_kwargs = capture.calls[args.call].fresh_inputs(capture.device, capture.dtype)
            except ModulelensError:  # an unrecorded input: bind the recorded values, placeholders included
                call_args, call_kwargs = capture.calls[args.call].inputs
            bound[names["args"]] = call_args
            bound[names["kwargs"]] = call_kwargs
        else:
            problems.append("no recorded calls, so no inputs to bind")
        self._shell.push(bound)
        print(safe_text(f"loaded {capture.ref} ({capture.module_class}); bound:"))  # escapes a capture's controls
        for key, value in bound.items():
            print(safe_text(f"  {key:<16} {describe_value(value) if key != names['capture'] else repr(value)}"))
        if names["args"] in bound:
            print(f"try: {names['module']}(*{names['args']}, **{names['kwargs']})   or   %ml_replay {names['capture']}")
        for problem in problems:
            print(safe_text(f"note: {problem}"))

    @magic_arguments()
    @argument("ref", help="NAME[:vN|:alias] or a variable holding a loaded capture.")
    @argument("--repo", default=None, help="Repo directory.")
    @argument("--device", default=None, help="Run on this device.")
    @argument("--dtype", default=None, help="Cast floating weights and inputs.")
    @argument("--rtol", type=float, default=None, help="Relative tolerance (default: bit-exact if nothing changed).")
    @argument("--atol", type=float, default=None, help="Absolute tolerance.")
    @argument("--current-weights", action="store_true",
              help="Run the module with its current weights (your edits) instead of each call's recorded ones.")
    @argument("--calls", default=None, help="Recorded calls to replay, by position: 0,2 (default: all).")
    @line_magic
    def ml_replay(self, line: str) -> ReplayReport:
        """Replay every recorded call and compare with the recorded outputs (a ReplayReport)."""
        args = parse_argstring(self.ml_replay, line)
        capture = self._capture(args.ref, args.repo, args.device, args.dtype)
        calls = _int_list(args.calls, "--calls")
        with _one_line():
            return capture.replay(rtol=args.rtol, atol=args.atol, calls=calls,
                                  weights="current" if args.current_weights else "recorded")

    @magic_arguments()
    @argument("ref", help="NAME[:vN|:alias] or a variable holding a loaded capture.")
    @argument("--call", type=int, default=0, help="Which recorded call to time (position in the capture).")
    @argument("--backward", action="store_true", help="Time forward+backward.")
    @argument("--iters", type=int, default=None, help="Timed iterations (default: about one second's worth).")
    @argument("--warmup", type=int, default=5, help="Untimed iterations first.")
    @argument("--batch-sizes", default=None, help="Sweep the batch dimension on synthetic inputs: 1,8,64 (plot inline).")
    @argument("--store", action="store_true", help="Keep the report with the capture's version.")
    @argument("--repo", default=None, help="Repo directory.")
    @argument("--device", default=None, help="Profile on this device.")
    @argument("--dtype", default=None, help="Cast floating weights and inputs.")
    @line_magic
    def ml_profile(self, line: str) -> ResultView:
        """Latency, memory, FLOPs and top operators of the module on a recorded call."""
        from modulelens.interfaces.html import profile_html
        from modulelens.tools.profile import profile
        from modulelens.tools.timing import TimingConfig

        args = parse_argstring(self.ml_profile, line)
        capture = self._capture(args.ref, args.repo, args.device, args.dtype)
        sizes = _int_list(args.batch_sizes, "--batch-sizes")
        with tempfile.TemporaryDirectory(prefix="modulelens-plot-") as folder, _one_line():
            plot = Path(folder) / "sweep.png" if sizes else None
            report = profile(capture, call=args.call, backward=args.backward,
                             timing=TimingConfig(warmup=args.warmup, iters=args.iters),
                             batch_sizes=sizes, plot=plot, store=args.store)
            png = plot.read_bytes() if plot is not None and plot.exists() else None
        report.plot = None  # the temporary file is gone; the PNG is embedded in the HTML
        return ResultView(report, lambda d: profile_html(d, png))

    @magic_arguments()
    @argument("ref", help="NAME[:vN|:alias] or a variable holding a loaded capture.")
    @argument("--candidate", required=True,
              help="file.py[:Class], package.module:Class, or a variable holding a class or module.")
    @argument("--rtol", type=float, default=None, help="Relative tolerance (default: per dtype).")
    @argument("--atol", type=float, default=None, help="Absolute tolerance (default: per dtype).")
    @argument("--no-timing", action="store_true", help="Do not time reference and candidate.")
    @argument("--store", action="store_true", help="Keep the report with the capture's version.")
    @argument("--repo", default=None, help="Repo directory.")
    @argument("--device", default=None, help="Verify on this device.")
    @argument("--dtype", default=None, help="Cast floating weights and inputs.")
    @line_magic
    def ml_verify(self, line: str) -> ResultView:
        """Check a candidate implementation against every recorded call: verdict first, then failures."""
        from modulelens.interfaces.html import verify_html
        from modulelens.tools.timing import TimingConfig
        from modulelens.tools.verify import verify

        args = parse_argstring(self.ml_verify, line)
        capture = self._capture(args.ref, args.repo, args.device, args.dtype)
        candidate: Any = args.candidate
        if candidate.isidentifier() and candidate in self._shell.user_ns:
            candidate = self._shell.user_ns[candidate]
        with _one_line():
            report = verify(capture, candidate, rtol=args.rtol, atol=args.atol,
                            timing=None if args.no_timing else TimingConfig(warmup=3, iters=20),
                            store=args.store)
        return ResultView(report, verify_html)

    @magic_arguments()
    @argument("a", help="The baseline: NAME[:vN|:alias] or a variable holding a loaded capture.")
    @argument("b", help="Compared with A: NAME[:vN|:alias] or a variable.")
    @argument("--no-outputs", action="store_true", help="Do not replay B's module on A's inputs.")
    @argument("--rtol", type=float, default=None, help="Relative tolerance for outputs.")
    @argument("--atol", type=float, default=None, help="Absolute tolerance for outputs.")
    @argument("--repo", default=None, help="Repo directory.")
    @argument("--device", default=None, help="Run on this device.")
    @line_magic
    def ml_diff(self, line: str) -> ResultView:
        """What differs between two captures: constructor, weights, input statistics, outputs."""
        from modulelens.interfaces.html import diff_html
        from modulelens.tools.diff import diff

        args = parse_argstring(self.ml_diff, line)
        a = self._capture(args.a, args.repo, args.device)
        b = self._capture(args.b, args.repo, args.device)
        with _one_line():
            report = diff(a, b, device=args.device, outputs=not args.no_outputs, rtol=args.rtol, atol=args.atol)
        return ResultView(report, diff_html)

    @magic_arguments()
    @argument("ref", help="NAME[:vN|:alias] or a variable holding a loaded capture.")
    @argument("--output", "-o", required=True, help="Problem folder to write.")
    @argument("--calls", default=None, help="Recorded calls to use, by position: 0,2 (default: all).")
    @argument("--force", action="store_true", help="Replace the problem files of a non-empty folder.")
    @argument("--no-check", action="store_true", help="Do not exec problem.py to compare with the recorded outputs.")
    @argument("--repo", default=None, help="Repo directory.")
    @line_magic
    def ml_export(self, line: str) -> ResultView:
        """Write a KernelBench/KernelAgent problem folder for the capture."""
        from modulelens.interfaces.html import export_html
        from modulelens.kernels.export import export_kernelbench

        args = parse_argstring(self.ml_export, line)
        capture = self._capture(args.ref, args.repo)
        with _one_line():
            result = export_kernelbench(capture, args.output, calls=_int_list(args.calls, "--calls"),
                                        overwrite=args.force, check=not args.no_check)
        return ResultView(_ExportView(result), export_html)


class _ExportView:
    """An export result with the text form the other reports have."""

    def __init__(self, result: ExportResult) -> None:
        self.result = result

    def to_dict(self) -> dict[str, object]:
        return self.result.to_dict()

    def __str__(self) -> str:
        m = self.result.manifest
        compatible = "KernelBench compatible" if m["kernelbench_compatible"] else "not KernelBench compatible"
        return f"exported {m['capture']['ref']} to {self.result.directory} ({compatible})"


def load_ipython_extension(ipython: Any) -> None:
    """Called by ``%load_ext modulelens``: the magics, and HTML for captures, calls and reports."""
    from modulelens.interfaces.html import register_formatters

    ipython.register_magics(ModulelensMagics)
    register_formatters(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """Called by ``%unload_ext modulelens``: remove the magics."""
    for name in MAGICS:
        ipython.magics_manager.magics["line"].pop(name, None)
