"""The capture metadata document: its constants and its typed shape (spec: docs/format.md).

The ``TypedDict``\\ s below describe ``capture.json`` field by field, so code that reads or writes
metadata names its parts (``CaptureMetadata["calls"]``, ``TensorEntry["payload"]``) instead of
indexing an untyped ``dict[str, Any]``. Encoded values (``docs/format.md``: plain JSON or an object
with a ``"$type"`` tag) are :data:`EncodedValue`; call data are :class:`EncodedTree`\\ s.
"""

import sys
from typing import Any

# TypedDict understands NotRequired at run time from Python 3.11; before it, typing_extensions' does.
# typing's on 3.11+: importing typing_extensions took ~8 ms of a fresh `modulelens show` (issue 37).
if sys.version_info >= (3, 11):
    from typing import NotRequired, TypedDict
else:
    from typing_extensions import NotRequired, TypedDict

# The constants live in format/constants.py (importable without typing: `show`'s quick path); here
# for everyone who reads them as the spec's.
from modulelens.format.constants import ADDRESS_ALIGNMENT as ADDRESS_ALIGNMENT
from modulelens.format.constants import FORMAT_NAME as FORMAT_NAME
from modulelens.format.constants import FORMAT_VERSION as FORMAT_VERSION
from modulelens.format.constants import METHODLESS_VERSION as METHODLESS_VERSION
from modulelens.format.constants import NESTED_LAYOUTS as NESTED_LAYOUTS
from modulelens.format.constants import OP_TRACE_FORMAT as OP_TRACE_FORMAT
from modulelens.format.constants import OP_TRACE_VERSION as OP_TRACE_VERSION
from modulelens.format.constants import SPARSE_PARTS as SPARSE_PARTS
from modulelens.format.constants import hooks_not_rebuilt as hooks_not_rebuilt

EncodedValue = Any
"""A value in the JSON encoding of docs/format.md ("Encoded values"): JSON scalars and lists as
themselves, everything else an object tagged with ``"$type"``. Its shape is data-dependent."""


class EncodedTree(TypedDict):
    """A pytree (call inputs or output): the tree's structure and its encoded leaves."""

    spec: Any  # "*" for a leaf, else {"type", "context", "children"}
    leaves: list[EncodedValue]


class HookEntry(TypedDict):
    """``module.tree[path].hooks[i]``: a hook the job's module had (``kind``: ``forward``,
    ``forward_pre``...; ``hook``: its import path) and whether a rebuild registers it again."""

    kind: str
    hook: str
    rebuilt: bool


class ParametrizationChain(TypedDict):
    """``module.tree[path].parametrizations[tensor]``: the parametrization modules, in order."""

    unsafe: bool
    modules: list["TreeEntry"]


# ``module.tree[path]`` (format 2): the class its construction built and that construction (or why
# there is none: ``missing``), or ``same_as``, the earlier path of the same module; what a rebuild
# puts back (parametrizations, ``reapply``: norm, prune, accelerate and tool hooks, each its own
# shape by ``kind``), the hooks the job added and whether a rebuild registers them again.
TreeEntry = TypedDict(
    "TreeEntry",
    {"class": str, "construction": str | None, "missing": str, "same_as": str, "compiled": bool,
     "compile": dict[str, Any], "made_by": str, "traced_training": bool,
     "parametrizations": dict[str, ParametrizationChain], "reapply": list[dict[str, Any]],
     "hooks": list[HookEntry], "forward_replaced": str},
    total=False,
)


# The captured module: class path, where it sat in the model, how to rebuild it. "class" is a
# Python keyword, so this and Construction use the functional TypedDict syntax.
ModuleInfo = TypedDict(
    "ModuleInfo",
    {
        "class": str,
        "qualified_name": str,
        "construction": str | None,
        "construction_missing": NotRequired[str],
        # format 3: the method the recorded calls went through (``encode``, ``__call__``...); absent: module(...)
        "method": NotRequired[str],
        "source": NotRequired[dict[str, Any]],  # where the class's own source is kept (see sources)
        # at the first recorded call: submodule path -> class name, and plain attributes
        # (submodule path -> {name: encoded scalar/str/bool/tuple}); restored on load
        "structure": NotRequired[dict[str, str]],
        "attributes": NotRequired[dict[str, dict[str, EncodedValue]]],
        # format 2, at the first recorded call: per submodule path, what a rebuild needs to put it back
        "tree": NotRequired[dict[str, TreeEntry]],
    },
)

Construction = TypedDict(
    "Construction",
    {"class": str, "args": list[EncodedValue], "kwargs": dict[str, EncodedValue],
     # a module its recorded arguments cannot rebuild (a closure argument), rebuilt from its
     # recorded attributes instead (docs/fidelity.md, "Rebuilt from recorded attributes")
     "state": NotRequired[EncodedValue], "parameters": NotRequired[list[str]],
     "buffers": NotRequired[dict[str, bool]], "why": NotRequired[str]},
)


class ParameterEntry(TypedDict):
    tensor: str
    requires_grad: bool


class BufferEntry(TypedDict):
    tensor: str
    persistent: bool


class StateEntry(TypedDict):
    """Parameters and buffers in effect for the calls that name this state."""

    parameters: dict[str, ParameterEntry]
    buffers: dict[str, BufferEntry]
    extra_state: NotRequired[dict[str, EncodedValue]]
    # format 2: per submodule path, what its own _save_to_state_dict adds (docs/format.md)
    module_state: NotRequired[dict[str, dict[str, EncodedValue]]]
    # non-persistent sparse or nested buffers the constructor rebuilds: name -> {"layout", "digest"}
    rebuilt_buffers: NotRequired[dict[str, dict[str, str]]]


class BackwardEntry(TypedDict):
    output_grads: EncodedTree
    input_grads: EncodedTree
    param_grads: EncodedTree


class OpTraceSummary(TypedDict):
    """``calls[i].op_trace``: where the call's op trace is stored and what it holds (docs/format.md, "Op traces")."""

    text_id: str  # a 1-D uint8 entry of the tensor table: the trace document as UTF-8 JSON
    ops: int
    modules: int
    values: int
    truncated: NotRequired[int]
    values_dropped: NotRequired[int]


class OpTraceValue(TypedDict, total=False):
    """One output of an op or module call in an op trace: a tensor (``dtype``, ``shape``,
    ``fingerprint``, ``stats``, ``value``: a tensor id when its values were kept) or a ``scalar``."""

    dtype: str
    shape: list[int]
    fingerprint: str | None
    stats: dict[str, Any] | None
    value: str
    scalar: Any


OpTraceModule = TypedDict(
    "OpTraceModule",
    {"path": str, "class": str, "parent": int, "start": int, "end": int, "outputs": list[OpTraceValue]},
)


class OpTraceOp(TypedDict):
    op: str  # "aten::_softmax", "aten::add.Tensor"
    module: int  # index into modules: the innermost module call it ran in
    source: int  # index into sources, -1 when no frame outside torch ran it
    inputs: list[list[Any]]  # [dtype, shape] of each tensor argument
    outputs: list[OpTraceValue]


class OpTraceDocument(TypedDict):
    """The op trace of one call (stored as a blob; ``modulelens/format/op_trace.py``)."""

    format: str  # "modulelens.op-trace"
    version: int
    modules: list[OpTraceModule]
    ops: list[OpTraceOp]
    sources: list[str]
    truncated: int
    values_dropped: int
    values_bytes: int


class CallEntry(TypedDict):
    """One recorded call (docs/format.md, ``calls[i]``)."""

    index: int
    state: int
    training: bool
    grad_enabled: bool
    autocast: NotRequired[dict[str, str]]
    settings: NotRequired[dict[str, bool | int | float | str | None]]  # format/library_settings.py
    rng: NotRequired[dict[str, str]]
    inputs: EncodedTree
    output: EncodedTree | None
    finished: NotRequired[bool]
    error: NotRequired[str]
    backward: NotRequired[BackwardEntry]
    backward_missing: NotRequired[str]  # why a backward asked for was not recorded
    # input path -> the value after the call, for inputs the call changed in place (caches, tensors)
    mutated_inputs: NotRequired[EncodedTree]
    # buffer name -> its value after the call, for buffers the call changed (running statistics);
    # recorded when the capture's settings say "buffers_after": true; also torchmetrics metric
    # states (dotted names) the call changed, when they say "metric_states_after": true
    buffers_after: NotRequired[EncodedTree]
    # format 3: a call inside torch.func.vmap (an ensemble): {"size", "randomness", "inputs", "state", "output"}
    vmap: NotRequired[dict[str, Any]]
    op_trace: NotRequired[OpTraceSummary]  # recorded with Recording(op_trace=True)




class TensorEntry(TypedDict):
    """One tensor of the table: a payload, a view of another entry, a shape-only record, or a
    tensor subclass made of other entries (format/layouts.py)."""

    dtype: str
    shape: list[int]
    stride: NotRequired[list[int]]
    device: NotRequired[str]
    nbytes: int
    payload: NotRequired[str]
    pack: NotRequired[int]  # index into CaptureMetadata["packs"]: the payload is a member of that pack
    view_of: NotRequired[str]
    storage_offset: NotRequired[int]
    shape_only: NotRequired[bool]
    stats: NotRequired[dict[str, Any]]
    quantized: NotRequired[dict[str, Any]]  # format 2: scheme, scale(s), zero point(s) (docs/format.md)
    requires_grad: NotRequired[bool]  # a call value that required grad in the job (kernels choose by it)
    address_offset: NotRequired[int]  # where the job's tensor started past a 64-byte boundary (kernels round by it)
    subclass: NotRequired[dict[str, Any]]  # a tensor subclass made of inner tensors: class, parts, context


class ClassSource(TypedDict, total=False):
    """``sources[module].classes[qualname]``: a captured class's source hash, and its text for a
    class defined inside a function (rebuilt from that text alone)."""

    hash: str | None
    text: str | None


class SourceFile(TypedDict, total=False):
    """``sources[module]``: a captured user module's file and source hash; its text as a blob
    (``text_id``), inline (``text``, captures made before source blobs), or why it was left out
    (``omitted``); and its captured classes."""

    file: str | None
    hash: str | None
    text: str | None
    text_id: str
    omitted: str
    classes: dict[str, ClassSource]


class UnrecordedEntry(TypedDict):
    path: str
    type: str
    reason: str


class CaptureMetadata(TypedDict):
    """The whole ``capture.json`` document."""

    format: str
    format_version: int
    name: str | None  # filled in by the repo when the version is created
    version: int | None
    created: str
    tags: list[str]
    metadata: dict[str, Any]
    module: ModuleInfo
    constructions: dict[str, Construction]
    states: list[StateEntry]
    calls: list[CallEntry]
    unrecorded: NotRequired[list[UnrecordedEntry]]
    shape_only: NotRequired[list[str]]
    sources: NotRequired[dict[str, SourceFile]]
    capture: dict[str, Any]
    environment: dict[str, Any]
    distributed: NotRequired[dict[str, Any]]
    tensors: dict[str, TensorEntry]
    packs: NotRequired[list[dict[str, Any]]]  # [{"payload": "blake3:...", "nbytes": N}], repo layout 2


def cpu_capability() -> str | None:
    """The value of ``environment.cpu_capability``: the vector instructions torch's CPU kernels
    use on this machine (``"AVX2"``, ``"AVX512"``...). The same float operations round differently
    under others, so capture records it and replay is bit-exact by default only on the same."""
    import torch  # here: reading metadata (``modulelens ls``) must not import torch

    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):  # torch < 2.1
        return None
