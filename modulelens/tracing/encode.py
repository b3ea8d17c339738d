"""Turn an in-memory :class:`ModuleRecord` into capture metadata (JSON) plus payloads."""

from __future__ import annotations

import itertools
import json
import time
import warnings
from collections.abc import Mapping
from typing import Any, cast

import torch

from modulelens.errors import CaptureWarning, UnsupportedValueError
from modulelens.format.layouts import is_wrapper_subclass, subclass_parts
from modulelens.format.shape_only import tensor_stats
from modulelens.format.spec import (
    FORMAT_NAME,
    FORMAT_VERSION,
    METHODLESS_VERSION,
    BackwardEntry,
    CallEntry,
    CaptureMetadata,
    Construction,
    HookEntry,
    ModuleInfo,
    StateEntry,
    TensorEntry,
    TreeEntry,
)
from modulelens.format.tensors import check_storable, dtype_name, quantization, tensor_bytes
from modulelens.format.tree import encode_tree
from modulelens.format.values import EncodeContext, encode_value, import_path
from modulelens.repo.store import WrittenPayload
from modulelens.tracing.budget import plan_shape_only
from modulelens.tracing.graph_modules import graph_module_construction, is_graph_module
from modulelens.tracing.init_tracking import InitRecord, constructed_as, construction_missing, get_init_record
from modulelens.tracing.lazy_modules import is_lazy_class, materialised_arguments
from modulelens.tracing.module_tree import TreeNode, constructed_class
from modulelens.tracing.options import PayloadPolicy
from modulelens.tracing.records import CallRecord, ModuleRecord, StateSnapshot
from modulelens.tracing.snapshot import ADDRESS_ATTR, BASE_ATTR, GRAD_ATTR
from modulelens.tracing.source import collect_sources
from modulelens.tracing.weights import written_payload


def class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def class_path_of(cls: type, path: str) -> str:
    """``cls``'s import path, checked to import back (an :class:`UnsupportedValueError` naming ``path``)."""
    try:
        return import_path(cls)
    except UnsupportedValueError as error:
        raise UnsupportedValueError(f"{path}: {error}") from None


class TensorTable:
    """Tensors of one capture: each distinct tensor object gets an id.

    Three kinds of entry: a payload (``"payload"``: its content hash, filled in by the repo when it
    stores the bytes, which are in ``payloads`` under the tensor id; identical contents share one
    blob); a view into another entry's payload (``"view_of"``, ``"storage_offset"``: views of one
    storage are stored once); and a shape-only record (``"shape_only": true`` with ``"stats"``, no
    payload) for the units in ``shape_only`` (ids of tensors or of the shared span behind views).
    """

    def __init__(self, shape_only: set[int] | None = None) -> None:
        # plain dicts: an entry gains its keys step by step (format/validate.py checks the document on load)
        self.entries: dict[str, dict[str, Any]] = {}
        self.payloads: dict[str, memoryview | WrittenPayload] = {}  # tensor id -> bytes (or their file)
        self.shape_only_paths: list[str] = []
        self._shape_only = shape_only or set()
        self._ids: dict[int, str] = {}
        self._keepalive: list[torch.Tensor] = []

    def add(self, tensor: torch.Tensor, path: str) -> str:
        existing = self._ids.get(id(tensor))
        if existing is not None:
            return existing
        if is_wrapper_subclass(tensor):
            return self._add_subclass(tensor, path)
        check_storable(tensor, path)
        base = getattr(tensor, BASE_ATTR, None)
        entry: dict[str, Any] = {
            "dtype": dtype_name(tensor.dtype),
            "shape": list(tensor.shape),
            "stride": list(tensor.stride()),
            "device": str(getattr(tensor, "_modulelens_device", tensor.device)),
        }
        if tensor.is_quantized:
            entry["quantized"] = quantization(tensor, self.add, path)
        if getattr(tensor, GRAD_ATTR, False):
            entry["requires_grad"] = True
        if id(base if base is not None else tensor) in self._shape_only:
            entry.update(shape_only=True, stats=tensor_stats(tensor), nbytes=0)
            self.shape_only_paths.append(path)
        elif base is not None:
            entry.update(view_of=self.add(base, f"{path}<storage>"),
                         storage_offset=tensor.storage_offset() - base.storage_offset(), nbytes=0)
        tid = f"t{len(self.entries)}"
        written = written_payload(tensor) if "nbytes" not in entry else None
        if written is not None and not written.path.exists():
            written = None  # the repo it was saved into is gone: the bytes are still mapped here
        if written is not None:  # a streamed weight: its file is moved in, not read again (tracing/weights.py)
            self.payloads[tid] = written
            entry.update(payload=None, nbytes=written.nbytes)
        elif "nbytes" not in entry:
            data = tensor_bytes(tensor)
            self.payloads[tid] = data
            entry.update(payload=None, nbytes=len(data))  # payload: content hash, set by Repo.save_version
        if "payload" in entry and (offset := getattr(tensor, ADDRESS_ATTR, 0)):
            entry["address_offset"] = offset  # the job's address past a 64-byte boundary (kernels round by it)
        self.entries[tid] = entry
        self._ids[id(tensor)] = tid
        self._keepalive.append(tensor)
        return tid

    def _add_subclass(self, tensor: torch.Tensor, path: str) -> str:
        """A wrapper tensor subclass (torchao's quantized weights) as a ``subclass`` entry: its
        inner tensors as entries of their own, its context as an encoded value (format/layouts.py)."""
        parts, context = subclass_parts(tensor)
        entry: dict[str, Any] = {
            "dtype": dtype_name(tensor.dtype), "shape": list(tensor.shape), "stride": list(tensor.stride()),
            "device": str(getattr(tensor, "_modulelens_device", tensor.device)), "nbytes": 0,
            "subclass": {"class": class_path_of(type(tensor), path),
                         "parts": {name: self.add(part, f"{path}.{name}") for name, part in parts.items()},
                         "context": encode_value(context, EncodeContext(add_tensor=self.add), f"{path}<context>")},
        }
        tid = f"t{len(self.entries)}"
        self.entries[tid] = entry
        self._ids[id(tensor)] = tid
        self._keepalive.append(tensor)
        return tid

    def add_text(self, text: str) -> str:
        """A UTF-8 text (a source file) as a 1-D ``uint8`` entry: its payload is a content-addressed
        blob like any tensor's, so a file shared by many captures is stored once."""
        data = text.encode("utf-8")
        tid = f"t{len(self.entries)}"
        self.entries[tid] = {"dtype": "uint8", "shape": [len(data)], "stride": [1], "device": "cpu",
                             "payload": None, "nbytes": len(data)}
        self.payloads[tid] = memoryview(data)
        return tid


class ConstructionTable:
    """Constructor records of the target and of every module passed to a constructor."""

    def __init__(self, tensors: TensorTable, *, by_attributes: bool = True) -> None:
        self.by_attributes = by_attributes  # a module whose arguments cannot be stored is recorded by its attributes
        self.entries: dict[str, dict[str, Any]] = {}
        self.classes: list[type] = []
        self.tensors = tensors
        self._ids: dict[int, str] = {}
        self._numbers = itertools.count()
        # one context for every record: a config shared by many submodules is encoded once
        self._context = EncodeContext(add_tensor=tensors.add, add_module=self.add, memo={})

    def add(self, module: torch.nn.Module, path: str) -> str:
        existing = self._ids.get(id(module))
        if existing is not None:
            return existing
        # the user's class, not FSDP2's FSDP<Cls> or a Parametrized<Cls>
        return self.add_module_record(module, constructed_class(module), get_init_record(module), path)

    def add_module_record(self, module: torch.nn.Module, cls: type, record: InitRecord | None, path: str) -> str:
        """``module``'s construction record: its recorded construction, or, when one of its recorded
        arguments cannot be stored (a closure), its attributes (:meth:`add_state_record`)."""
        cls, args, kwargs = construction_of(module, cls, record, path)
        try:
            return self.add_record(cls, args, kwargs, path, key=id(module))
        except UnsupportedValueError as error:
            if record is None or is_graph_module(module) or not self.by_attributes:
                raise
            try:
                return self.add_state_record(module, cls, path, why=str(error))
            except UnsupportedValueError:
                raise error from None  # the argument is the first thing the user can change

    def add_state_record(self, module: torch.nn.Module, cls: type, path: str, why: str) -> str:
        """A construction record that rebuilds ``module`` from its attributes rather than its
        constructor: ``cls.__new__`` and ``nn.Module.__init__``, every attribute of its own (through
        the codecs), its own parameters and buffers by name (their values come with the state) and
        its children from their own records (the tree). For a module whose recorded arguments
        cannot be stored: timm's NFNet blocks take ``act_layer``, a function made inside another."""
        state = {name: value for name, value in vars(module).items()
                 if name not in _MODULE_INTERNALS and not name.startswith("_modulelens")}
        mid = f"m{next(self._numbers)}"
        self._ids[id(module)] = mid
        self.entries[mid] = {}
        try:
            encoded = encode_value(state, self._context, f"{path}<attributes>")
        except BaseException:
            self.entries.pop(mid, None)
            self._ids.pop(id(module), None)
            raise
        self.entries[mid] = {
            "class": class_path(cls), "args": [], "kwargs": {}, "state": encoded, "why": why,
            "parameters": [name for name, p in module._parameters.items() if p is not None],
            "buffers": {name: name not in module._non_persistent_buffers_set
                        for name, b in module._buffers.items() if b is not None}}
        self.classes.append(cls)
        return mid

    def add_record(self, cls: type, args: tuple[object, ...], kwargs: Mapping[str, object], path: str, key: int) -> str:
        ctx = self._context
        mid = f"m{next(self._numbers)}"  # not len(entries): a failed record is removed, its nested ones stay
        self._ids[key] = mid
        self.entries[mid] = {}  # reserve the id (a module cannot contain itself, but stay safe)
        try:
            entry = {
                "class": class_path(cls),
                "args": [encode_value(a, ctx, f"{path}args[{i}]") for i, a in enumerate(args)],
                "kwargs": {k: encode_value(v, ctx, f"{path}kwargs[{k!r}]") for k, v in kwargs.items()},
            }
        except BaseException:
            # pop, not del: a nested record of the same module may have gone first, and a KeyError
            # here hid the real error (a capture warning said only "failed: 139710831342416")
            self.entries.pop(mid, None)
            self._ids.pop(key, None)
            raise
        self.entries[mid] = entry
        self.classes.append(cls)
        return mid


def construction_of(module: torch.nn.Module, cls: type, record: InitRecord | None,
                    path: str) -> tuple[type, tuple[object, ...], dict[str, object]]:
    """``(class, args, kwargs)`` that rebuild ``module``: a GraphModule's graph and what it uses
    (tracing/graph_modules.py), or its recorded construction as :func:`construction_arguments` gives it."""
    if is_graph_module(module):
        return graph_module_construction(module, cls)
    if record is None:
        raise UnsupportedValueError(f"{path}: the constructor arguments of {type(module).__qualname__} are unknown: "
                                    f"{construction_missing(module)}")
    args, kwargs = construction_arguments(module, cls, record, path)
    return cls, args, kwargs


def construction_arguments(module: torch.nn.Module, cls: type, record: InitRecord,
                           path: str) -> tuple[tuple[object, ...], dict[str, object]]:
    """The arguments that build ``module`` as ``cls``: its recorded ones, or for a lazy module that
    became ``cls`` at its first call, the non-lazy class's (``tracing/lazy_modules.py``)."""
    built = constructed_as(module)
    if built is None or built is cls or not is_lazy_class(built):
        return record.args, record.kwargs
    try:
        return materialised_arguments(built, cls, module, record.args, record.kwargs)
    except UnsupportedValueError as error:
        raise UnsupportedValueError(f"{path}{error}") from None


# what torch.nn.Module.__init__ sets on every module (and the training flag): not a module's own state
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module())) | {"training"}


def construction_fails(record: ModuleRecord) -> bool:
    """Whether the target's own construction record has an argument without an encoding (then a
    capture is saved without it; any other value that cannot be stored is not helped by that)."""
    if record.construction is None and not is_graph_module(record.live_module):
        return False
    tensors = TensorTable()
    try:
        ConstructionTable(tensors).add_module_record(record.live_module, record.module_class, record.construction, "")
    except UnsupportedValueError:
        return True
    return False


def encode_record(
    record: ModuleRecord,
    *,
    environment: dict[str, object],
    settings: Mapping[str, object],
    tags: list[str] | None = None,
    metadata: Mapping[str, object] | None = None,
    policy: PayloadPolicy | None = None,
    with_construction: bool = True,
    by_attributes: bool = True,
) -> tuple[CaptureMetadata, dict[str, memoryview | WrittenPayload]]:
    """Capture metadata and the payloads it references (tensor id -> bytes, or the file a streamed
    weight was written to); ``with_construction=False``: without the target's construction record
    (one of its arguments has no encoding: the caller saves the rest); ``by_attributes=False``: a
    module whose recorded arguments cannot be stored is an error rather than recorded by its
    attributes (strict captures)."""
    policy = policy or PayloadPolicy()
    tensors = TensorTable(plan_shape_only(record, policy))
    constructions = ConstructionTable(tensors, by_attributes=by_attributes)
    module_info: ModuleInfo = {
        "class": class_path(record.module_class),
        "qualified_name": record.qualified_name,
        "construction": None,
    }
    if record.method is not None:  # its calls went through module.<method>(...) (tracing/methods.py)
        module_info["method"] = record.method
    if not with_construction:
        module_info["construction_missing"] = "one of its constructor arguments cannot be stored"
    elif record.construction is None and not is_graph_module(record.live_module):
        module_info["construction_missing"] = construction_missing(record.live_module)
    else:
        # An unsupported constructor argument is an error naming it, unless the module's attributes
        # rebuild it; the caller decides whether to fail (strict) or to save without a record and warn.
        mid = constructions.add_module_record(record.live_module, record.module_class, record.construction, "")
        module_info["construction"] = mid
        if "state" in constructions.entries[mid]:
            module_info["construction_missing"] = constructions.entries[mid]["why"]
    if record.tree:
        module_info["tree"] = _encode_module_tree(record, constructions)
    if record.structure:
        module_info["structure"] = record.structure
        attribute_ctx = EncodeContext(add_tensor=tensors.add)
        module_info["attributes"] = {
            path: {k: encode_value(v, attribute_ctx, f"attributes[{path!r}].{k}") for k, v in values.items()}
            for path, values in record.attributes.items()
        }
    call_ctx = EncodeContext(add_tensor=tensors.add, lenient=True)
    calls = [_encode_call(call, call_ctx, tensors) for call in record.calls]
    states = [_encode_state(state, tensors, i) for i, state in enumerate(record.states)]
    meta: CaptureMetadata = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION if record.method is not None or any(c.vmap for c in record.calls)
        else METHODLESS_VERSION,
        "name": None,
        "version": None,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tags": list(tags or []),
        "metadata": dict(metadata or {}),
        "module": module_info,
        "constructions": cast(dict[str, Construction], constructions.entries),  # see TensorTable.entries
        "states": cast(list[StateEntry], states),  # optional keys spliced in: plain dicts
        "calls": cast(list[CallEntry], calls),  # as states
        "unrecorded": call_ctx.unrecorded,
        "shape_only": tensors.shape_only_paths,
        "capture": {**settings, **policy.settings(), "complete": record.complete, "calls_seen": record.seen_calls},
        "environment": environment,
        "tensors": cast(dict[str, TensorEntry], tensors.entries),  # see TensorTable.entries
    }
    meta["sources"] = collect_sources(meta, [record.module_class, *constructions.classes])
    for entry in meta["sources"].values():
        text = entry.pop("text", None)
        if text is not None:  # stored once as a blob, referenced from here (docs/format.md, sources)
            entry["text_id"] = tensors.add_text(text)
    own = meta["sources"].get(record.module_class.__module__)
    if own is not None:
        module_info["source"] = {"module": record.module_class.__module__, "file": own["file"], "hash": own["hash"],
                                 "class_hash": own["classes"].get(record.module_class.__qualname__, {}).get("hash")}
    return meta, tensors.payloads


def _encode_module_tree(record: ModuleRecord, constructions: ConstructionTable) -> dict[str, TreeEntry]:
    """``module.tree`` (docs/format.md): per submodule path, the class its construction built and
    that construction, or why there is none; parametrizations, norm hooks to apply again, hooks."""

    def built(module: torch.nn.Module, cls: type, path: str) -> TreeEntry:
        entry: TreeEntry = {"class": class_path(cls)}
        try:
            entry["construction"] = constructions.add(module, path)
        except UnsupportedValueError as error:  # only a rebuild that needs this piece fails, naming it
            entry["construction"], entry["missing"] = None, str(error)
        return entry

    tree: dict[str, TreeEntry] = {}
    for node in record.tree:
        if node.same_as is not None:
            tree[node.path] = {"same_as": node.same_as}
            continue
        entry = built(node.module, node.cls, f"tree[{node.path!r}].")
        if node.compiled:
            entry["compiled"] = True
        settings = node.compile_settings if node.path else record.compiled
        if settings is not None:
            entry["compile"] = settings
        if node.made_by is not None:
            entry["made_by"] = node.made_by
        if node.traced_training is not None:
            entry["traced_training"] = node.traced_training
        if node.parametrizations:
            entry["parametrizations"] = {
                name: {"unsafe": unsafe, "modules": [built(m, constructed_class(m), f"tree[{node.path!r}].{name}[{i}].")
                                                     for i, m in enumerate(chain)]}
                for name, (chain, unsafe) in node.parametrizations.items()}
        hooks: list[HookEntry] = [{"kind": h.kind, "hook": h.hook, "rebuilt": h.rebuilt} for h in node.hooks]
        reapply = _encode_reapply(node, constructions, hooks, f"tree[{node.path!r}].reapply")
        if reapply:
            entry["reapply"] = reapply
        if hooks:
            entry["hooks"] = hooks
        if node.forward_replaced:
            entry["forward_replaced"] = node.forward_replaced
        tree[node.path] = entry
    return tree


def _encode_reapply(node: TreeNode, constructions: ConstructionTable, hooks: list[HookEntry],
                   where: str) -> list[dict[str, object]]:
    """A tree node's ``reapply`` list as stored: accelerate hooks encoded through the codecs (one
    that cannot be is listed among the hooks not rebuilt, with the reason, and a warning says so)."""
    encoded = []
    for item in node.reapply:
        if item["kind"] != "accelerate":
            encoded.append(item)
            continue
        try:
            ctx = EncodeContext(add_tensor=constructions.tensors.add, add_module=constructions.add)
            encoded.append({"kind": "accelerate", "hooks": encode_value(list(item["hooks"]), ctx, where)})
        except UnsupportedValueError as error:
            described = ", ".join(class_path(type(h)) for h in item["hooks"])
            hooks.append({"kind": "forward", "hook": f"accelerate {described} ({error})", "rebuilt": False})
            warnings.warn(f"modulelens: {node.path or '<root>'}: accelerate hook {described} cannot be stored, so a "
                          f"replay runs without it: {error}", CaptureWarning, stacklevel=4)
    return encoded


def state_name(name: str) -> str:
    """A parameter or buffer name as the rebuilt module has it: a child that ran ``torch.compile``d
    is rebuilt as itself, so its wrapper's ``_orig_mod.`` segment goes."""
    return name.replace("._orig_mod.", ".").removeprefix("_orig_mod.") if "_orig_mod." in name else name


def _encode_call(call: CallRecord, ctx: EncodeContext, tensors: TensorTable) -> dict[str, object]:
    return {
        "index": call.index,
        "state": call.state_index,
        "training": call.training,
        "grad_enabled": call.grad_enabled,
        "autocast": call.autocast,
        **({"settings": dict(call.settings)} if call.settings else {}),
        "rng": {device: ctx.add_tensor(state, f"rng[{device}]") for device, state in call.rng.items()},
        "inputs": encode_tree((tuple(call.args), dict(call.kwargs)), ctx, f"call{call.index}.inputs"),
        "output": encode_tree(call.output, ctx, f"call{call.index}.output") if call.finished else None,
        **({"mutated_inputs": encode_tree(call.mutated_inputs, ctx, f"call{call.index}.mutated_inputs")}
           if call.mutated_inputs else {}),
        **({"buffers_after": encode_tree({state_name(n): v for n, v in call.buffers_after.items()}, ctx,
                                         f"call{call.index}.buffers_after")} if call.buffers_after else {}),
        "finished": call.finished,
        "error": call.error,
        **({"backward": _encode_backward(call, ctx)} if call.backward is not None else {}),
        **({"backward_missing": "its backward had not run when the capture was saved"}
           if call.backward_pending else {}),
        **({"vmap": dict(call.vmap)} if call.vmap is not None else {}),
        **({"op_trace": _encode_op_trace(call, tensors)} if call.op_trace is not None else {}),
    }


def _encode_op_trace(call: CallRecord, tensors: TensorTable) -> dict[str, object]:
    """``calls[i].op_trace`` (docs/format.md, "Op traces"): the trace document stored as a blob (a
    trace of thousands of ops stays out of ``capture.json``), its kept values as entries of the
    tensor table, and its counts."""
    assert call.op_trace is not None
    document = call.op_trace.to_json(tensors.add, f"call{call.index}.op_trace")
    text_id = tensors.add_text(json.dumps(document, separators=(",", ":"), allow_nan=False))
    return {"text_id": text_id, **call.op_trace.summary()}


def _encode_backward(call: CallRecord, ctx: EncodeContext) -> BackwardEntry:
    backward = call.backward
    assert backward is not None
    where = f"call{call.index}.backward"
    return {
        "output_grads": encode_tree(backward.output_grads, ctx, f"{where}.output_grads"),
        "input_grads": encode_tree(backward.input_grads, ctx, f"{where}.input_grads"),
        "param_grads": encode_tree({state_name(n): g for n, g in backward.param_grads.items()}, ctx,
                                   f"{where}.param_grads"),
    }


def _encode_state(state: StateSnapshot, tensors: TensorTable, index: int) -> dict[str, object]:
    ctx = EncodeContext(add_tensor=tensors.add)
    return {
        "parameters": {
            state_name(name): {"tensor": tensors.add(t, f"state{index}.{name}"), "requires_grad": state.requires_grad[name]}
            for name, t in state.parameters.items()
        },
        "buffers": {
            state_name(name): {"tensor": tensors.add(t, f"state{index}.{name}"), "persistent": state.persistent[name]}
            for name, t in state.buffers.items()
        },
        "extra_state": {state_name(name): encode_value(v, ctx, f"state{index}.{name}")
                        for name, v in state.extra_state.items()},
        **({"rebuilt_buffers": {state_name(name): dict(entry) for name, entry in state.rebuilt_buffers.items()}}
           if state.rebuilt_buffers else {}),
        **({"module_state": {state_name(path): {key: encode_value(v, ctx, f"state{index}.{path}.{key}")
                                                for key, v in values.items()}
                             for path, values in state.module_state.items()}} if state.module_state else {}),
    }
