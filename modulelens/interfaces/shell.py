"""``modulelens shell NAME[:ver]``: an IPython session with the capture's objects pre-bound.

Bound names: ``capture`` (the :class:`~modulelens.Capture`), ``module`` (rebuilt with its recorded
weights), ``calls`` (every recorded :class:`~modulelens.Call`), ``args`` / ``kwargs`` (a private
copy of one call's inputs, safe to modify), ``output`` (that call's recorded output), plus
``torch`` and ``modulelens``. The ``%ml_*`` magics are loaded too. With stdin not a terminal,
IPython reads commands line by line, so the shell can be scripted: ``echo 'module' | modulelens shell x``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from modulelens.errors import MissingDependencyError, ModulelensError, UsageError
from modulelens.interfaces import session
from modulelens.interfaces.output import safe_text
from modulelens.interfaces.tensor_info import describe_value

if TYPE_CHECKING:
    from modulelens.restore.loader import Capture

BOUND_NAMES = ("capture", "module", "calls", "args", "kwargs", "output")


def shell_namespace(capture: Capture, call: int = 0) -> tuple[dict[str, object], list[str]]:
    """The names the shell binds for ``capture`` and notes about what could not be bound."""
    import torch

    import modulelens

    notes: list[str] = []
    namespace: dict[str, object] = {"capture": capture, "calls": capture.calls, "torch": torch, "modulelens": modulelens,
                                 "module": None, "args": (), "kwargs": {}, "output": None}
    try:
        namespace["module"] = capture.module
    except ModulelensError as error:
        notes.append(f"module is None: {error}")
    if capture.calls:
        if not 0 <= call < len(capture.calls):
            raise UsageError(f"{capture.ref} has {len(capture.calls)} call(s); --call {call} is out of range")
        chosen = capture.calls[call]
        try:
            namespace["args"], namespace["kwargs"] = chosen.fresh_inputs(capture.device, capture.dtype)
        except ModulelensError as error:
            namespace["args"], namespace["kwargs"] = chosen.inputs
            notes.append(str(error))
        namespace["output"] = chosen.output
    else:
        notes.append("no recorded calls: args/kwargs/output are empty")
    return namespace, notes


def banner(capture: Capture, namespace: Mapping[str, object], notes: list[str], call: int) -> str:
    """The text printed when the shell starts: what was loaded and which names are bound."""
    lines = [f"modulelens shell: {capture.ref} ({capture.module_class})", "", "bound names:"]
    descriptions = {
        "capture": repr(capture),
        "module": describe_value(namespace["module"]) if namespace["module"] is not None else "None (not rebuilt)",
        "calls": f"{len(capture.calls)} recorded call(s)",
        "args": f"call {call} inputs: {describe_value(namespace['args'])}",
        "kwargs": describe_value(namespace["kwargs"]),
        "output": f"recorded output: {describe_value(namespace['output'])}",
    }
    lines += [f"  {name:<8} {descriptions[name]}" for name in BOUND_NAMES]
    lines.append("  also     torch, modulelens; magics %ml_replay capture, %ml_profile, %ml_verify")
    lines.append("try: module(*args, **kwargs)   capture.replay()")
    lines += [f"note: {n}" for n in notes]
    return safe_text("\n".join(lines)) + "\n"  # a capture's names reach the terminal: escape their controls


def start_shell(ref: str, *, repo: str | None = None, device: str | None = None, dtype: str | None = None,
                call: int = 0, ipython_args: list[str] | None = None) -> None:
    """Load ``ref`` and run an IPython session with the names of :data:`BOUND_NAMES` bound.

    Raises:
        MissingDependencyError: IPython is not installed.
        UsageError, CaptureNotFoundError, RestoreError: see :func:`modulelens.interfaces.session.load_capture`.
    """
    try:
        import IPython
        from traitlets.config import Config
    except ModuleNotFoundError as error:
        raise MissingDependencyError(f"modulelens shell needs IPython ({error}): pip install ipython") from None

    capture = session.load_capture(ref, repo, device=device, dtype=dtype)
    namespace, notes = shell_namespace(capture, call)
    config = Config()
    config.TerminalIPythonApp.display_banner = True
    config.TerminalInteractiveShell.banner1 = banner(capture, namespace, notes, call)
    config.TerminalInteractiveShell.banner2 = ""
    config.TerminalInteractiveShell.enable_tip = False
    config.TerminalInteractiveShell.confirm_exit = False
    config.InteractiveShellApp.extensions = ["modulelens"]
    IPython.start_ipython(argv=list(ipython_args or []), user_ns=namespace, config=config)
