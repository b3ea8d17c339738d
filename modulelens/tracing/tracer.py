"""The tracer: forward hooks on chosen submodules that record real calls, then get out of the way.

Per target it skips ``warmup`` calls, records ``max_calls`` calls (inputs as they were on entry,
outputs, grad mode, training flag, RNG state, and the parameters/buffers whenever they changed),
and removes every hook once all targets are done, so the rest of the job pays nothing.

The tracer fails open: an error inside a hook is reported as a warning, that target is dropped
and the job continues. ``strict=True`` raises instead.
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from modulelens.errors import CaptureError, CaptureWarning, UsageError
from modulelens.format.layouts import is_plain, layout_name
from modulelens.format.library_settings import library_settings
from modulelens.format.module_state import plain_attributes
from modulelens.format.op_trace import OpRecorder, TraceLimits
from modulelens.format.shape_only import tensor_stats
from modulelens.format.tensors import layout_digest
from modulelens.format.tree import Flattened, mutable_values
from modulelens.tracing.backward import separate_inputs, sequence_marker, watch_backward
from modulelens.tracing.buffer_watch import BufferWatch
from modulelens.tracing.call_facts import InputWatch, autocast_state, rng_state, tensor_version, torchs_own_run, vmapped
from modulelens.tracing.compiled import compile_settings, one_graph_around, wrapper_of
from modulelens.tracing.distributed import (
    ShardSync,
    describe_dtensor,
    dtensor_leaves,
    full_tensor,
    is_dtensor,
    mesh_ranks,
    normalise_ranks,
    rank_and_world,
    recording_ranks,
    signature,
)
from modulelens.tracing.environment import describe_environment
from modulelens.tracing.fingerprint import LiveState, live_state
from modulelens.tracing.init_tracking import freeze_objects, get_init_record
from modulelens.tracing.lazy_modules import is_unmaterialised_lazy, uninitialised
from modulelens.tracing.methods import split_target, wrap_method
from modulelens.tracing.module_hooks import forward_hook, forward_pre_hook, move_hooks, run_eagerly
from modulelens.tracing.module_tree import constructed_class, module_tree, not_rebuilt
from modulelens.tracing.options import Recording
from modulelens.tracing.own_state import own_state, own_state_key
from modulelens.tracing.records import CallRecord, ModuleRecord, StateSnapshot
from modulelens.tracing.snapshot import Snapshotter, vmap_batch
from modulelens.tracing.targets import find_targets, matches, never_called_as_module, normalise_pattern
from modulelens.tracing.weights import (
    BlobSink,
    StreamedWeight,
    WeightWriter,
    can_stream,
    mark_written,
    settle_before_load,
    warn_after_return,
    warn_changed,
)

_SESSIONS = itertools.count()  # tracers are numbered alike on every rank (SPMD) to name gather points


@dataclass
class _Pending:
    call: CallRecord | None  # None on a rank that only takes part in gathers
    index: int
    live_inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None  # kept for backward capture
    start: int = 0  # autograd sequence number on entry (backward capture: which nodes are the call's)
    watch: InputWatch | None = None  # inputs the call may change in place
    ops: OpRecorder | None = None  # Recording(op_trace=True): records the call's aten ops until it returns
    buffers: BufferWatch | None = None  # the target's buffers on entry (which ones the call changes)


class Tracer:
    """Records calls of target submodules of ``model``; see :func:`modulelens.capture`."""

    def __init__(
        self,
        model: torch.nn.Module,
        targets: Sequence[str] | str,
        *,
        record: Recording = Recording(),
        on_complete: Callable[[Tracer], object] | None = None,
        strict: bool = False,
        on_target_complete: Callable[[Tracer, str], object] | None = None,
        blob_sink: BlobSink | None = None,
    ) -> None:
        if isinstance(targets, str):
            targets = [targets]
        if not targets:
            raise UsageError("capture needs at least one target pattern")
        self.model = model
        self.patterns = [normalise_pattern(p, model) for p in targets]
        self.warmup = record.warmup
        self.max_calls = record.max_calls
        self.on_complete = on_complete
        self.on_target_complete = on_target_complete
        self.strict = strict
        self.backward = record.backward
        # Recording(op_trace=True): the op trace of each recorded call (format/op_trace.py); None: off
        self.op_trace = TraceLimits(values_bytes=record.op_trace_values) if record.op_trace else None
        self._backward_handles: list[Any] = []
        self.records: dict[str, ModuleRecord] = {}
        self.environment = describe_environment()
        self._snap = Snapshotter()
        # Large parameters of recorded calls go straight from the live tensors into blob writers of
        # the repo the capture is saved into (tracing/weights.py); without one they are copied.
        self._weights = WeightWriter(blob_sink) if blob_sink is not None else None
        self._streamed: dict[int, StreamedWeight] = {}  # id of the placeholder in a state -> its write
        self._settle_at_return = record.settle_at_return
        self._handles: dict[str, list[Any]] = {}
        # Pending calls per target *and thread*: a forward entered on one thread is exited on that
        # thread, so pairing inputs with outputs by a per-thread stack stays right when several
        # threads call one target at once (one shared stack mispaired 27 of 30 such calls).
        self._stacks: dict[str, dict[int, list[_Pending | None]]] = {}
        self._state_keys: dict[str, tuple[Any, ...]] = {}
        self._own_state_keys: dict[str, tuple[object, ...]] = {}
        # lazy targets not materialised yet: the pre-hook that records their first call, and that call
        self._lazy_hooks: dict[str, Any] = {}
        self._deferred: dict[str, tuple[int, tuple[Any, ...], dict[str, Any]]] = {}
        self._lock = threading.RLock()
        self.finished = False
        # Distributed jobs (docs/distributed.md): which ranks record, and bounded gathers of DTensors.
        self.ranks = normalise_ranks(record.ranks)
        self.rank, self.world_size = rank_and_world()
        self._recorders = recording_ranks(self.ranks, self.world_size)
        self.recording = self.world_size <= 1 or self.rank in self._recorders
        self.sync_timeout = float(record.sync_timeout)
        self._sync = ShardSync(f"{next(_SESSIONS)}-{'|'.join(self.patterns)}", self.sync_timeout)
        self._participated: dict[str, int] = {}
        self._incidents: dict[str, list[str]] = {}
        self._whole_graphs: set[str] = set()  # targets whose hooks a fullgraph compile skipped
        self._sharding: dict[str, dict[str, dict[str, Any]]] = {}
        if self.world_size > 1 and not self._recorders:
            warnings.warn(f"modulelens: ranks={self.ranks} names no rank of a world of {self.world_size}; "
                          "nothing will be recorded", CaptureWarning, stacklevel=3)
        modules = find_targets(model, self.patterns)
        unmatched = [p for p in self.patterns if not any(matches(p, n, m) for n, m in modules.items())]
        if not modules:
            raise UsageError(f"no submodule matches the targets {self.patterns}")
        if unmatched:
            warnings.warn(f"modulelens: targets {unmatched} match no submodule", CaptureWarning, stacklevel=3)
        # torch.compile does not guard on module hooks: code compiled before the hooks existed
        # would never call them. Drop compiled code now (the model recompiles once with the hooks)
        # and again once the hooks are gone (see stop()).
        self._compiled = _reset_compiled_code(model)
        failed: dict[str, Exception] = {}
        for name, module in modules.items():
            try:
                self._attach(name, module)
            except Exception as error:  # fail open: the job runs on without this target
                if self.strict or isinstance(error, UsageError):  # (the targets name a method that is not there)
                    for attached in list(self._handles):
                        self._detach(attached)
                    raise
                failed[name] = error
        for name, reason in failed.items():  # once all are attached: a tracer left with none finishes
            self._fail(name, reason)

    # ------------------------------------------------------------------------------ hooks

    def _attach(self, name: str, module: torch.nn.Module) -> None:
        qualified, method = split_target(name)
        if self._compiled and one_graph_around(self.model, module) is not None:
            raise CaptureError(f"{name or '<root>'} runs in a torch.compile(fullgraph=True) graph: its hooks need a "
                               "graph break, which fullgraph refuses (the job's next call would stop); compile "
                               "with fullgraph=False while capturing")
        wrapper = wrapper_of(self.model, module) if self._compiled else None
        self.records[name] = ModuleRecord(
            qualified_name=qualified, module_class=constructed_class(module), construction=get_init_record(module),
            module=module, method=method, compiled=compile_settings(wrapper) if wrapper is not None else None,
        )
        self._stacks[name] = {}
        handles = self._handles[name] = []  # each as it is made: removed if a later one fails
        if method is not None:  # called as module.<method>(...): wrapped on its class (tracing/methods.py)
            handles.append(wrap_method(module, method, self._make_method_handler(name), name))
            handles.append(settle_before_load(module, self))
            return
        if self.world_size > 1:
            # Innermost: what forward itself sees (tensor parallel's hooks, added from outside, turn
            # local inputs into DTensors before it and its DTensor output into a shard after it).
            handles.append(forward_pre_hook(module, self._make_pre_hook(name), with_kwargs=True))
            handles.append(forward_hook(module, self._make_post_hook(name), with_kwargs=True, always_call=True,
                                        prepend=True))
        else:
            # Outermost: the call as the parent sees it, inputs before the module's own pre-hooks and
            # the output after its own forward hooks, since a rebuilt module registers those again in
            # its constructor and replay runs them (recorded inside them, they applied twice, issue 22).
            handles.append(forward_pre_hook(module, self._make_pre_hook(name), with_kwargs=True, prepend=True))
            handles.append(forward_hook(module, self._make_post_hook(name), with_kwargs=True, always_call=True))
        handles.append(settle_before_load(module, self))
        if is_unmaterialised_lazy(module):  # recorded after its own pre-hook infers its parameters
            self._lazy_hooks[name] = forward_pre_hook(module, self._make_lazy_hook(name), with_kwargs=True)

    def _make_pre_hook(self, name: str) -> Callable[..., None]:
        def pre_hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            try:
                return self._on_enter(name, module, args, kwargs)
            except Exception as error:  # fail open
                self._fail(name, error)
                return None
        return run_eagerly(pre_hook, lambda: self._in_whole_graph(name))

    def _in_whole_graph(self, name: str) -> None:
        """A ``torch.compile(fullgraph=True)`` made after the attach traced ``name``'s hooks: its calls
        in that graph are not recorded (tracing/module_hooks.py; one made before is refused at attach)."""
        if name not in self._whole_graphs:
            self._whole_graphs.add(name)
            warnings.warn(f"modulelens: {name or '<root>'} runs in a torch.compile(fullgraph=True) graph, where its "
                          "hooks cannot run: its calls there are not recorded; compile with fullgraph=False while "
                          "capturing", CaptureWarning, stacklevel=2)

    def _make_method_handler(self, name: str) -> Callable[..., Any]:
        """A method target's call: recorded on entry and exit exactly as forward hooks record one."""
        pre, post = self._make_pre_hook(name), self._make_post_hook(name)

        def record_method_call(module: torch.nn.Module, original: Callable[..., Any], args: tuple[Any, ...],
                               kwargs: dict[str, Any]) -> Any:
            replaced = pre(module, args, kwargs)
            if replaced is not None:  # inputs separated for backward capture
                args, kwargs = replaced
            try:
                output = original(module, *args, **kwargs)
            except BaseException:
                post(module, args, kwargs, None)  # sees the exception: the call is dropped, a later one recorded
                raise
            replacement = post(module, args, kwargs, output)
            return output if replacement is None else replacement
        return record_method_call

    def _make_post_hook(self, name: str) -> Callable[..., Any]:
        def post_hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> Any:
            try:
                return self._on_exit(name, module, output)
            except Exception as error:  # fail open
                self._fail(name, error)
                return None
        return run_eagerly(post_hook, lambda: self._in_whole_graph(name))

    def _on_enter(self, name: str, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Record the call; returns replacement ``(args, kwargs)`` only when capturing its backward."""
        with self._lock:
            record = self.records[name]
            if torchs_own_run():  # a checkpointed forward run again for its backward, a jit.trace: not the job's
                self._stack(name).append(None)
                return None
            index = record.seen_calls
            record.seen_calls += 1
            # Hooks added after ours (tensor parallel's input conversion) moved behind ours: this
            # call would be seen before them, so it is skipped (alike on every rank). Otherwise,
            # after hooks the job added since, ours stay outermost (_attach says why).
            inside = self.world_size > 1 and record.method is None
            reordered = move_hooks(module, self._handles.get(name, []), outermost=not inside) and inside
            if index < self.warmup or self._taken(name) >= self.max_calls or record.failed or reordered:
                self._stack(name).append(None)
                return None
            try:
                weights = live_state(module)  # once per call: fingerprinting reads every weight
            except ValueError:  # torch's error for a lazy module's parameters before its first call
                pending = uninitialised(module)
                if pending is None:
                    raise
                self._stack(name).append(None)
                self._defer_lazy(name, index, pending, args, kwargs)
                return None
            return self._take(name, record, module, index, args, kwargs, weights)

    def _take(self, name: str, record: ModuleRecord, module: torch.nn.Module, index: int, args: tuple[Any, ...],
              kwargs: dict[str, Any], weights: LiveState) -> Any:
        """Record call ``index`` of target ``name`` on entry (callers hold ``self._lock``)."""
        if not any(p for stacks in self._stacks.values() for p in stacks.get(threading.get_ident(), ())):
            self._snap.clear()  # outermost: the job may have written a tensor since, keeping its version
        inputs = Flattened.of((tuple(args), dict(kwargs)))  # once per call: three walkers read it
        gathered = self._gather(name, index, "inputs", inputs, weights)
        if isinstance(gathered, str):
            self._abort(name, index, "inputs", gathered)
            return None
        if not self.recording:
            self._participated[name] = self._participated.get(name, 0) + 1
            self._stack(name).append(_Pending(None, index))
            return None
        if not record.calls and not record.structure:  # state set after construction (issue 11, 22)
            self._note_structure(name, record, module)
        self._snap.gathered = gathered
        batched = vmapped(inputs, weights)  # an ensemble under torch.func.vmap: stored stacked
        self._snap.stacked = batched is not None
        try:
            copied_args, copied_kwargs = self._snap.tree(inputs)
            call = CallRecord(
                index=index,
                args=copied_args,
                kwargs=copied_kwargs,
                state_index=self._state_index(name, module, weights),
                training=module.training,
                grad_enabled=torch.is_grad_enabled(),
                autocast=autocast_state(),
                settings=library_settings(),  # gpytorch's (botorch's posterior sets them)
                vmap=batched,
            )
        finally:
            self._snap.gathered = {}
            self._snap.stacked = False
        call.rng = rng_state(inputs.leaves)
        record.calls.append(call)
        live = replacement = None
        start = 0
        if self.backward and call.grad_enabled:
            replacement = separate_inputs(tuple(args), dict(kwargs))
            live = replacement if replacement is not None else inputs.tree
            start = sequence_marker()  # after the input views: the call's own nodes come later
        values, paths = mutable_values(inputs)
        # a vmapped call's inputs are batches: torch keeps no version counter a change would show in
        watch = InputWatch(values, [tensor_version(v) for v in values], paths) if batched is None else None
        pending = _Pending(call, index, live, start, watch, buffers=BufferWatch.of(module, weights) if watch else None)
        self._stack(name).append(pending)
        if self.op_trace is not None:  # last: what the call itself runs from here on, nothing of ours
            pending.ops = OpRecorder(module, stats=tensor_stats, limits=self.op_trace)
            pending.ops.start()
        return replacement

    def _defer_lazy(self, name: str, index: int, pending: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A call that found parameters (``pending``) a lazy module has not materialised yet: they
        have no values until its own pre-hook infers their sizes. A lazy target is recorded by the
        pre-hook that runs right after its own (``_lazy_hooks``); a target with lazy submodules, which
        materialise inside forward, from its next call (a warning says so). See tracing/lazy_modules.py."""
        if name in self._lazy_hooks:
            self._deferred[name] = (index, args, kwargs)  # the inputs as the parent passed them
            return
        warnings.warn(f"modulelens: {name or '<root>'}: call {index} not recorded: lazy parameter {pending!r} is "
                      "materialised during this call; later calls are recorded", CaptureWarning, stacklevel=5)

    def _make_lazy_hook(self, name: str) -> Callable[..., Any]:
        def after_lazy_init(module: torch.nn.Module, _args: tuple[Any, ...], _kwargs: dict[str, Any]) -> Any:
            with self._lock:
                handle = self._lazy_hooks.pop(name, None)
                if handle is not None:
                    handle.remove()  # once: the module is materialised now
                deferred = self._deferred.pop(name, None)
                stack = self._stack(name)
                if deferred is None or not stack or stack[-1] is not None:
                    return None
                stack.pop()  # the placeholder of the call this records
                index, args, kwargs = deferred
                try:
                    return self._take(name, self.records[name], module, index, args, kwargs, live_state(module))
                except Exception as error:  # fail open
                    self._fail(name, error)
                    return None
        return run_eagerly(after_lazy_init, lambda: self._in_whole_graph(name))

    def _note_structure(self, name: str, record: ModuleRecord, module: torch.nn.Module) -> None:
        """At the first recorded call: plain attributes, the module tree (with the hooks a rebuild
        will not register, named in a warning), and the constructor's plain objects as they are now."""
        record.module_class = constructed_class(module)  # a lazy module's class changed at its first call
        record.tree = module_tree(module, ignore_hooks=self._hook_ids())
        own = [node for node in record.tree if node.same_as is None]  # compile wrappers are transparent here
        record.attributes = plain_attributes(module, [(node.path, node.module) for node in own])
        record.structure = {node.path: node.cls.__qualname__ for node in record.tree}
        if record.construction is not None:
            record.construction = freeze_objects(record.construction)
        missing = not_rebuilt(record.tree)
        if missing:
            shown = "; ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            warnings.warn(f"modulelens: {name or '<root>'}: hooks added after construction are not rebuilt on load, "
                          f"so replay runs without them: {shown}", CaptureWarning, stacklevel=4)

    def _hook_ids(self) -> set[int]:
        """Handle ids of this tracer's own hooks (never the job's)."""
        return {handle.id for handles in self._handles.values() for handle in handles}

    def _on_exit(self, name: str, module: torch.nn.Module, output: Any) -> Any:
        """Record the output; returns a replacement output only when capturing its backward."""
        with self._lock:
            stack = self._stack(name)
            pending = stack.pop() if stack else None
            if pending is None:
                return
            if pending.ops is not None:  # first: the output's snapshot below must not be traced
                self._keep_trace(name, pending, output)
            raised = sys.exc_info()[1]
            if output is None and raised is not None:
                # forward raised (this is the always_call path): drop the call, record a later one
                if pending.call is not None:
                    self.records[name].calls.remove(pending.call)
                else:
                    self._participated[name] -= 1
                return
            record = self.records[name]
            replacement = None
            flat_output = Flattened.of(output)  # once: the DTensor check and the snapshot both walk it
            gathered = self._gather(name, pending.index, "output", flat_output)
            if isinstance(gathered, str):
                if pending.call is not None and pending.call in record.calls:
                    record.calls.remove(pending.call)
                self._abort(name, pending.index, "output", gathered)
                return
            if pending.call is not None:
                self._snap.gathered = gathered
                vmapped = pending.call.vmap
                if vmapped is not None:  # which output leaves are batches (replay's out_dims)
                    found = vmap_batch(flat_output.leaves)
                    vmapped["output"] = flat_output.paths(tuple(found[2])) if found is not None else []
                self._snap.stacked = vmapped is not None
                try:
                    pending.call.output = self._snap.tree(flat_output)
                    pending.call.mutated_inputs = self._mutated_inputs(pending.watch)
                    if pending.buffers is not None:
                        pending.call.buffers_after = pending.buffers.copies(self._snap)
                finally:
                    self._snap.gathered = {}
                    self._snap.stacked = False
                pending.call.finished = True
                self._weights_returned(pending.call, flat_output)
                if pending.live_inputs is not None:
                    output, handles = watch_backward(pending.call, module, pending.live_inputs, output, pending.start,
                                                     self._snap, functools.partial(self._on_backward, name))
                    self._backward_handles.extend(handles)
                    replacement = output if handles else None
            if self._taken(name) >= self.max_calls and self._all_returned(name):
                self._settle_weights(whole=True)  # its load hook goes with the rest (tracing/weights.py)
                self._detach(name)  # forward hooks are done; a backward may still be pending
                self._check_complete(name)
            return replacement

    def _keep_trace(self, name: str, pending: _Pending, output: object) -> None:
        """Stop the call's op recording; keep its trace unless recording it failed (warned, fail open)."""
        assert pending.ops is not None
        trace = pending.ops.stop(output)
        if pending.ops.error is not None:
            warnings.warn(f"modulelens: {name or '<root>'}: call {pending.index}: the op trace stopped "
                          f"({pending.ops.error}); the call is recorded without it", CaptureWarning, stacklevel=4)
        elif pending.call is not None:
            pending.call.op_trace = trace

    def _all_returned(self, name: str) -> bool:
        """Whether every call of ``name`` taken so far has returned (asked once the last is taken:
        it looks at every recorded call)."""
        if self.recording:
            return all(c.finished for c in self.records[name].calls)
        return not any(self._stacks.get(name, {}).values())

    def _mutated_inputs(self, watch: InputWatch | None) -> dict[str, Any]:
        """Snapshots, after the call, of the inputs it may have changed in place (:meth:`InputWatch.changed`)."""
        if watch is None:
            return {}
        changed = watch.changed()
        if not changed:
            return {}
        paths = watch.paths()
        return {paths[i]: self._snap.tree(watch.values[i]) for i in changed}

    def _stack(self, name: str) -> list[_Pending | None]:
        """This thread's pending calls of target ``name`` (callers hold ``self._lock``)."""
        return self._stacks.setdefault(name, {}).setdefault(threading.get_ident(), [])

    def _on_backward(self, name: str, call: CallRecord, error: BaseException | None) -> None:
        if error is not None:
            warnings.warn(f"modulelens: backward of {name or '<root>'} call {call.index} not recorded: {error}",
                          CaptureWarning, stacklevel=2)
            if self.strict:
                raise error
        with self._lock:
            self._check_complete(name)

    def _check_complete(self, name: str) -> None:
        record = self.records[name]
        if name not in self._handles and not any(c.backward_pending for c in record.calls) and not record.complete:
            record.complete = self._taken(name) >= self.max_calls and not record.failed
            if record.complete and self.on_target_complete is not None:
                self._notify(self.on_target_complete, self, name)
        if not self._handles and not any(c.backward_pending for r in self.records.values() for c in r.calls):
            self._finish()

    def _state_index(self, name: str, module: torch.nn.Module, weights: LiveState) -> int:
        """Snapshot parameters and buffers (``weights``, :func:`~modulelens.tracing.fingerprint.live_state`) when they changed
        since the last recorded call (optimizer steps bump version counters), else reuse the last
        snapshot. Large parameters are streamed to the repo from the live tensors (tracing/weights.py);
        the rest is copied."""
        params, buffers, key = weights
        record = self.records[name]
        own_key = own_state_key(module)  # (torchmetrics' states change outside the weights)
        if record.states and self._state_keys.get(name) == key and self._own_state_keys.get(name) == own_key:
            return len(record.states) - 1
        self._snap.forget([t for t in (*params.values(), *buffers.values()) if t is not None])
        non_persistent = _non_persistent_buffers(module)
        extra = {}
        own_states: dict[str, dict[str, Any]] = {}
        for sub_name, sub in module.named_modules():
            if type(sub).get_extra_state is not torch.nn.Module.get_extra_state:
                extra[f"{sub_name}._extra_state" if sub_name else "_extra_state"] = sub.get_extra_state()
            custom = own_state(sub)
            if custom:
                own_states[sub_name] = self._snap.tree(custom)
        # A sparse or nested buffer that is not persistent is the constructor's to make (openai-whisper's
        # alignment_heads): not stored, its digest checked on load; refusing it dropped the whole capture.
        rebuilt = {n: {"layout": layout_name(b), "digest": layout_digest(b)} for n, b in buffers.items()
                   if b is not None and n in non_persistent and not is_plain(b)}
        record.states.append(StateSnapshot(
            parameters=self._parameters(params, key[1] if len(key) > 1 else ()),
            requires_grad={n: p.requires_grad for n, p in params.items()},
            buffers={n: self._snap.tensor(b) for n, b in buffers.items() if b is not None and n not in rebuilt},
            persistent={n: n not in non_persistent for n in buffers},
            extra_state=extra,
            module_state=own_states,
            rebuilt_buffers=rebuilt,
        ))
        self._state_keys[name], self._own_state_keys[name] = key, own_key
        return len(record.states) - 1

    def _parameters(self, params: dict[str, torch.Tensor], fingerprints: Sequence[Any]) -> dict[str, torch.Tensor]:
        """A state's parameters: large ones streamed (a placeholder each: the live tensor's alias,
        swapped for a map of its written file by :meth:`synchronize`), the others copied. A
        parameter shared under several names stays one tensor."""
        prints = dict(zip(params, fingerprints, strict=False))
        by_id: dict[int, str] = {}
        wanted: dict[str, tuple[torch.Tensor, int | None]] = {}
        if self._weights is not None and not self._snap.stacked:  # a vmap batch is copied, stacked
            for param_name, param in params.items():
                if id(param) not in by_id and id(param) not in self._snap.gathered and can_stream(param):
                    by_id[id(param)] = param_name
                    wanted[param_name] = (param, prints.get(param_name))
        streamed = self._weights.start(wanted) if wanted and self._weights is not None else {}
        for job in streamed.values():
            self._streamed[id(job.alias)] = job
        return {n: streamed[by_id[id(p)]].alias if by_id.get(id(p)) in streamed else self._snap.tensor(p)
                for n, p in params.items()}

    def _weights_returned(self, call: CallRecord, output: Flattened) -> None:
        """A recorded call returned: the writes of its large weights go on until the job may change
        them, or are settled now (:meth:`WeightWriter.returned`; a distributed job's wrappers may
        free a weight's storage once the call returns)."""
        at_return = self._settle_at_return or self.world_size > 1 or self._compiled or call.vmap is not None
        if self._weights is not None and self._weights.returned(self, output.leaves, at_return=at_return):
            self._settle_weights()

    def settle_weights(self, *, whole: bool = False) -> None:
        """Finish reading recorded large weights from the live tensors now (the rest is copied;
        ``whole``: nothing is, every write reads to its end): called before anything may change the
        weights (tracing/weights.py). Never raises."""
        try:
            with self._lock:
                self._settle_weights(whole=whole)
        except Exception as error:  # fail open
            if self.strict:
                raise
            warnings.warn(f"modulelens: settling recorded weights failed: {error}", CaptureWarning, stacklevel=2)

    def _settle_weights(self, *, whole: bool = False) -> None:
        """Bound what is left to read from the live weights (tracing/weights.py); a weight whose
        write failed is copied now, while it is unchanged."""
        if self._weights is None or not self._streamed:
            return
        for job in self._weights.settle(whole=whole):
            self._replace_streamed(job, self._snap.tensor(job.alias) if job.alias is not None else None)
            warnings.warn(f"modulelens: writing parameter {job.name} failed ({job.error}); copied instead",
                          CaptureWarning, stacklevel=3)

    def _replace_streamed(self, job: StreamedWeight, tensor: torch.Tensor | None) -> None:
        """Put ``tensor`` in every state where ``job``'s placeholder is."""
        placeholder = job.alias
        self._streamed.pop(id(placeholder), None)
        for qualified, record in self.records.items():
            for state in record.states:
                for param_name, value in list(state.parameters.items()):
                    if value is placeholder:
                        if tensor is None:
                            del state.parameters[param_name]
                            record.failed = record.failed or f"parameter {param_name} could not be recorded: {job.error}"
                        else:
                            state.parameters[param_name] = tensor
                        if job.changed and tensor is not None:
                            warn_changed(qualified, job)
        job.alias = None  # type: ignore[assignment]  # the live storage is not held any longer

    def _taken(self, name: str) -> int:
        """Calls recorded (or, on a rank that does not record, taken part in) so far."""
        return len(self.records[name].calls) if self.recording else self._participated.get(name, 0)

    def _gather(self, name: str, index: int, phase: str, tree: Any,
                weights: LiveState | None = None) -> dict[int, torch.Tensor] | str:
        """Full tensors of the DTensors this call records (inputs or output, and the module's state
        when it changed), keyed by ``id``: gathered on every rank of their meshes once those ranks
        agreed to. ``{}`` when nothing is sharded; a reason (str) when the ranks did not agree."""
        leaves = dtensor_leaves(tree)
        state_key = None
        if weights is not None:
            params, buffers, state_key = weights
            if self._state_keys.get(name) != state_key:
                seen = {id(t) for _, t in leaves}
                for state_name, tensor in (*params.items(), *buffers.items()):
                    if is_dtensor(tensor) and id(tensor) not in seen:
                        seen.add(id(tensor))
                        leaves.append((f"state:{state_name}", tensor))
            if not self.recording:  # the recording rank updates it when it snapshots the state
                self._state_keys[name] = state_key
        if not leaves:
            return {}
        group = sorted({r for _, t in leaves for r in mesh_ranks(t)})
        if not self._recorders.intersection(group):
            return {}  # no rank on these meshes records: nobody gathers
        if len(group) > 1:
            reason = self._sync.agree(f"{name or '<root>'}/{index}/{phase}", name, group,
                                      signature(t for _, t in leaves))
            if reason is not None:
                return reason
        if self.recording:
            notes = self._sharding.setdefault(name, {})
            for path, tensor in leaves:
                if path.startswith("state:"):
                    notes.setdefault("parameters", {})[path[len("state:"):]] = describe_dtensor(tensor)
                else:
                    notes.setdefault(phase, {})[f"call{index}.{phase}{path}"] = describe_dtensor(tensor)
        return {id(t): full_tensor(t) for _, t in leaves}

    def _abort(self, name: str, index: int, phase: str, reason: str) -> None:
        """The ranks did not agree on a gather: drop the target here (alike on the other ranks)."""
        message = f"call {index} ({phase}): {reason}"
        self._incidents.setdefault(name, []).append(message)
        self._detach(name)
        self._stacks[name] = {}
        warnings.warn(f"modulelens: rank {self.rank}: capture of {name or '<root>'} stopped incomplete, "
                      f"the job goes on: {message}", CaptureWarning, stacklevel=2)
        if not self._handles:
            self._finish()
        if self.strict:
            raise CaptureError(f"capture of {name or '<root>'} is incomplete: {message}")

    def _detach(self, name: str) -> None:
        for handle in self._handles.pop(name, []):
            handle.remove()
        # a call still running loses its forward hook: its op recording ends here, not never
        for stack in self._stacks.get(name, {}).values():
            for pending in reversed(stack):
                if pending is not None and pending.ops is not None:
                    pending.ops.stop()
                    pending.ops = None
        lazy = self._lazy_hooks.pop(name, None)
        if lazy is not None:
            lazy.remove()

    def _fail(self, name: str, error: Exception) -> None:
        if self.world_size > 1:  # the other ranks stop waiting for this one at this target's gathers
            self._sync.mark_dropped(name, f"{type(error).__name__}: {error}")
        if self.strict:
            raise error
        with self._lock:
            record = self.records.get(name)
            if record is not None:
                record.failed = f"{type(error).__name__}: {error}"
            self._detach(name)
            self._stacks[name] = {}
        warnings.warn(f"modulelens: capture of {name or '<root>'} failed and was dropped: {error}", CaptureWarning, stacklevel=2)
        if not self._handles:
            self._finish()

    def _finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        self._snap.synchronize()
        self._snap.clear()
        self._backward_handles.clear()
        if self.on_complete is not None:
            self._notify(self.on_complete, self)

    def _notify(self, callback: Callable[..., object], *args: object) -> None:
        try:
            callback(*args)
        except Exception as error:
            if self.strict:
                raise
            warnings.warn(f"modulelens: {getattr(callback, '__name__', 'callback')} failed: {error}", CaptureWarning,
                          stacklevel=3)

    # ------------------------------------------------------------------------------ public

    def record_call_in_progress(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Record a call of target ``module`` that started before this tracer attached.

        torch collects a call's forward pre-hooks before running them, so a tracer attached from a
        global pre-hook (``modulelens run``) misses the root's own first call; its post-hook, looked
        up after ``forward``, does run and completes the record started here.
        """
        for name, record in self.records.items():
            if record.module is module and record.method is None and name in self._handles:
                self._make_pre_hook(name)(module, args, kwargs)

    @property
    def complete(self) -> bool:
        return all(r.complete for r in self.records.values())

    @property
    def active_hooks(self) -> int:
        return sum(len(h) for h in self._handles.values())

    def stop(self) -> None:
        """Remove every hook now (captured calls are kept); waits until weights still being
        written have read the live tensors to their end (the job goes on and may change them;
        nothing is copied, tracing/weights.py)."""
        self.settle_weights(whole=True)
        for name in list(self._handles):
            self._detach(name)
        for handle in self._backward_handles:
            handle.remove()
        self._backward_handles.clear()
        self._snap.synchronize()
        self._snap.clear()
        if self._compiled:
            self._compiled = not _reset_compiled_code(self.model)

    def synchronize(self) -> None:
        """Wait for pending device-to-host copies and weight writes of recorded tensors (each
        streamed weight becomes a read-only map of its written file)."""
        self._snap.synchronize()
        if self._weights is None:
            return
        with self._lock:
            for job in self._weights.finish():
                if job.alias is None:
                    continue  # replaced already
                written = None
                if job.after_return:  # what was written is not what the call saw: left out, never stored
                    warn_after_return(job)
                    self._replace_streamed(job, None)
                    continue
                if job.payload is not None:
                    try:
                        written = mark_written(job.alias, job.payload)
                    except (OSError, RuntimeError) as error:  # its file is gone (the repo's tmp/ removed by hand)
                        job.error, job.payload = error, None
                if written is not None:
                    self._replace_streamed(job, written)
                else:
                    warnings.warn(f"modulelens: parameter {job.name} could not be written ({job.error}); "
                                  "not recorded", CaptureWarning, stacklevel=2)
                    self._replace_streamed(job, None)

    def why_not_recorded(self, key: str) -> str:
        """Why target ``key`` recorded no call, as it happened: its capture failed, it was never
        called the way the tracer listens (``module(...)`` for a module target, the method for a
        method target), or every call it got was skipped as warm-up."""
        record = self.records[key]
        label = key or "<root>"
        if record.failed:
            return f"{label}: capture failed: {record.failed}"
        incidents = self.incidents(key)
        if incidents:
            return f"{label}: recorded no complete call ({incidents[-1]})"
        cls = type(record.module).__qualname__ if record.module is not None else record.module_class.__qualname__
        if record.seen_calls and record.seen_calls <= self.warmup:
            return (f"{label} ({cls}) was called {record.seen_calls} time(s), all skipped as warm-up "
                    f"(warmup={self.warmup})")
        if record.seen_calls:
            return f"{label} ({cls}) finished none of its {record.seen_calls} call(s) (each raised)"
        if key in self._whole_graphs:
            return (f"{label} ({cls}) ran only in a torch.compile(fullgraph=True) graph, where its hooks cannot run; "
                    "compile with fullgraph=False while capturing")
        if record.method is not None:
            return f"{label}: {cls}.{record.method}() was never called on this module while capture was on"
        return f"{label} ({cls}) {never_called_as_module(record.qualified_name, record.module)}"

    def incidents(self, qualified: str) -> list[str]:
        """Problems met while recording ``qualified`` (gather timeouts, failed copies...)."""
        return list(self._incidents.get(qualified, []))

    def sharding(self, qualified: str) -> dict[str, dict[str, Any]]:
        """How each gathered DTensor of ``qualified`` was sharded in the job."""
        return self._sharding.get(qualified, {})


def _reset_compiled_code(model: torch.nn.Module) -> bool:
    """Reset torch.compile's caches if ``model`` holds a compiled module; True if it did."""
    compiled = any(type(m).__name__ == "OptimizedModule" or getattr(m, "_compiled_call_impl", None) is not None
                   for m in (model, *model.modules()))
    dynamo = sys.modules.get("torch._dynamo")
    if not compiled or dynamo is None:
        return False
    dynamo.reset()
    return True


def _non_persistent_buffers(module: torch.nn.Module) -> set[str]:
    names = set()
    for prefix, sub in module.named_modules():
        for buffer_name in getattr(sub, "_non_persistent_buffers_set", ()):
            names.add(f"{prefix}.{buffer_name}" if prefix else buffer_name)
    return names
