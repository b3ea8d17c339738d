"""IPython / Jupyter extension: ``%load_ext modulelens`` registers the ``%ml_*`` magics.

Magics::

    %ml_ls [PREFIX] [--repo DIR]                       list captures
    %ml_load NAME[:ver] [as VAR] [--repo DIR] [--device D] [--dtype T] [--call N]
                                                       bind the capture, its module and call inputs
    %ml_replay NAME|VAR [--device D] [--dtype T] [--rtol R] [--atol A] [--repo DIR]
    %ml_profile NAME|VAR [key=value ...] [--repo DIR] [--device D]
    %ml_verify NAME|VAR --candidate SPEC|VAR [--repo DIR] [--device D]

``NAME`` is a capture reference in the repo; a bare variable name that holds a loaded
:class:`~modulelens.Capture` (e.g. ``capture`` after ``%ml_load``) is used as is, so edits made to
``capture.module`` in the notebook are what gets replayed. Errors appear as one ``UsageError``
line, never a traceback.
"""

from __future__ import annotations

import ast
import keyword
import shlex
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from modulelens.errors import ModulelensError
from modulelens.interfaces.tensor_info import describe_value

NOT_AVAILABLE = ("{what} is not available in this modulelens installation ({detail}); "
                 "it comes with modulelens.tools.{module}")


class ResultView:
    """A tool result shown as HTML in Jupyter and as JSON-ish text in a terminal."""

    def __init__(self, title: str, data: Any, passed: bool | None = None, source: Any = None) -> None:
        self.title = title
        self.data = data
        self.passed = passed
        self.source = source

    def __repr__(self) -> str:
        import json

        verdict = "" if self.passed is None else (" PASS" if self.passed else " FAIL")
        return f"{self.title}{verdict}\n" + json.dumps(self.data, indent=1, default=str)

    def _repr_html_(self) -> str:
        from modulelens.interfaces.html import result_html

        return result_html(self.title, self.data, self.passed)


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


def _parse_options(tokens: list[str]) -> dict[str, Any]:
    """``["iters=50", "device='cuda'"]`` -> ``{"iters": 50, "device": "cuda"}`` (literals, else strings)."""
    options: dict[str, Any] = {}
    for token in tokens:
        key, sep, text = token.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"expected key=value, got {token!r}")
        try:
            options[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            options[key] = text
    return options


@magics_class
class ModulelensMagics(Magics):
    """The ``%ml_*`` line magics (see the module docstring)."""

    # ------------------------------------------------------------------------------ helpers

    def _capture(self, ref: str, repo: str | None = None, device: str | None = None, dtype: str | None = None) -> Any:
        from modulelens.restore.loader import Capture, load

        value = self.shell.user_ns.get(ref) if ref.isidentifier() else None
        if isinstance(value, Capture) and repo is None and device is None and dtype is None:
            return value
        from modulelens.format.tensors import dtype_from_name
        from modulelens.repo.local import Repo

        try:
            return load(ref, repo=Repo(repo, create=False), device=device,
                        dtype=dtype_from_name(dtype) if dtype else None)
        except (ModulelensError, ValueError) as error:
            raise UsageError(str(error)) from None

    # ------------------------------------------------------------------------------ magics

    @magic_arguments()
    @argument("prefix", nargs="?", default=None, help="Only names equal to or under this prefix.")
    @argument("--repo", default=None, help="Repo directory (default: $MODULELENS_REPO or the user repo).")
    @line_magic
    def ml_ls(self, line: str) -> CaptureList:
        """List captures in the repo."""
        args = parse_argstring(self.ml_ls, line)
        from modulelens.repo.local import Repo

        try:
            store = Repo(args.repo, create=True)
            prefix = args.prefix
            names = [n for n in store.names()
                     if prefix is None or n == prefix or n.startswith(prefix.rstrip("/") + "/")]
            rows = [info.to_dict() for n in names for info in store.list(n)]
        except ModulelensError as error:
            raise UsageError(str(error)) from None
        return CaptureList(rows, str(store.root))

    @magic_arguments()
    @argument("ref", help="NAME[:vN|:alias]; add 'as VAR' to choose the variable names.")
    @argument("--repo", default=None, help="Repo directory.")
    @argument("--device", default=None, help="Move the module and inputs to this device.")
    @argument("--dtype", default=None, help="Cast floating weights and inputs.")
    @argument("--call", type=int, default=0, help="Which recorded call's inputs to bind (default 0).")
    @line_magic
    def ml_load(self, line: str) -> Any:
        """Load a capture and bind it, its module and one call's inputs in the namespace.

        Without ``as VAR`` the names are ``capture``, ``module``, ``args``, ``kwargs``; with
        ``as m`` they are ``m``, ``m_module``, ``m_args``, ``m_kwargs``."""
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
        self.shell.push(bound)
        print(f"loaded {capture.ref} ({capture.module_class}); bound:")
        for key, value in bound.items():
            print(f"  {key:<16} {describe_value(value) if key != names['capture'] else repr(value)}")
        if names["args"] in bound:
            print(f"try: {names['module']}(*{names['args']}, **{names['kwargs']})   or   %ml_replay {names['capture']}")
        for problem in problems:
            print(f"note: {problem}")
        return None

    @magic_arguments()
    @argument("ref", help="NAME[:vN|:alias] or a variable holding a loaded capture.")
    @argument("--repo", default=None, help="Repo directory.")
    @argument("--device", default=None, help="Run on this device.")
    @argument("--dtype", default=None, help="Cast floating weights and inputs.")
    @argument("--rtol", type=float, default=None, help="Relative tolerance (default: bit-exact if nothing changed).")
    @argument("--atol", type=float, default=None, help="Absolute tolerance.")
    @argument("--current-weights", action="store_true",
              help="Run the module with its current weights (your edits) instead of each call's recorded ones.")
    @line_magic
    def ml_replay(self, line: str) -> Any:
        """Replay every recorded call and compare with the recorded outputs (a ReplayReport)."""
        args = parse_argstring(self.ml_replay, line)
        capture = self._capture(args.ref, args.repo, args.device, args.dtype)
        try:
            return capture.replay(rtol=args.rtol, atol=args.atol,
                                  weights="current" if args.current_weights else "recorded")
        except ModulelensError as error:
            raise UsageError(str(error)) from None

    @magic_arguments()
    @argument("ref", help="NAME[:vN|:alias] or a variable holding a loaded capture.")
    @argument("options", nargs="*", help="Profiler options as key=value (values are Python literals).")
    @argument("--repo", default=None, help="Repo directory.")
    @argument("--device", default=None, help="Profile on this device.")
    @argument("--dtype", default=None, help="Cast floating weights and inputs.")
    @line_magic
    def ml_profile(self, line: str) -> Any:
        """Profile the module on its recorded inputs (``capture.profile(**options)``)."""
        args = parse_argstring(self.ml_profile, line)
        options = _parse_options(args.options)
        capture = self._capture(args.ref, args.repo, args.device, args.dtype)
        result = _call_tool(capture, "profile", "profiling", (), options)
        return _as_view(f"profile of {capture.ref}", result)

    @magic_arguments()
    @argument("ref", help="NAME[:vN|:alias] or a variable holding a loaded capture.")
    @argument("--candidate", required=True,
              help="file.py[:Class], package.module:Class, or a variable holding a class or module.")
    @argument("--repo", default=None, help="Repo directory.")
    @argument("--device", default=None, help="Verify on this device.")
    @argument("--dtype", default=None, help="Cast floating weights and inputs.")
    @line_magic
    def ml_verify(self, line: str) -> Any:
        """Check a candidate implementation against the recorded calls (``capture.verify(candidate)``)."""
        args = parse_argstring(self.ml_verify, line)
        capture = self._capture(args.ref, args.repo, args.device, args.dtype)
        candidate: Any = args.candidate
        if candidate.isidentifier() and candidate in self.shell.user_ns:
            candidate = self.shell.user_ns[candidate]
        result = _call_tool(capture, "verify", "verification", (candidate,), {})
        return _as_view(f"verify of {capture.ref}", result)


def _call_tool(capture: Any, method: str, what: str, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
    from modulelens.tools.profile import profile
    from modulelens.tools.timing import TimingConfig
    from modulelens.tools.verify import verify

    timing = {key: options.pop(key) for key in ("warmup", "iters", "target_seconds") if key in options}
    if timing:
        options["timing"] = TimingConfig(**timing)
    func = {"profile": profile, "verify": verify}[method]
    try:
        return func(capture, *args, **options)
    except ModulelensError as error:
        raise UsageError(f"{method}: {error}") from None


def _as_view(title: str, result: Any) -> Any:
    """Tool results display as themselves when they render HTML, else through ResultView."""
    if hasattr(result, "_repr_html_"):
        return result
    data = result.to_dict() if hasattr(result, "to_dict") else result
    passed = getattr(result, "passed", None)
    return ResultView(title, data, passed if isinstance(passed, bool) else None, source=result)


def load_ipython_extension(ipython: Any) -> None:
    """Called by ``%load_ext modulelens``."""
    ipython.register_magics(ModulelensMagics)


def unload_ipython_extension(ipython: Any) -> None:
    """Called by ``%unload_ext modulelens``: remove the magics."""
    for name in ("ml_ls", "ml_load", "ml_replay", "ml_profile", "ml_verify"):
        ipython.magics_manager.magics["line"].pop(name, None)
