"""Copy tensors out of a running job: detached, off the accelerator, safe from later in-place ops.

Copies are memoised by (tensor identity, version counter): a tensor seen twice unchanged (the
output of one target fed into another, tied weights) is copied once and stays one tensor in the
capture, while an in-place change bumps the version counter and forces a new copy.

Views of one storage inside one snapshot (``q, k, v = qkv.chunk(3)`` passed to a module) are
copied as one span of that storage and come back as views of the copy: each carries the span in
``_modulelens_base`` so the capture stores the bytes once and restores the views sharing storage.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch._C import _functorch

from modulelens.errors import CaptureError
from modulelens.format.layouts import clone, is_plain, version_counter
from modulelens.format.tensors import address_offset
from modulelens.format.tree import deep_flatten
from modulelens.format.values import Unrecorded

BASE_ATTR = "_modulelens_base"
# A copy of a tensor that required grad in the job (the copy is detached): recorded with the call,
# because some kernels choose their path by it (CPU attention with a position bias that requires
# grad computes other roundings: a census wrong value, transformers' udop) and replay sets it again.
GRAD_ATTR = "_modulelens_requires_grad"
# Where the job's tensor started past a 64-byte boundary (format/tensors.py ADDRESS_ALIGNMENT: CPU
# kernels round by it), set on a copy of a CPU tensor that did not start on one; the load puts the
# recorded tensor at the same offset.
ADDRESS_ATTR = "_modulelens_address_offset"
# Share a storage span only when it is at most this many times the bytes of the views in it, so a
# small slice of a huge activation is never copied with the whole activation.
_MAX_SPAN_RATIO = 2


def _address_offset(tensor: torch.Tensor) -> int:
    """The job's tensor's offset past a 64-byte boundary; 0 for one without plain strided data."""
    if not is_plain(tensor):
        return 0
    try:
        return address_offset(tensor)
    except RuntimeError:  # no storage to point at (a functorch wrapper, a tensor subclass)
        return 0


def _memo_key(tensor: torch.Tensor) -> tuple[int, int] | None:
    """The memo's key for a copy of ``tensor``: its identity and version counter, which an in-place
    change bumps. ``None`` for an inference tensor (made under ``torch.inference_mode()``, as
    sentence-transformers' ``encode`` makes its inputs): it has no version counter (reading it
    raised and dropped the capture), so it is copied every time, never from the memo."""
    version = version_counter(tensor)
    return None if version is None else (id(tensor), version)


class Snapshotter:
    def __init__(self) -> None:
        # (identity, version) -> the tensor and its copy, for one outermost recorded call only (the
        # tracer clears it when the next begins): the job can write a tensor between two recorded calls without moving its
        # version counter (``x.data.mul_``, numpy writing into a tensor from ``torch.from_numpy``, a
        # custom kernel), and a copy from an earlier call was recorded as the later call's input
        # (docs/fidelity.md, "Shared tensors are stored once").
        self._memo: dict[tuple[int, int], tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}
        self.pending_device_copies = False
        # id(DTensor) -> its full tensor, gathered by the tracer on every rank of its mesh before
        # the snapshot (a gather here, on the recording rank only, would hang the job).
        self.gathered: dict[int, torch.Tensor] = {}
        # a call recorded as vmapped (tracer): a vmap batch is copied as its entries stacked
        self.stacked = False

    def tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        key = _memo_key(tensor)
        hit = self._memo.get(key) if key is not None else None
        if hit is not None and hit[0]() is tensor:
            return hit[1]
        copy = self._copy(tensor)
        if tensor.device.type != "cpu":
            copy._modulelens_device = str(tensor.device)  # type: ignore[attr-defined]
        elif offset := _address_offset(tensor):
            setattr(copy, ADDRESS_ATTR, offset)
        try:
            if key is not None:
                self._memo[key] = (weakref.ref(tensor), copy)
        except TypeError:  # some tensor subclasses refuse weak references: just don't memoise
            pass
        return copy

    def _copy(self, tensor: torch.Tensor) -> torch.Tensor:
        source = self.gathered.get(id(tensor), tensor)
        if _functorch.is_functorch_wrapped_tensor(source):
            stacked = unwrap_functorch(source, stacked=self.stacked)
            with outside_functorch():  # a copy made inside the transform would be wrapped again
                return self._copy_plain(stacked.detach())
        return self._copy_plain(source.detach())

    def _copy_plain(self, source: torch.Tensor) -> torch.Tensor:
        if type(source) is not torch.Tensor and hasattr(source, "full_tensor"):
            raise CaptureError("a sharded tensor (DTensor) was not gathered on every rank of its mesh; "
                                  "not recorded")
        if source.device.type == "cpu":  # clone() inlined for plain tensors: this runs for every recorded tensor
            return source.clone(memory_format=torch.preserve_format) if source.layout == torch.strided and \
                not source.is_nested else clone(source)
        if source.device.type == "meta":
            return source.clone()
        if not is_plain(source):  # sparse, nested: torch's own copy, part by part
            return source.to("cpu", copy=True)
        pinned = torch.cuda.is_available() and source.device.type == "cuda"
        target = torch.empty_strided(source.size(), source.stride(), dtype=source.dtype, device="cpu", pin_memory=pinned) \
            if _is_dense(source) else torch.empty(source.size(), dtype=source.dtype, device="cpu", pin_memory=pinned)
        target.copy_(source, non_blocking=pinned)
        self.pending_device_copies |= pinned
        return target

    def tree(self, tree: object) -> Any:  # the tree's own type: the caller unpacks what it gave
        """``tree`` with each tensor replaced by its copy (dataclass fields and state objects
        included, a state object as a new object)."""
        # One walk and one rebuild: this runs on every recorded call's inputs and output
        # (benchmarks/bench_recording.py).
        leaves, rebuild = deep_flatten(tree)
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        if len(tensors) > 1:  # one tensor shares a storage with no other
            self._copy_shared_storages(tensors)
        return rebuild([self._call_value(leaf) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves])

    def _call_value(self, tensor: torch.Tensor) -> torch.Tensor | Unrecorded:
        """A call tensor's copy, or an explicit :class:`Unrecorded` marker for one that has no
        values to copy here (a ``torch.func.vmap`` batch, a dtype torch cannot copy): the rest of
        the call is still recorded (issue 22)."""
        try:
            copy = self.tensor(tensor)
        except (RuntimeError, NotImplementedError, TypeError) as error:
            return Unrecorded("torch.Tensor", f"a {str(tensor.dtype).removeprefix('torch.')} tensor that cannot be "
                                              f"copied: {type(error).__name__}: {str(error).splitlines()[0]}")
        if tensor.requires_grad:  # a call value only (a state's parameters say it in their own entry)
            setattr(copy, GRAD_ATTR, True)
        return copy

    def _copy_shared_storages(self, tensors: list[torch.Tensor]) -> None:
        """Copy each storage that several distinct tensors view as one span; memoise the views."""
        groups: dict[tuple[str, int], dict[int, torch.Tensor]] = {}
        for tensor in tensors:
            if _memo_key(tensor) in self._memo:
                continue  # copied already (the memo is looked at first: it is the cheaper test)
            key = _storage_key(tensor)
            if key is not None:
                groups.setdefault(key, {})[id(tensor)] = tensor
        for members in groups.values():
            views = list(members.values())
            if len(views) < 2 or len({v.dtype for v in views}) != 1:
                continue
            start = min(v.storage_offset() for v in views)
            end = max(_extent(v) for v in views)
            if (end - start) > _MAX_SPAN_RATIO * sum(v.numel() for v in views):
                continue
            span = self._copy(views[0].detach().as_strided((end - start,), (1,), start))
            if views[0].device.type != "cpu":
                span._modulelens_device = str(views[0].device)  # type: ignore[attr-defined]
            for view in views:
                copy = span.as_strided(view.shape, view.stride(), view.storage_offset() - start)
                setattr(copy, BASE_ATTR, span)
                if view.requires_grad:
                    setattr(copy, GRAD_ATTR, True)
                if view.device.type != "cpu":
                    copy._modulelens_device = str(view.device)  # type: ignore[attr-defined]
                memo_key = _memo_key(view)
                try:
                    if memo_key is not None:
                        self._memo[memo_key] = (weakref.ref(view), copy)
                except TypeError:
                    pass

    def synchronize(self) -> None:
        """Wait for non-blocking device-to-host copies before anything reads them."""
        if self.pending_device_copies:
            torch.cuda.synchronize()
            self.pending_device_copies = False

    def clear(self) -> None:
        """Reuse no copy made so far (a new outermost recorded call begins, or the capture ends)."""
        self._memo.clear()

    def forget(self, tensors: list[torch.Tensor]) -> None:
        """Drop the memoised copies of ``tensors``: they were written in a way that kept their
        version counters (``p.data.add_``), so the next snapshot must copy them again."""
        for tensor in tensors:
            key = _memo_key(tensor)
            if key is not None:
                self._memo.pop(key, None)


def unwrap_functorch(tensor: torch.Tensor, *, stacked: bool = False) -> torch.Tensor:
    """The value under ``torch.func.grad``/``jvp``/``jacrev`` wrappers (the same values: they only
    track gradients). A ``vmap`` batch holds one value per batch entry, which no single tensor is: a
    ``RuntimeError`` saying so, or with ``stacked`` the entries stacked along a first dimension
    (what the tracer records of a call it records as vmapped, :func:`vmap_batch`). A tensor no
    transform wraps comes back as it is. Run torch operations on the result
    :func:`outside_functorch`: inside the transform they wrap it again."""
    while _functorch.is_functorch_wrapped_tensor(tensor):
        if _functorch.is_batchedtensor(tensor):
            if not stacked:
                raise RuntimeError("a tensor inside torch.func.vmap holds one value per batch entry")
            dim = _functorch.maybe_get_bdim(tensor)
            tensor = _functorch.get_unwrapped(tensor)
            if dim != 0:
                with outside_functorch():
                    tensor = tensor.movedim(dim, 0)
            continue
        tensor = _functorch.get_unwrapped(tensor)
    return tensor


def vmap_batch(tensors: list[object]) -> tuple[int, str, list[int]] | None:
    """``(batch size, randomness, positions)`` when a call runs inside exactly one
    ``torch.func.vmap`` (model ensembling: ``functional_call`` over ``stack_module_state``'s
    weights) and some of ``tensors`` are its batches (``positions``); else ``None``. Nested
    transforms are not recorded as a batch (their values stay ``unrecorded``)."""
    interpreter = _functorch.peek_interpreter_stack()
    if interpreter is None:
        return None
    from torch._functorch.pyfunctorch import VmapInterpreter, retrieve_current_functorch_interpreter

    current = retrieve_current_functorch_interpreter()
    if not isinstance(current, VmapInterpreter) or current.level() != 1:
        return None
    batched = [(i, t) for i, t in enumerate(tensors) if isinstance(t, torch.Tensor) and _functorch.is_batchedtensor(t)]
    if not batched:
        return None
    positions = [i for i, _ in batched]
    if any(_functorch.is_functorch_wrapped_tensor(_functorch.get_unwrapped(t)) for _, t in batched):
        return None  # a batch of a batch: nested transforms
    return current.batch_size(), current.randomness(), positions


@contextlib.contextmanager
def outside_functorch() -> Iterator[None]:
    """torch operations as outside any ``torch.func`` transform (its interpreters set aside)."""
    if _functorch.peek_interpreter_stack() is None:
        yield
        return
    from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack

    with temporarily_clear_interpreter_stack():
        yield


def _is_dense(tensor: torch.Tensor) -> bool:
    return tensor.is_contiguous() or tensor.is_contiguous(memory_format=torch.channels_last)


def _storage_key(tensor: torch.Tensor) -> tuple[str, int] | None:
    """Identity of a plain dense tensor's storage (``None`` for anything else)."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or not is_plain(tensor) or tensor.is_quantized:
        return None
    if tensor.device.type == "meta" or tensor.numel() == 0:
        return None
    try:
        return str(tensor.device), tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _extent(tensor: torch.Tensor) -> int:
    """One past the last storage element ``tensor`` reaches."""
    reach = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    return int(tensor.storage_offset()) + reach + 1  # int(): typed int | SymInt; a live tensor has an int
