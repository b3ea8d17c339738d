"""Which recorded calls make a kernel problem, and how they bind to ``forward``'s parameters.

Export and verification both take their samples from here: :func:`select_calls` picks finished
calls (for an export, only those sharing the first call's weights and training flag: a problem has
one set of weights), and :func:`bind_calls` turns each call's ``args``/``kwargs`` into one
positional list of equal length (keyword arguments bound with ``inspect.signature``, skipped
optional parameters filled with their defaults, keyword-only parameters last).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from modulelens.errors import KernelError
from modulelens.format.spec import Construction
from modulelens.format.values import Unrecorded
from modulelens.restore.loader import Capture

MAX_CALLS = 8


@dataclass
class CallBinding:
    """Recorded calls as positional argument lists (keyword arguments bound by ``inspect.signature``).

    The last ``len(kw_names)`` slots are keyword-only parameters (the exported ``Model.forward``
    takes them by position and passes them on by keyword)."""

    positions: list[int]
    positional: dict[int, list[Any]]
    names: list[str]
    kw_names: list[str]
    weight_names: list[str]
    init_inputs: list[Any]
    defaults_used: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def select_calls(capture: Capture, calls: Sequence[int] | None = None, max_calls: int = MAX_CALLS,
                 *, same_state: bool = True, left_out: list[dict[str, object]] | None = None) -> list[int]:
    """Positions in ``capture.calls`` to use: finished calls, at most ``max_calls``.

    Args:
        capture: the loaded capture.
        calls: positions to consider (default: all).
        max_calls: the most positions returned.
        same_state: keep only calls recorded with the first kept call's weights and training flag.
        left_out: when given, every skipped call is appended with its reason.

    Returns:
        The chosen positions, in order.

    Raises:
        ModulelensError: no recorded calls, a position out of range, or no usable call; calls that
            are no module's forward (a method capture, ``vae:encode``; an ensemble's calls inside
            ``torch.func.vmap``): a kernel problem is one module's forward.

    Example::

        select_calls(cap, max_calls=2)   # [0, 1]
    """
    if not capture.calls:
        raise KernelError(f"{capture.ref} has no recorded calls")
    if capture.method not in (None, "forward"):  # docs/fidelity.md, "Method entry points"
        raise KernelError(f"{capture.ref} recorded calls of {capture.method}(), not of forward: a kernel problem is "
                          "a module's forward; capture the module itself")
    if any(call.vmap for call in capture.calls):
        raise KernelError(f"{capture.ref}: its calls ran inside torch.func.vmap (an ensemble of stacked weights); "
                          "a kernel problem is one module's forward")
    wanted = list(range(len(capture.calls))) if calls is None else list(calls)
    for position in wanted:
        if not 0 <= position < len(capture.calls):
            raise KernelError(f"{capture.ref} has no call at position {position} ({len(capture.calls)} recorded)")
    chosen: list[int] = []
    for position in wanted:
        call = capture.calls[position]
        reason = _skip_reason(capture, chosen, position, max_calls, same_state)
        if reason is None:
            chosen.append(position)
        elif left_out is not None:
            left_out.append({"index": call.index, "position": position, "reason": reason})
    if not chosen:
        raise KernelError(f"{capture.ref}: no usable recorded call (every call raised in the original job)")
    return chosen


def _skip_reason(capture: Capture, chosen: list[int], position: int, max_calls: int, same_state: bool) -> str | None:
    call = capture.calls[position]
    if not call.finished:
        return "the recorded call raised in the original job"
    if same_state and chosen:
        first = capture.calls[chosen[0]]
        if call.state_index != first.state_index:
            return f"recorded with other weights (state {call.state_index}, not {first.state_index})"
        if call.training != first.training:
            return "recorded in another training mode"
    if len(chosen) >= max_calls:
        return f"more than {max_calls} calls"
    return None


def forward_parameters(cls: type[torch.nn.Module]) -> list[inspect.Parameter]:
    """The parameters of ``cls.forward`` without ``self``."""
    try:
        signature = inspect.signature(cls.forward)
    except (TypeError, ValueError) as error:
        raise KernelError(f"cannot read the signature of {cls.__qualname__}.forward: {error}") from None
    params = list(signature.parameters.values())
    return params[1:] if params and params[0].name == "self" else params


def check_recorded(value: object, where: str) -> None:
    """Refuse values that were not recorded (``<unrecorded>`` placeholders)."""
    for leaf in pytree.tree_leaves(value):
        if isinstance(leaf, Unrecorded):
            raise KernelError(f"{where} was not recorded ({leaf.type_name}); it cannot be exported or replayed")


@dataclass
class _Layout:
    """The shape every bound call takes: positional parameters used, ``*args`` count, keywords."""

    params: list[inspect.Parameter]
    positional: list[inspect.Parameter]
    var_positional: inspect.Parameter | None
    var_keyword: inspect.Parameter | None
    used: int
    var_count: int
    kw_names: list[str]

    @property
    def names(self) -> list[str]:
        names = [p.name for p in self.positional[:self.used]]
        if self.var_positional is not None:
            names += [f"{self.var_positional.name}_{i}" for i in range(self.var_count)]
        return names + self.kw_names


def bind_calls(capture: Capture, positions: Sequence[int]) -> CallBinding:
    """Bind each selected call's ``args``/``kwargs`` to one positional list of equal length.

    Raises:
        ModulelensError: a call does not fit ``forward``'s signature, the calls pass different
            ``*args`` counts or keyword sets, or an input was not recorded.

    Example::

        binding = bind_calls(cap, [0, 1])
        binding.names, binding.positional[0]   # (["x", "mask"], [tensor, tensor])
    """
    cls = capture.module_type
    params = forward_parameters(cls)
    signature = inspect.Signature(params)
    bound_calls = {}
    for position in positions:
        call = capture.calls[position]
        args, kwargs = call.inputs
        check_recorded((args, kwargs), f"an input of call {call.index}")
        try:
            bound_calls[position] = signature.bind(*args, **kwargs).arguments
        except TypeError as error:
            raise KernelError(f"call {call.index} does not fit {cls.__qualname__}.forward{signature}: {error}") from None
    layout = _layout(params, list(bound_calls.values()))
    binding = CallBinding(positions=list(positions), positional={}, names=layout.names, kw_names=layout.kw_names,
                          weight_names=state_names(capture), init_inputs=init_inputs(capture))
    for position, arguments in bound_calls.items():
        binding.positional[position] = _positional_values(layout, arguments, capture.calls[position].index, binding)
    return binding


def _layout(params: list[inspect.Parameter], bound: list[dict[str, Any]]) -> _Layout:
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_positional = next((p for p in params if p.kind == p.VAR_POSITIONAL), None)
    used = 0
    var_counts = set()
    kw_names: list[str] = []
    for arguments in bound:
        for i, p in enumerate(positional):
            if p.name in arguments:
                used = max(used, i + 1)
        var_counts.add(len(arguments.get(var_positional.name, ())) if var_positional else 0)
        for p in params:
            if p.kind == p.KEYWORD_ONLY and p.name in arguments and p.name not in kw_names:
                kw_names.append(p.name)
            if p.kind == p.VAR_KEYWORD:
                kw_names.extend(k for k in arguments.get(p.name, {}) if k not in kw_names)
    if len(var_counts) > 1:
        raise KernelError(f"the recorded calls pass different numbers of *{var_positional.name} "  # type: ignore[union-attr]
                              "arguments; export them one at a time (--calls)")
    var_count = var_counts.pop()
    if var_count:
        used = len(positional)
    order = {p.name: i for i, p in enumerate(params)}
    kw_names.sort(key=lambda n: order.get(n, len(params)))
    return _Layout(params, positional, var_positional, next((p for p in params if p.kind == p.VAR_KEYWORD), None),
                   used, var_count, kw_names)


def _positional_values(layout: _Layout, arguments: dict[str, Any], index: int, binding: CallBinding) -> list[Any]:
    by_name = {p.name: p for p in layout.params}
    values = [_argument_or_default(arguments, p, index, binding) for p in layout.positional[:layout.used]]
    if layout.var_positional is not None:
        values.extend(arguments.get(layout.var_positional.name, ()))
    for name in layout.kw_names:
        p = by_name.get(name)
        if p is not None and p.kind == p.KEYWORD_ONLY:
            values.append(_argument_or_default(arguments, p, index, binding))
            continue
        extra = arguments.get(layout.var_keyword.name, {}) if layout.var_keyword else {}
        if name not in extra:
            raise KernelError(f"call {index} does not pass keyword {name!r} that other recorded calls pass; "
                                  "export the calls separately (--calls)")
        values.append(extra[name])
    return values


def _argument_or_default(arguments: Mapping[str, object], p: inspect.Parameter, index: int, binding: CallBinding) -> object:
    if p.name in arguments:
        return arguments[p.name]
    if p.default is inspect.Parameter.empty:
        raise KernelError(f"call {index} has no value for {p.name!r}")
    binding.defaults_used[p.name] = p.default
    return p.default


def state_names(capture: Capture) -> list[str]:
    """Parameter then buffer names of the first recorded state (the ``kernel_function`` order)."""
    states = capture.metadata.get("states", [])
    if not states:
        return []
    return list(states[0]["parameters"]) + list(states[0]["buffers"])


def init_inputs(capture: Capture) -> list[object]:
    """The recorded positional constructor arguments when they are plain values (numbers, strings,
    tuples/lists of them; no tensors, modules or objects), else ``[]``."""
    construction = construction_record(capture)
    if construction is None or not _plain(construction["args"]):
        return []
    # read from the record itself: decoding every constructor argument (Capture.init_arguments)
    # would build the keyword arguments too, which a problem file writes out instead
    return [_plain_value(a) for a in construction["args"]]


def construction_record(capture: Capture) -> Construction | None:
    """The recorded constructor entry (typed JSON: ``class``, ``args``, ``kwargs``) of the captured module."""
    mid = capture.metadata["module"].get("construction")
    return capture.metadata.get("constructions", {}).get(mid) if mid else None


def _plain_value(data: object) -> object:
    """A recorded plain value (see :func:`_plain`) as Python: tuples are ``{"$type": "tuple"}``."""
    if isinstance(data, list):
        return [_plain_value(v) for v in data]
    if isinstance(data, dict):
        return tuple(_plain_value(v) for v in data["items"])
    return data


def _plain(values: object) -> bool:
    if values is None or isinstance(values, (bool, int, str)):
        return True
    if isinstance(values, float):
        return math.isfinite(values)
    if isinstance(values, list):
        return all(_plain(v) for v in values)
    if isinstance(values, dict) and values.get("$type") == "tuple":
        return all(_plain(v) for v in values["items"])
    return False
