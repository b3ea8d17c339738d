"""Record the backward pass of a captured call (``capture(..., record=Recording(backward=True))``).

The gradients are read off the job's own backward pass with hooks; nothing runs a second
backward. They are module-local, exactly what ``replay(backward=True)`` recomputes from the
recorded output gradients:

* **output gradients** -- the call's outputs that require grad are handed to the job as views of
  themselves, and a hook on each view sees the gradient the job sends into that output. Only the
  job's uses reach the view: when the module also uses a tensor it returns (BART returns the
  encoder's hidden state and feeds it to its decoder) the module's own use is not counted, where
  a hook on the output itself would see both (and a re-entrant ``autograd.grad`` counted it twice);
* **input gradients** -- the module receives views of its inputs that require grad
  (:func:`separate_inputs`), and a hook on each view sees what the module's backward sent into
  that input: residual uses outside the module and inputs derived from one another do not leak in;
* **parameter gradients** -- the module's own uses of a parameter are the autograd nodes created
  during the call (their sequence numbers lie between two markers taken on entry and on exit)
  that feed the parameter's gradient accumulator; a hook on each such node adds its contribution.
  Tied weights used elsewhere and other calls of the module are not counted.

The first hook queues an engine callback: when that backward pass ends, the record is complete
(a gradient that never arrived is ``None``). Later backward passes through the same graph are
ignored. The job's own gradients are untouched and no extra backward runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
from torch.autograd import Variable
from torch.autograd.graph import Node
from torch.utils.hooks import RemovableHandle

from modulelens.format.tree import deep_leaves, map_leaves
from modulelens.tracing.records import BackwardRecord, CallRecord
from modulelens.tracing.snapshot import Snapshotter


def _grad_tensors(tree: object) -> list[torch.Tensor]:
    """Distinct tensors of ``tree`` that require grad (a state object, such as a cache, is opaque:
    the job keeps its own object)."""
    seen: dict[int, torch.Tensor] = {}
    for _, leaf in deep_leaves(tree, state_objects=False):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
            seen.setdefault(id(leaf), leaf)
    return list(seen.values())


def separate_inputs(args: tuple[object, ...], kwargs: dict[str, object]) -> tuple[tuple[object, ...], dict[str, object]] | None:
    """The call's inputs with each tensor that requires grad replaced by a view of itself, so the
    module's input gradients can be taken alone: two inputs the job derived from one another
    (``gate = sigmoid(h)`` passed with ``h``) would otherwise leak gradient into each other.
    One view per tensor, however often it is passed: ``attn(x, x, x)`` must still see ``query is
    key is value`` (``nn.MultiheadAttention`` takes its packed self-attention path on that test,
    and a view per argument changed the job's outputs and gradients), and its gradient is the sum
    over the three, as in the job and in a replay passing one tensor three times.
    ``None`` when no input requires grad (the call then runs on its own inputs)."""
    if not _grad_tensors((args, kwargs)):
        return None
    views: dict[int, torch.Tensor] = {}  # (the inputs stay alive meanwhile: ids are not reused)

    def view(_path: str, value: object) -> object:
        if not (isinstance(value, torch.Tensor) and value.requires_grad):
            return value
        if id(value) not in views:
            views[id(value)] = value.view_as(value)
        return views[id(value)]

    viewed = map_leaves(view, (args, kwargs), state_objects=False)
    assert isinstance(viewed, tuple)  # map_leaves keeps the containers: (args, kwargs) again
    new_args, new_kwargs = viewed
    return tuple(new_args), dict(new_kwargs)


def sequence_marker() -> int:
    """The autograd sequence number now: every node created after this call has a larger one
    (numbers are per thread; a module's forward runs in one)."""
    with torch.enable_grad():
        marker = torch.empty(0, requires_grad=True).view(0)
    assert marker.grad_fn is not None
    return marker.grad_fn._sequence_nr()


def _parameter_uses(outputs: list[torch.Tensor], start: int, end: int,
                    params: set[int]) -> list[tuple[Node, list[tuple[int, int]]]]:
    """``(node, [(edge index, parameter id)])`` for each node of the call's own graph (created
    between the ``start`` and ``end`` markers) that feeds a gradient accumulator of ``params``."""
    uses = []
    seen: set[int] = set()
    keep: list[Node] = []  # keeps visited nodes alive so their ids stay unique during the walk
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        keep.append(node)
        if not start < node._sequence_nr() < end:
            continue  # made before the call (its inputs) or after it: not this call's graph
        edges = []
        for index, (child, _) in enumerate(node.next_functions):
            if child is None:
                continue
            variable = getattr(child, "variable", None)  # a leaf's AccumulateGrad node
            if variable is None:
                stack.append(child)
            elif id(variable) in params:
                edges.append((index, id(variable)))
        if edges:
            uses.append((node, edges))
    return uses


class _CallGradients:
    """Gradients of one recorded call as the job's backward produces them."""

    def __init__(self, call: CallRecord, module: torch.nn.Module, inputs: object, output: object, snap: Snapshotter,
                 on_done: Callable[[CallRecord, BaseException | None], None]) -> None:
        self.call, self.snap, self.on_done = call, snap, on_done
        self.inputs, self.output = inputs, output
        self.named_params = [(n, p) for n, p in module.named_parameters(remove_duplicate=False) if p.requires_grad]
        self.output_grads: dict[int, torch.Tensor] = {}
        self.input_grads: dict[int, torch.Tensor] = {}
        self.param_grads: dict[int, torch.Tensor] = {}
        self.queued = self.done = False
        self.lock = threading.Lock()

    def _arrived(self) -> bool:
        """Note that the backward reached this call; False once its record is complete."""
        if self.done:
            return False
        if not self.queued:
            self.queued = True
            Variable._execution_engine.queue_callback(self.finish)
        return True

    def on_output(self, key: int) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            with self.lock:
                if self._arrived():
                    self.output_grads[key] = self.snap.tensor(grad)
        return hook

    def on_input(self, key: int) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            with self.lock:
                if self._arrived():
                    self.input_grads[key] = self.snap.tensor(grad)
        return hook

    def on_node(self, edges: list[tuple[int, int]]) -> Callable[[tuple[torch.Tensor | None, ...], object], None]:
        def hook(grad_inputs: tuple[torch.Tensor | None, ...], _grad_outputs: object) -> None:
            with self.lock:
                if not self._arrived():
                    return
                for index, key in edges:
                    grad = grad_inputs[index]
                    if grad is not None:
                        total = self.param_grads.get(key)
                        self.param_grads[key] = grad.detach().clone() if total is None else total + grad.detach()
        return hook

    def finish(self) -> None:
        """End of the backward pass: assemble the record (fail open: never break the job)."""
        with self.lock:
            if self.done:
                return
            self.done = True
        error: BaseException | None = None
        try:
            def pick(table: dict[int, torch.Tensor]) -> Callable[[str, object], object]:
                return lambda _path, leaf: table.get(id(leaf)) if isinstance(leaf, torch.Tensor) else None

            self.call.backward = BackwardRecord(
                output_grads=map_leaves(pick(self.output_grads), self.output, state_objects=False),
                input_grads=map_leaves(pick(self.input_grads), self.inputs, state_objects=False),
                param_grads={n: (self.snap.tensor(g) if (g := self.param_grads.get(id(p))) is not None else None)
                             for n, p in self.named_params},
            )
        except Exception as caught:
            error = caught
        self.inputs = self.output = None  # release the job's tensors
        self.call.backward_pending = False
        self.on_done(self.call, error)


def watch_backward(
    call: CallRecord,
    module: torch.nn.Module,
    inputs: tuple[tuple[object, ...], dict[str, object]],
    output: object,
    start: int,
    snap: Snapshotter,
    on_done: Callable[[CallRecord, BaseException | None], None],
) -> tuple[object, list[RemovableHandle]]:
    """Hook the job's backward through ``call``, whose forward began after sequence marker
    ``start``. Returns the output to hand to the job (each output tensor that requires grad
    replaced by a view of itself) and the hook handles; ``(output, [])`` when nothing needs grad."""
    outputs = _grad_tensors(output)
    if not outputs:
        return output, []
    end = sequence_marker()
    state = _CallGradients(call, module, inputs, output, snap, on_done)
    params = {id(p) for _, p in state.named_params}
    handles = [node.register_hook(state.on_node(edges)) for node, edges in _parameter_uses(outputs, start, end, params)]
    handles += [view.register_hook(state.on_input(id(view))) for view in _grad_tensors(inputs)]
    with torch.enable_grad():
        views = {id(t): t.view_as(t) for t in outputs}
    handles += [views[key].register_hook(state.on_output(key)) for key in views]
    call.backward_pending = True

    def swap(_path: str, leaf: object) -> object:
        return views.get(id(leaf), leaf) if isinstance(leaf, torch.Tensor) else leaf

    return map_leaves(swap, output, state_objects=False), handles
