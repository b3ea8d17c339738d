"""modulelens: capture a submodule of a real PyTorch job, store it, rebuild and replay it anywhere.

Capture (while the real job runs)::

    import modulelens
    modulelens.track_init()                        # record constructor args of modules built from now on
    model = build_model()
    with modulelens.capture(model, targets=["blocks.*.attn", "TopMLP"], name="ranker",
                            record=modulelens.Recording(warmup=2)):
        train(model)                               # hooks go away once every target is recorded

Restore (anywhere, in seconds)::

    cap = modulelens.load("ranker/top_mlp")       # or "ranker/top_mlp:v3", "ranker/top_mlp:golden"
    out = cap.module(*cap.calls[0].args, **cap.calls[0].kwargs)
    print(cap.replay())                            # bit-exact comparison with the recorded outputs
    print(modulelens.profile(cap))                 # latency, memory, FLOPs of the recorded calls
    print(modulelens.verify(cap, FusedMLP))        # does a rewrite reproduce every recorded call?

Store::

    repo = modulelens.Repo()                       # $MODULELENS_REPO or ~/.cache/modulelens/repo
    repo.set_alias("ranker/top_mlp:v3", "golden")
"""

import importlib as _importlib

from modulelens.errors import (
    CaptureNotFoundError,
    CaptureWarning,
    CorruptCaptureError,
    InvalidNameError,
    ModulelensError,
    RemoteRepoError,
    RepoBusyError,
    RestoreError,
    SourceChangedWarning,
    StorageError,
    UnsupportedValueError,
    UntrustedCodeError,
)

# typing.TYPE_CHECKING without importing typing: the console script starts here, and a plain `ls`
# imports nothing else of the standard library's larger modules (typing was ~2 ms of a ~30 ms start)
_TYPE_CHECKING = False
if _TYPE_CHECKING:
    from typing import Any as _Any

    from modulelens import testing as testing
    from modulelens.format import FORMAT_VERSION, ShapeOnly, Unrecorded, register_codec, register_state_codec
    from modulelens.repo import Repo, VersionInfo, register_store
    from modulelens.restore import Call, Capture, ReplayReport, load
    from modulelens.tools.profile import profile
    from modulelens.tools.timing import TimingConfig
    from modulelens.tools.verify import verify
    from modulelens.tracing import PayloadPolicy, Recording, capture, get_init_record, track_init

# The rest of the API is imported on first use (PEP 562): ``import modulelens`` and the CLI's
# ``--help``/``ls``/``show`` stay fast because nothing here imports torch until it is needed.
_LAZY = {
    "FORMAT_VERSION": "modulelens.format", "ShapeOnly": "modulelens.format", "Unrecorded": "modulelens.format",
    "register_codec": "modulelens.format", "register_state_codec": "modulelens.format",
    "Repo": "modulelens.repo", "VersionInfo": "modulelens.repo", "register_store": "modulelens.repo",
    "Call": "modulelens.restore", "Capture": "modulelens.restore", "ReplayReport": "modulelens.restore",
    "load": "modulelens.restore", "profile": "modulelens.tools.profile", "TimingConfig": "modulelens.tools.timing",
    "verify": "modulelens.tools.verify", "capture": "modulelens.tracing", "get_init_record": "modulelens.tracing",
    "track_init": "modulelens.tracing", "Recording": "modulelens.tracing", "PayloadPolicy": "modulelens.tracing",
}


def __getattr__(name: str) -> "_Any":  # quoted: no __future__ import (it would be a public name)
    if name == "testing":  # modulelens.testing.assert_matches for golden tests
        return _importlib.import_module("modulelens.testing")
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__version__ = "0.1.0"


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext modulelens``: register the ``%ml_*`` magics (modulelens.interfaces.ipython)."""
    from modulelens.interfaces.ipython import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    """``%unload_ext modulelens``: remove the ``%ml_*`` magics."""
    from modulelens.interfaces.ipython import unload_ipython_extension as unload

    unload(ipython)


__all__ = [
    "FORMAT_VERSION",
    "Call",
    "Capture",
    "CaptureNotFoundError",
    "CaptureWarning",
    "CorruptCaptureError",
    "InvalidNameError",
    "ModulelensError",
    "PayloadPolicy",
    "Recording",
    "RemoteRepoError",
    "ReplayReport",
    "Repo",
    "RepoBusyError",
    "RestoreError",
    "ShapeOnly",
    "SourceChangedWarning",
    "StorageError",
    "TimingConfig",
    "Unrecorded",
    "UnsupportedValueError",
    "UntrustedCodeError",
    "VersionInfo",
    "__version__",
    "capture",
    "get_init_record",
    "load",
    "load_ipython_extension",
    "profile",
    "register_codec",
    "register_state_codec",
    "register_store",
    "track_init",
    "unload_ipython_extension",
    "verify",
]


def _register_jupyter_html() -> None:
    """In a running IPython/Jupyter shell, show captures, calls and replay reports as HTML.

    Restore objects carry no ``_repr_html_`` (restore must not import interfaces); the renderers
    are registered here, at the top of the package, with the shell's display formatters by class
    name (nothing heavy is imported). ``%load_ext modulelens`` registers them too, for a shell
    started after this import.
    """
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None and hasattr(shell, "display_formatter"):
        from modulelens.interfaces.html import register_formatters

        register_formatters(shell)


_register_jupyter_html()
