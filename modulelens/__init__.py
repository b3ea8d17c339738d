"""modulelens: capture a submodule of a real PyTorch job, store it, rebuild and replay it anywhere.

Capture (while the real job runs)::

    import modulelens
    modulelens.track_init()                        # record constructor args of modules built from now on
    model = build_model()
    with modulelens.capture(model, targets=["blocks.*.attn", "TopMLP"], name="ranker", warmup=2):
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

from modulelens import testing as testing  # modulelens.testing.assert_matches for golden tests
from modulelens.errors import (
    CaptureNotFoundError,
    CaptureWarning,
    CorruptCaptureError,
    InvalidNameError,
    ModulelensError,
    RestoreError,
    SourceChangedWarning,
    UnsupportedValueError,
)
from modulelens.format import FORMAT_VERSION, ShapeOnly, Unrecorded, register_codec, register_state_codec
from modulelens.repo import Repo, VersionInfo
from modulelens.restore import Call, Capture, ReplayReport, load
from modulelens.tools.profile import profile
from modulelens.tools.verify import verify
from modulelens.tracing import capture, get_init_record, track_init

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
    "ReplayReport",
    "Repo",
    "RestoreError",
    "ShapeOnly",
    "SourceChangedWarning",
    "Unrecorded",
    "UnsupportedValueError",
    "VersionInfo",
    "__version__",
    "capture",
    "get_init_record",
    "load",
    "load_ipython_extension",
    "profile",
    "register_codec",
    "register_state_codec",
    "track_init",
    "unload_ipython_extension",
    "verify",
]
