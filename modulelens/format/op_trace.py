"""The op-level trace of one call: every aten op a module ran, in which of its submodules, from
which source line, and an exact fingerprint, statistics and (under a byte budget) the values of
what each op and each submodule returned (docs/format.md, "Op traces").

:class:`OpRecorder` fills an :class:`OpTrace` while a call runs: a ``TorchDispatchMode`` sees every
op that reaches aten (CPU and CUDA alike; a Triton or CUDA-source kernel launch does not go
through aten), and two global module hooks, on only while the call runs, say which submodule is
running. Own hooks rather than ``torch.utils.module_tracker.ModuleTracker``: that tracker names
modules by their class from the root, keeps an unordered set of the running ones, and registers
gradient hooks on every module's inputs and outputs, which changes the autograd graph of the job
being recorded; the locator needs the ordered nesting of module calls, their outputs (compared
at module boundaries) and paths relative to the recorded module, as its capture names them.

The recorder's own work (fingerprints, statistics, copies) runs with every dispatch mode popped,
so it never shows up in this trace or in an enclosing one (a target inside a recorded target).

This file imports torch, xxhash and the standard library only: the kernel candidate worker loads
it by path (``kernels/worker_candidate.py``), where importing modulelens is refused. For the same
reason the statistics function is given to the recorder (``stats=``: modulelens passes its one
statistics function, :func:`modulelens.format.shape_only.tensor_stats`).
"""

from __future__ import annotations

import math
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import xxhash
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

TRACE_FORMAT = "modulelens.op-trace"
TRACE_VERSION = 1
FINGERPRINT = "xxh3_128"  # fingerprints read "xxh3_128:<32 hex digits>" of the row-major bytes
_DTYPE_NAMES = {dtype: str(dtype).removeprefix("torch.") for dtype in vars(torch).values()
                if isinstance(dtype, torch.dtype)}
# Frames in these folders are not "the source line" of an op: torch's own layers and functional
# wrappers, and modulelens (the tracer's hooks, the worker that runs a kernel candidate).
_INTERNAL_DIRS = (str(Path(torch.__file__).resolve().parent), str(Path(__file__).resolve().parents[1]))

StatsFunction = Callable[..., dict[str, Any]]  # tensor_stats(tensor, quantiles=False)
# Ops whose output is uninitialised memory (dropout's mask before bernoulli_ fills it): its bytes
# differ between any two runs, so they get no fingerprint, statistics or values.
_UNINITIALISED = ("aten::empty", "aten::new_empty")


@dataclass(frozen=True)
class TraceLimits:
    """What one call's trace may hold.

    Args:
        values_bytes: bytes of op and module output values kept, per call; outputs are kept in
            the order they were made until the budget is spent, and one larger than the whole
            budget never (``0``: fingerprints and statistics only).
        max_ops: ops recorded per call; later ops are counted in ``OpTrace.truncated`` only.
    """

    values_bytes: int = 16 << 20
    max_ops: int = 200_000


@dataclass
class TracedValue:
    """One output of an op or of a module call.

    A tensor has ``dtype``, ``shape``, ``fingerprint`` (exact: ``xxh3_128`` of its row-major bytes;
    ``None`` for a layout whose bytes are not read: sparse, quantized, a tensor subclass) and
    ``stats``; ``tensor`` holds a CPU copy of its values when the budget allowed. Anything else is
    ``scalar`` (a number, bool, string or ``None`` as it was; other objects as their ``repr``)."""

    dtype: str | None = None
    shape: list[int] | None = None
    fingerprint: str | None = None
    stats: dict[str, Any] | None = None
    tensor: torch.Tensor | None = None
    scalar: Any = None
    is_tensor: bool = True

    def to_json(self, add_tensor: Callable[[torch.Tensor, str], str], path: str) -> dict[str, object]:
        if not self.is_tensor:
            return {"scalar": self.scalar}
        stats = None if self.stats is None else {  # strict JSON: a non-finite number as its text ("inf")
            key: value if not isinstance(value, float) or math.isfinite(value) else repr(value)
            for key, value in self.stats.items()}
        data: dict[str, object] = {"dtype": self.dtype, "shape": self.shape, "fingerprint": self.fingerprint,
                                "stats": stats}
        if self.tensor is not None:
            data["value"] = add_tensor(self.tensor, path)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], get_tensor: Callable[[str], torch.Tensor]) -> TracedValue:
        if "scalar" in data:
            return cls(scalar=data["scalar"], is_tensor=False)
        value = data.get("value")
        return cls(dtype=data["dtype"], shape=list(data["shape"]), fingerprint=data.get("fingerprint"),
                   stats=data.get("stats"), tensor=get_tensor(value) if value is not None else None)

    def same(self, other: TracedValue) -> bool:
        """Bit-identical: the same dtype, shape and fingerprint (or the same scalar)."""
        if self.is_tensor != other.is_tensor:
            return False
        if not self.is_tensor:
            return bool(self.scalar == other.scalar)
        return (self.fingerprint is not None and self.fingerprint == other.fingerprint
                and self.dtype == other.dtype and self.shape == other.shape)

    def describe(self) -> str:
        """``float32[2, 64, 64]`` or the scalar's text."""
        if not self.is_tensor:
            return repr(self.scalar)
        return f"{self.dtype}[{', '.join(str(s) for s in self.shape or [])}]"


@dataclass
class TracedOp:
    """One aten op: its name (``aten::_softmax``, with the overload when it is not ``default``:
    ``aten::add.Tensor``), the innermost module call it ran in (an index of ``OpTrace.modules``),
    its source line (an index of ``OpTrace.sources``, ``-1``: none outside torch), the dtype and
    shape of each tensor argument, and its outputs."""

    op: str
    module: int
    source: int
    inputs: list[list[Any]]
    outputs: list[TracedValue]


@dataclass
class ModuleCall:
    """One call of a submodule (``path`` relative to the traced module, ``""`` for itself): the
    enclosing call (``parent``, ``-1`` for the traced module's own), the ops it ran
    (``ops[start:end]``, those of its submodules included) and its outputs."""

    path: str
    cls: str
    parent: int
    start: int
    end: int = -1
    outputs: list[TracedValue] = field(default_factory=list)


@dataclass
class OpTrace:
    """The ops one call ran (:class:`OpRecorder` records it; docs/format.md, "Op traces").

    Example::

        trace = cap.calls[0].op_trace
        for op in trace.ops[:5]:
            print(trace.modules[op.module].path, op.op, trace.source_of(op))
    """

    modules: list[ModuleCall] = field(default_factory=list)
    ops: list[TracedOp] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    truncated: int = 0  # ops past TraceLimits.max_ops, not recorded
    values_dropped: int = 0  # tensor outputs whose values did not fit the budget (fingerprint and stats kept)
    values_bytes: int = 0  # bytes of values kept

    def source_of(self, op: TracedOp) -> str | None:
        return self.sources[op.source] if 0 <= op.source < len(self.sources) else None

    def module_of(self, op: TracedOp) -> ModuleCall:
        return self.modules[op.module]

    def summary(self) -> dict[str, int]:
        """Counts for a capture's metadata and listings: ``ops``, ``modules``, ``values``, ``truncated``."""
        outputs = [v for op in self.ops for v in op.outputs] + [v for call in self.modules for v in call.outputs]
        values = len({id(v.tensor) for v in outputs if v.tensor is not None})  # a module's output is its last op's
        return {"ops": len(self.ops), "modules": len(self.modules), "values": values, "truncated": self.truncated,
                "values_dropped": self.values_dropped}

    def to_json(self, add_tensor: Callable[[torch.Tensor, str], str], where: str = "op_trace") -> dict[str, object]:
        """The JSON document (docs/format.md, "Op traces"); ``add_tensor(tensor, path)`` stores each
        kept value and returns the id the document refers to it by."""
        return {
            "format": TRACE_FORMAT, "version": TRACE_VERSION, "sources": list(self.sources),
            "truncated": self.truncated, "values_dropped": self.values_dropped, "values_bytes": self.values_bytes,
            "modules": [{"path": m.path, "class": m.cls, "parent": m.parent, "start": m.start, "end": m.end,
                         "outputs": [v.to_json(add_tensor, f"{where}.modules[{i}].outputs[{k}]")
                                     for k, v in enumerate(m.outputs)]}
                        for i, m in enumerate(self.modules)],
            "ops": [{"op": o.op, "module": o.module, "source": o.source, "inputs": o.inputs,
                     "outputs": [v.to_json(add_tensor, f"{where}.ops[{i}].outputs[{k}]") for k, v in enumerate(o.outputs)]}
                    for i, o in enumerate(self.ops)],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any], get_tensor: Callable[[str], torch.Tensor]) -> OpTrace:
        """A trace from its JSON document, already checked (``format/validate_trace.py``'s
        ``validate_op_trace``); ``get_tensor(id)`` returns a kept value."""
        def values(items: list[dict[str, Any]]) -> list[TracedValue]:
            return [TracedValue.from_json(v, get_tensor) for v in items]

        return cls(
            modules=[ModuleCall(m["path"], m["class"], m["parent"], m["start"], m["end"], values(m["outputs"]))
                     for m in doc["modules"]],
            ops=[TracedOp(o["op"], o["module"], o["source"], o["inputs"], values(o["outputs"])) for o in doc["ops"]],
            sources=list(doc["sources"]), truncated=doc.get("truncated", 0),
            values_dropped=doc.get("values_dropped", 0), values_bytes=doc.get("values_bytes", 0))


class OpRecorder:
    """Records the :class:`OpTrace` of one call of ``root`` (on the thread that starts it).

    Args:
        root: the module whose call is traced; submodule paths are relative to it.
        stats: the statistics function (``tensor_stats``; see the module docstring).
        limits: the value budget and op count (:class:`TraceLimits`).

    A failure inside the recorder stops the recording (``error`` says why) and never the call.

    Example::

        recorder = OpRecorder(model, stats=tensor_stats)
        recorder.start()
        try:
            output = model(x)
        finally:
            trace = recorder.stop(output)
    """

    def __init__(self, root: torch.nn.Module, *, stats: StatsFunction, limits: TraceLimits = TraceLimits()) -> None:
        self.root = root
        self.stats = stats
        self.limits = limits
        self.trace = OpTrace()
        self.error: str | None = None
        self._names = {id(module): path for path, module in root.named_modules(remove_duplicate=False)}
        self._stack: list[int] = []
        self._thread = threading.get_ident()
        self._mode = _RecordingMode(self)
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._op_names: dict[object, str] = {}
        self._source_ids: dict[str, int] = {}
        self._internal: dict[str, bool] = {}
        self._recent: dict[int, tuple[weakref.ref[torch.Tensor], int, TracedValue]] = {}
        self._budget = limits.values_bytes
        self._active = False

    # ---------------------------------------------------------------------------------- control

    def start(self) -> None:
        """Open the traced module's own call and start seeing ops and submodule calls."""
        self.trace.modules.append(ModuleCall("", _class_path(type(self.root)), -1, 0))
        self._stack = [0]
        register = torch.nn.modules.module
        self._handles = [register.register_module_forward_pre_hook(self._enter),
                         register.register_module_forward_hook(self._exit, always_call=True)]
        self._mode.__enter__()
        self._active = True

    def stop(self, output: object = None) -> OpTrace:
        """Stop recording; ``output`` (the call's return value) closes the traced module's own call."""
        if self._active:
            self._active = False
            self._mode.__exit__(None, None, None)
        for handle in self._handles:
            handle.remove()
        self._handles = []
        with _disable_current_modes():
            try:
                for index in reversed(self._stack):  # calls a raising forward left open
                    self.trace.modules[index].end = len(self.trace.ops)
                root = self.trace.modules[0]
                root.end = len(self.trace.ops)
                if self.error is None:
                    root.outputs = self._values(output)
            except Exception as error:  # fail open: the call's result stands
                self._fail(error)
        self._recent.clear()
        return self.trace

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = f"{type(error).__name__}: {error}"

    # ---------------------------------------------------------------------------------- hooks

    def _enter(self, module: torch.nn.Module, _args: tuple[object, ...]) -> None:
        path = self._names.get(id(module))
        if path is None or not self._active or module is self.root or threading.get_ident() != self._thread:
            return
        trace = self.trace
        trace.modules.append(ModuleCall(path, _class_path(type(module)), self._stack[-1], len(trace.ops)))
        self._stack.append(len(trace.modules) - 1)

    def _exit(self, module: torch.nn.Module, _args: tuple[object, ...], output: object) -> None:
        if (not self._active or module is self.root or id(module) not in self._names
                or threading.get_ident() != self._thread or len(self._stack) < 2):
            return
        index = self._stack.pop()
        call = self.trace.modules[index]
        call.end = len(self.trace.ops)
        if self.error is not None or (output is None and sys.exc_info()[1] is not None):
            return
        with _disable_current_modes():  # our reads are not ops of the call (nor of an enclosing trace)
            try:
                call.outputs = self._values(output)
            except Exception as error:
                self._fail(error)

    def record_op(self, func: object, args: tuple[object, ...], kwargs: Mapping[str, object], output: object) -> None:
        """Called by the dispatch mode after each op ran (every mode popped)."""
        if self.error is not None or threading.get_ident() != self._thread:
            return
        trace = self.trace
        if len(trace.ops) >= self.limits.max_ops:
            trace.truncated += 1
            return
        try:
            name = self._op_names.get(func)
            if name is None:
                name = self._op_names[func] = _op_name(func)
            if name.startswith(_UNINITIALISED):  # what it returns is whatever the memory held: no fingerprint
                outputs = [TracedValue(dtype=_DTYPE_NAMES.get(t.dtype), shape=list(t.shape))
                           for t in (output if isinstance(output, (tuple, list)) else (output,))]
            else:
                outputs = self._values(output)
            trace.ops.append(TracedOp(name, self._stack[-1], self._source(), _signature(args, kwargs), outputs))
        except Exception as error:  # fail open
            self._fail(error)

    # ---------------------------------------------------------------------------------- values

    def _values(self, output: object) -> list[TracedValue]:
        if isinstance(output, (tuple, list)):
            return [self._value(item) for item in output]
        if isinstance(output, dict):
            return [self._value(item) for item in output.values()]
        if hasattr(output, "to_tuple") and callable(output.to_tuple):  # transformers' ModelOutput
            return [self._value(item) for item in output.to_tuple()]
        return [self._value(output)]

    def _value(self, value: object) -> TracedValue:
        if not isinstance(value, torch.Tensor):
            if value is None or isinstance(value, (bool, int, float, str)):
                scalar = value if not isinstance(value, float) or math.isfinite(value) else repr(value)
            else:
                scalar = repr(value)[:200]
            return TracedValue(scalar=scalar, is_tensor=False)
        recent = self._recent.get(id(value))
        if recent is not None and recent[0]() is value and recent[1] == value._version:
            return recent[2]  # a module returning what its last op made: read once
        traced = TracedValue(dtype=_DTYPE_NAMES.get(value.dtype, str(value.dtype)), shape=list(value.shape))
        if (type(value) in (torch.Tensor, torch.nn.Parameter) and value.layout == torch.strided
                and not value.is_quantized and value.device.type != "meta"):
            data = value.detach()
            data = (data.cpu() if data.device.type != "cpu" else data).contiguous()
            traced.fingerprint = f"{FINGERPRINT}:{xxhash.xxh3_128_hexdigest(_bytes(data))}"
            traced.stats = self.stats(data, quantiles=False)
            nbytes = data.numel() * data.element_size()
            if nbytes <= self._budget:
                self._budget -= nbytes
                self.trace.values_bytes += nbytes
                traced.tensor = data.clone() if data.data_ptr() == value.data_ptr() else data
            else:
                self.trace.values_dropped += 1
        self._recent[id(value)] = (weakref.ref(value), value._version, traced)
        return traced

    # ---------------------------------------------------------------------------------- sources

    def _source(self) -> int:
        """The innermost frame outside torch and modulelens: the line of the model's code that ran the op."""
        frame = sys._getframe(2)
        internal = self._internal
        while frame is not None:
            filename = frame.f_code.co_filename
            inside = internal.get(filename)
            if inside is None:
                inside = internal[filename] = filename.startswith(_INTERNAL_DIRS) or filename.startswith("<")
            if not inside:
                break
            frame = frame.f_back  # type: ignore[assignment]  # typeshed: f_back is FrameType | None
        if frame is None:
            return -1
        text = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        index = self._source_ids.get(text)
        if index is None:
            index = self._source_ids[text] = len(self.trace.sources)
            self.trace.sources.append(text)
        return index


class _RecordingMode(TorchDispatchMode):
    """Runs each op, then hands it to the recorder (torch pops this mode while it runs, so the
    recorder's own tensor work is not dispatched back here)."""

    def __init__(self, recorder: OpRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        output = func(*args, **kwargs)
        with _disable_current_modes():  # an enclosing trace does not see our reads either
            self.recorder.record_op(func, args, kwargs, output)
        return output


def _op_name(func: object) -> str:
    """``aten::add.Tensor``; ``aten::_softmax`` for the default overload."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return str(func)
    overload = getattr(func, "_overloadname", "default")
    return schema.name if overload in ("default", "") else f"{schema.name}.{overload}"


def _signature(args: tuple[object, ...], kwargs: Mapping[str, object]) -> list[list[str | list[int]]]:
    """``[dtype, shape]`` of each tensor argument (those in lists too: ``cat``'s inputs)."""
    found: list[list[str | list[int]]] = []
    for value in (*args, *kwargs.values()):
        items = value if isinstance(value, (list, tuple)) else (value,)
        for item in items:
            if isinstance(item, torch.Tensor):
                found.append([_DTYPE_NAMES.get(item.dtype, str(item.dtype)), list(item.shape)])
    return found


def _bytes(data: torch.Tensor) -> Any:  # a numpy array, whose stubs do not declare the buffer protocol xxhash's do
    """The row-major bytes of a contiguous CPU tensor (any dtype: bfloat16 and float8 included), as
    a buffer (a numpy array: no copy)."""
    flat = data.reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy()


def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


__all__ = ["FINGERPRINT", "TRACE_FORMAT", "TRACE_VERSION", "ModuleCall", "OpRecorder", "OpTrace", "TraceLimits",
           "TracedOp", "TracedValue"]
