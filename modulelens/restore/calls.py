"""One recorded call of a loaded capture (:class:`Call`, ``cap.calls[i]``): its inputs as new copies
on every access, its output and what it changed in place, its gradients and op trace, all decoded
on first use from the capture's metadata and payloads (restore/loader.py), and :meth:`Call.context`
to run a module as the call ran.
"""

from __future__ import annotations

import contextlib
import functools
import json
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from modulelens.errors import CorruptCaptureError
from modulelens.format.op_trace import OpTrace
from modulelens.format.spec import CallEntry, EncodedTree
from modulelens.format.tree import decode_spec, decode_tree, deep_leaves, tree_summary
from modulelens.format.validate_trace import validate_op_trace
from modulelens.restore.context import call_context
from modulelens.restore.inputs import check_inputs_usable, copy_inputs, with_recorded_grad

if TYPE_CHECKING:
    from modulelens.restore.loader import Capture


@dataclass
class Call:
    """One recorded call. ``output`` and the other recorded values are loaded on first access;
    ``args``/``kwargs``/``inputs`` are new copies on every access (see :attr:`args`)."""

    index: int
    training: bool
    grad_enabled: bool
    state_index: int
    finished: bool
    autocast: dict[str, str]
    _capture: Capture = field(repr=False)
    _data: CallEntry = field(repr=False)
    _pending_kwargs: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    _input_spec: Any = field(default=None, repr=False, compare=False)

    @property
    def settings(self) -> dict[str, object]:
        """Libraries' global settings in force when the call was recorded (gpytorch's, which
        botorch's ``posterior`` sets; ``{}`` for most calls): :meth:`context` runs under them."""
        return dict(self._data.get("settings", {}))

    @property
    def args(self) -> tuple[Any, ...]:
        """The positional inputs as the module received them, as a new copy on every access, so a
        call that changes its inputs in place (a transformers cache it appends to) cannot change
        what is recorded. Tensors are new copy-on-write mappings of the stored payloads (nothing is
        read until used), moved/cast when ``load(..., device=, dtype=)`` asked for it; a tensor
        stored shape-only is a :class:`ShapeOnly` marker (a synthetic tensor with
        ``load(..., synthesize=True)``). ``call.kwargs`` read right after ``call.args`` (as in
        ``module(*call.args, **call.kwargs)``) comes from the same copy, so a tensor passed twice
        stays one tensor.

        Example::

            with call.context():
                out = cap.module(*call.args, **call.kwargs)
        """
        args, self._pending_kwargs = self._fresh_inputs()
        return args

    @property
    def kwargs(self) -> dict[str, Any]:
        """The keyword inputs, a new copy on every access (see :attr:`args`)."""
        pending, self._pending_kwargs = self._pending_kwargs, None
        return pending if pending is not None else self._fresh_inputs()[1]

    @property
    def inputs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` from one new copy (see :attr:`args`)."""
        return self._fresh_inputs()

    def _fresh_inputs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        capture = self._capture
        ctx = capture._decode_context(synthesize=True, fresh=True)
        if self._input_spec is None:  # resolving the node types is most of a small tree's decoding
            self._input_spec = decode_spec(self._data["inputs"], ctx)
        args, kwargs = decode_tree(self._data["inputs"], ctx, self._input_spec)
        inputs: tuple[tuple[Any, ...], dict[str, Any]] = (tuple(args), dict(kwargs))
        if capture._grad_tids:  # inputs that required grad in the job (a copy handed out knows its id)
            handed = capture._handed_out
            def handed_out(original: torch.Tensor, copy: torch.Tensor) -> None:
                handed[id(copy)] = (weakref.ref(copy), handed[id(original)][1])

            inputs = with_recorded_grad(inputs, lambda _path, t: id(t) in handed and handed[id(t)][0]() is t
                                        and handed[id(t)][1] in capture._grad_tids, handed_out)
        if capture.device is not None or capture.dtype is not None:
            inputs = copy_inputs(inputs, capture.device, capture.dtype)
        return inputs

    @functools.cached_property
    def _stored_inputs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The inputs decoded once, sharing the capture's cached tensors: read only, never run."""
        args, kwargs = decode_tree(self._data["inputs"], self._capture._decode_context(synthesize=True))
        return tuple(args), dict(kwargs)

    @contextlib.contextmanager
    def context(self, module: torch.nn.Module | None = None, *, weights: bool = True) -> Iterator[torch.nn.Module]:
        """Run a module as this call ran: the call's recorded weights (``weights=False`` keeps the
        module's own), its training flag, grad mode, autocast and RNG state (dropout draws the same
        masks). Scoped: on exit the module is as it was on entry (its parameters and buffers, what a
        training-mode forward changed in place included, and each submodule's training flag), and
        grad mode, autocast and the RNG are put back, so ``cap.module(x)`` after the block runs as it
        did before it.

        Restoring is free for :attr:`Capture.module` holding recorded weights (they are reloaded
        from the capture when something changed); any other module, or one holding your edits, is
        copied once on entry. A backward through an output computed inside the block belongs inside
        it (the weights it saw may be reloaded on exit).

        Args:
            module: the module to run (default: :attr:`Capture.module`; another module keeps its
                weights).
            weights: load this call's recorded parameters and buffers into :attr:`Capture.module`.

        Yields:
            The module.

        Example::

            call = cap.calls[0]
            with call.context() as module:
                out = module(*call.args, **call.kwargs)   # equals call.output
        """
        capture = self._capture
        target = capture.module if module is None else module
        with capture.module_kept(target):
            if weights and module is None:
                capture.use_state(self.state_index)
            target.train(self.training)
            with call_context(self, capture.device or torch.device("cpu")):
                yield target

    @functools.cached_property
    def output(self) -> Any:
        if self._data.get("output") is None:
            return None
        return decode_tree(self._data["output"], self._capture._decode_context())

    @functools.cached_property
    def mutated_inputs(self) -> dict[str, Any]:
        """Inputs the call changed in place (a transformers cache, a tensor updated in place), as
        they were *after* the call, by input path (``"[1]['cache']"``: ``kwargs['cache']``);
        ``inputs`` holds them as they were on entry. Replay compares both (docs/fidelity.md)."""
        data = self._data.get("mutated_inputs")
        return {} if data is None else dict(decode_tree(data, self._capture._decode_context()))

    @functools.cached_property
    def buffers_after(self) -> dict[str, Any]:
        """The buffers this call changed (BatchNorm's running statistics, an EMA codebook), by name,
        as they were *after* the call; the call's state holds them as they were on entry. Replay and
        verify compare both (docs/fidelity.md, "Buffers a call changes")."""
        data = self._data.get("buffers_after")
        if data is None:
            return {}
        found = decode_tree(data, self._capture._decode_context())
        if not isinstance(found, dict) or not all(isinstance(name, str) for name in found):
            raise CorruptCaptureError(f"{self._capture.ref}: call {self.index}: buffers_after is not a mapping of "
                                      "buffer names to values")
        return found

    @property
    def vmap(self) -> dict[str, Any] | None:
        """For a call recorded inside ``torch.func.vmap`` (an ensemble, docs/fidelity.md "torch.func"):
        its batch ``size``, vmap's ``randomness``, and the paths of the batched ``inputs`` and
        ``output`` leaves and names of the batched ``state`` (stored stacked along a first
        dimension); ``None`` for any other call. :func:`run_call` runs it under vmap again."""
        return self._data.get("vmap")

    @property
    def has_backward(self) -> bool:
        return self._data.get("backward") is not None

    @property
    def backward_missing(self) -> str | None:
        """Why no backward was recorded for this call although one was asked for (its backward
        had not run when the capture was saved), or ``None``."""
        return self._data.get("backward_missing")

    @functools.cached_property
    def backward(self) -> dict[str, Any] | None:
        """Recorded gradients (``capture(..., record=Recording(backward=True))``): ``output_grads`` (the output's
        structure), ``input_grads`` (the ``(args, kwargs)`` structure) and ``param_grads``."""
        data = self._data.get("backward")
        if data is None:
            return None
        ctx = self._capture._decode_context()
        result = {key: decode_tree(data[key], ctx) for key in ("input_grads", "param_grads")}
        result["output_grads"] = decode_tree(data["output_grads"], self._capture._decode_context(synthesize=True))
        return result

    def shape_only_in(self, part: str) -> bool:
        """Whether ``part`` (``"inputs"``, ``"output"``, ``"backward.output_grads"``...) holds a
        tensor stored shape-only (replayed, it is synthetic, so results cannot be compared)."""
        data: Any = self._data
        for key in part.split("."):
            data = data.get(key) if isinstance(data, dict) else None
        tensors = self._capture.metadata["tensors"]
        return any(tensors[tid].get("shape_only") for tid in _tensor_ids(data))

    @property
    def has_op_trace(self) -> bool:
        """Whether the call was recorded with its op trace (``Recording(op_trace=True)``)."""
        return self._data.get("op_trace") is not None

    @functools.cached_property
    def op_trace(self) -> OpTrace | None:
        """The aten ops the recorded call ran, with the submodule, source line, fingerprint and
        statistics (and values, under the recording's budget) of each output; ``None`` when it
        was recorded without (docs/fidelity.md, "Op traces").

        Raises:
            CorruptCaptureError: the stored trace is damaged (checked against docs/format.md first).

        Example::

            trace = cap.calls[0].op_trace
            print(len(trace.ops), trace.ops[0].op)      # 63 aten::native_layer_norm
        """
        summary = self._data.get("op_trace")
        if summary is None:
            return None
        capture = self._capture
        where = f"{capture.ref}: calls[{next(i for i, c in enumerate(capture.calls) if c is self)}].op_trace"
        try:
            data = json.loads(capture._read_text(summary["text_id"]))
        except (ValueError, UnicodeDecodeError) as error:
            raise CorruptCaptureError(f"{where}: not JSON ({error})") from None
        tensors = cast(dict[str, dict[str, Any]], capture.metadata["tensors"])
        document = validate_op_trace(data, where, lambda tid: None if tensors.get(tid, {}).get("shape_only")
                                     else tensors.get(tid))
        return OpTrace.from_json(cast(dict[str, Any], document), capture.tensor)

    @property
    def rng(self) -> dict[str, torch.Tensor]:
        return {device: self._capture.tensor(tid) for device, tid in self._data.get("rng", {}).items()}

    @property
    def unrecorded(self) -> list[str]:
        prefix = f"call{self.index}."
        return [u["path"] for u in self._capture.metadata.get("unrecorded", []) if u["path"].startswith(prefix)]

    def fresh_inputs(
        self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """A private copy of the inputs (on ``device``/``dtype``) that a forward may modify. The
        aliasing of the recording is kept: one recorded tensor passed twice (``attn(x, x, x)``) is
        one copy, and views of one storage stay views of one (copied) storage."""
        args, kwargs = self._stored_inputs
        check_inputs_usable(self, (args, kwargs))
        copies = copy_inputs((args, kwargs), device, dtype)
        grad_tids = self._capture._grad_tids
        if grad_tids:  # inputs that required grad in the job: the copies at their paths do too
            ids = {id(t): tid for tid, t in self._capture._tensors.items()}
            paths = {path for path, leaf in deep_leaves((args, kwargs)) if ids.get(id(leaf)) in grad_tids}
            copies = with_recorded_grad(copies, lambda path, _t: path in paths)
        return copies

    @property
    def capture(self) -> Capture:
        """The capture this call belongs to."""
        return self._capture

    @property
    def input_tree(self) -> EncodedTree:
        """The encoded ``(args, kwargs)`` tree as stored (for summaries that must not decode values)."""
        return self._data["inputs"]

    @property
    def output_tree(self) -> EncodedTree | None:
        """The encoded output tree as stored, or ``None`` when the call raised in the original job."""
        return self._data.get("output")

    def __repr__(self) -> str:
        # From metadata only: a repr must work even when an input's type cannot be imported here.
        mode = ("train" if self.training else "eval") + ("" if self.grad_enabled else ", no_grad")
        status = "" if self.finished else ", raised"
        tensors = self._capture.metadata["tensors"]
        return (f"<Call {self.index} of {self._capture.ref} ({mode}{status}): "
                f"inputs {tree_summary(self.input_tree, tensors)} -> output {tree_summary(self.output_tree, tensors)}>")


def _tensor_ids(data: object) -> list[str]:
    """Ids of every tensor referenced in an encoded value or tree."""
    if isinstance(data, dict):
        if data.get("$type") == "tensor":
            return [data["id"]]
        return [tid for value in data.values() for tid in _tensor_ids(value)]
    if isinstance(data, list):
        return [tid for value in data for tid in _tensor_ids(value)]
    return []
