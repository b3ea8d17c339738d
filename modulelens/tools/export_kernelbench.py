"""Export a capture as a KernelBench / KernelAgent problem folder (``modulelens export --format kernelbench``).

The folder (see docs/kernels.md)::

    problem.py            class Model(nn.Module), get_inputs(), get_init_inputs(), get_benchmark_config()
    test_modulelens.py    a test for KernelAgent's --test-paths: kernel_function vs the recorded outputs
    manifest.json         capture ref/version/id, payload hashes, argument shapes/dtypes, tolerances,
                          kernelbench_compatible (+ reasons), the kernel_function calling convention
    data/weights.safetensors, data/inputs.safetensors, data/outputs.safetensors (+ data/init.safetensors)

``problem.py`` is self-contained: it inlines the module's source (the class and the helper code of
its module it needs; torch builtins are subclassed by import), reads the REAL captured weights and
inputs with a few-line safetensors reader from an absolute path (``$MODULELENS_PROBLEM_DATA``
overrides it), and works when exec'd from its text with no ``__file__`` (how KernelBench loads it).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from modulelens.errors import ModulelensError, RestoreError, UnsupportedValueError
from modulelens.format.imports import resolve_import
from modulelens.format.tensors import dtype_name, hash_bytes
from modulelens.format.values import Unrecorded
from modulelens.repo.local import CAPTURE_FILE, Repo
from modulelens.restore.loader import Capture, load
from modulelens.tools import kernelbench_template as templates
from modulelens.tools._kernel_worker import write_safetensors

SCHEMA = "modulelens.kernelbench-problem/1"
MAX_CALLS = 8
TEST_FILE = "test_modulelens.py"

# Kernel tolerances by output dtype: rtol = atol = value (KernelBench's per-precision tolerance).
# Integer and bool outputs must match exactly.
KERNEL_TOLERANCES: dict[str, float] = {
    "float32": 1e-4, "float64": 1e-6, "complex64": 1e-4, "complex128": 1e-6,
    "float16": 1e-2, "bfloat16": 1e-2,
    "float8_e4m3fn": 1.25e-1, "float8_e5m2": 2.5e-1, "float8_e4m3fnuz": 1.25e-1, "float8_e5m2fnuz": 2.5e-1,
}

_KB_PRECISIONS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_RESERVED = {"Model", "get_inputs", "get_init_inputs", "get_benchmark_config", "DATA_DIR", "_Captured", "_ML_CALLS"}
_SAFE_REBINDS = {  # names the template uses; the module may bind them only to the same thing
    "json": ("json",), "os": ("os",), "Path": ("pathlib.Path",), "torch": ("torch",), "nn": ("torch.nn",),
}


def tolerance_for_dtype(dtype: str, rtol: float | None = None, atol: float | None = None) -> tuple[float, float]:
    """(rtol, atol) for an output dtype: the table above, ``0`` for exact dtypes, overrides applied."""
    base = KERNEL_TOLERANCES.get(dtype)
    if base is None:
        return 0.0, 0.0
    return (base if rtol is None else rtol), (base if atol is None else atol)


def tolerance_table(dtypes: Sequence[str], rtol: float | None = None, atol: float | None = None) -> dict[str, Any]:
    """``{dtype: {"rtol", "atol", "exact"}}`` for the given output dtypes."""
    table = {}
    for dtype in sorted(set(dtypes)):
        r, a = tolerance_for_dtype(dtype, rtol, atol)
        table[dtype] = {"rtol": r, "atol": a, "exact": dtype not in KERNEL_TOLERANCES}
    return table


# ------------------------------------------------------------------------------------ calls and binding


def select_calls(capture: Capture, calls: Sequence[int] | None = None, max_calls: int = MAX_CALLS,
                 *, same_state: bool = True, left_out: list[dict[str, Any]] | None = None) -> list[int]:
    """Positions in ``capture.calls`` to use: finished calls, at most ``max_calls``.

    With ``same_state`` only calls recorded with the first one's weights and training flag are kept
    (a problem has one set of weights); the others are listed in ``left_out`` with the reason."""
    if not capture.calls:
        raise ModulelensError(f"{capture.ref} has no recorded calls")
    wanted = list(range(len(capture.calls))) if calls is None else list(calls)
    for position in wanted:
        if not 0 <= position < len(capture.calls):
            raise ModulelensError(f"{capture.ref} has no call at position {position} ({len(capture.calls)} recorded)")
    chosen: list[int] = []
    for position in wanted:
        call = capture.calls[position]
        reason = None
        if not call.finished:
            reason = "the recorded call raised in the original job"
        elif same_state and chosen and call.state_index != capture.calls[chosen[0]].state_index:
            reason = f"recorded with other weights (state {call.state_index}, not {capture.calls[chosen[0]].state_index})"
        elif same_state and chosen and call.training != capture.calls[chosen[0]].training:
            reason = "recorded in another training mode"
        elif len(chosen) >= max_calls:
            reason = f"more than {max_calls} calls"
        if reason is None:
            chosen.append(position)
        elif left_out is not None:
            left_out.append({"index": call.index, "position": position, "reason": reason})
    if not chosen:
        raise ModulelensError(f"{capture.ref}: no usable recorded call (every call raised in the original job)")
    return chosen


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


def _forward_parameters(cls: type) -> list[inspect.Parameter]:
    try:
        signature = inspect.signature(cls.forward)
    except (TypeError, ValueError) as error:
        raise ModulelensError(f"cannot read the signature of {cls.__qualname__}.forward: {error}") from None
    params = list(signature.parameters.values())
    return params[1:] if params and params[0].name == "self" else params


def module_class(capture: Capture) -> type:
    """The captured module's class, imported by its recorded path."""
    return capture.module_type


def _check_recorded(value: Any, where: str) -> None:
    for leaf in pytree.tree_leaves(value):
        if isinstance(leaf, Unrecorded):
            raise ModulelensError(f"{where} was not recorded ({leaf.type_name}); it cannot be exported or replayed")


def bind_calls(capture: Capture, positions: Sequence[int]) -> CallBinding:
    """Bind each selected call's ``args``/``kwargs`` to one positional list of equal length."""
    cls = module_class(capture)
    params = _forward_parameters(cls)
    signature = inspect.Signature(params)
    positional_params = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_positional = next((p for p in params if p.kind == p.VAR_POSITIONAL), None)
    bound_calls = {}
    for position in positions:
        call = capture.calls[position]
        args, kwargs = call.inputs
        _check_recorded((args, kwargs), f"an input of call {call.index}")
        try:
            bound_calls[position] = signature.bind(*args, **kwargs).arguments
        except TypeError as error:
            raise ModulelensError(f"call {call.index} does not fit {cls.__qualname__}.forward{signature}: {error}") from None
    used = 0
    var_counts = set()
    kw_names: list[str] = []
    for arguments in bound_calls.values():
        for i, p in enumerate(positional_params):
            if p.name in arguments:
                used = max(used, i + 1)
        var_counts.add(len(arguments.get(var_positional.name, ())) if var_positional else 0)
        for p in params:
            if p.kind == p.KEYWORD_ONLY and p.name in arguments and p.name not in kw_names:
                kw_names.append(p.name)
            if p.kind == p.VAR_KEYWORD:
                kw_names.extend(k for k in arguments.get(p.name, {}) if k not in kw_names)
    if len(var_counts) > 1:
        raise ModulelensError(f"the recorded calls pass different numbers of *{var_positional.name} "
                              "arguments; export them one at a time (--calls)")
    var_count = var_counts.pop()
    if var_count:
        used = len(positional_params)
    kw_order = {p.name: i for i, p in enumerate(params)}
    kw_names.sort(key=lambda n: kw_order.get(n, len(params)))
    names = [p.name for p in positional_params[:used]]
    names += [f"{var_positional.name}_{i}" for i in range(var_count)] if var_positional else []
    names += kw_names
    binding = CallBinding(positions=list(positions), positional={}, names=names, kw_names=kw_names,
                          weight_names=_weight_names(capture), init_inputs=init_inputs(capture))
    by_name = {p.name: p for p in params}
    var_keyword = next((p for p in params if p.kind == p.VAR_KEYWORD), None)
    for position, arguments in bound_calls.items():
        index = capture.calls[position].index
        values: list[Any] = []
        for p in positional_params[:used]:
            values.append(_argument_or_default(arguments, p, index, binding))
        if var_positional is not None:
            values.extend(arguments.get(var_positional.name, ()))
        for name in kw_names:
            p = by_name.get(name)
            if p is not None and p.kind == p.KEYWORD_ONLY:
                values.append(_argument_or_default(arguments, p, index, binding))
            else:
                extra = arguments.get(var_keyword.name, {}) if var_keyword else {}
                if name not in extra:
                    raise ModulelensError(f"call {index} does not pass keyword {name!r} that other recorded calls pass; "
                                          "export the calls separately (--calls)")
                values.append(extra[name])
        binding.positional[position] = values
    return binding


def _argument_or_default(arguments: dict[str, Any], p: inspect.Parameter, index: int, binding: CallBinding) -> Any:
    if p.name in arguments:
        return arguments[p.name]
    if p.default is inspect.Parameter.empty:
        raise ModulelensError(f"call {index} has no value for {p.name!r}")
    binding.defaults_used[p.name] = p.default
    return p.default


def _weight_names(capture: Capture) -> list[str]:
    states = capture.metadata.get("states", [])
    if not states:
        return []
    return list(states[0]["parameters"]) + list(states[0]["buffers"])


def init_inputs(capture: Capture) -> list[Any]:
    """The recorded positional constructor arguments when they are plain values (JSON-able, no tensors), else []."""
    construction = _construction(capture)
    if construction is None or not _plain(construction["args"]):
        return []
    return [_decode_plain(a) for a in construction["args"]]


def _construction(capture: Capture) -> dict[str, Any] | None:
    mid = capture.metadata["module"].get("construction")
    return capture.metadata.get("constructions", {}).get(mid) if mid else None


def _plain(values: Any) -> bool:
    if values is None or isinstance(values, (bool, int, str)):
        return True
    if isinstance(values, float):
        return math.isfinite(values)
    if isinstance(values, list):
        return all(_plain(v) for v in values)
    if isinstance(values, dict) and values.get("$type") == "tuple":
        return all(_plain(v) for v in values["items"])
    return False


def _decode_plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode_plain(v) for v in value]
    if isinstance(value, dict):
        return tuple(_decode_plain(v) for v in value["items"])
    return value


# ------------------------------------------------------------------------------------ Python source rendering


class _Renderer:
    """Turns recorded values into Python expressions for the generated files."""

    def __init__(self, capture: Capture, inline_module: str | None) -> None:
        self.capture = capture
        self.inline_module = inline_module
        self.needed_names: set[str] = set()
        self.init_tensors: dict[str, torch.Tensor] = {}
        self.uses_importlib = False
        self.uses_functools = False
        self.required_modules: set[str] = set()
        self._tensor_keys: dict[int, str] = {}

    # -- objects by import path
    def import_expr(self, path: str) -> str:
        module, _, qualname = path.partition(":")
        obj = resolve_import(path, "value")
        if module == "builtins":
            return qualname
        if self.inline_module is not None and module == self.inline_module and "." not in qualname:
            self.needed_names.add(qualname)
            return qualname
        if module == "torch" or module.startswith("torch."):
            if "." not in qualname:
                for public in ("torch.nn", "torch.nn.functional", "torch"):
                    if getattr(importlib.import_module(public), qualname, None) is obj:
                        return f"{public}.{qualname}"
            if _attribute_path_works(module, qualname, obj):
                return f"{module}.{qualname}"
            return self._importlib(path)
        self.required_modules.add(module)
        return self._importlib(path)

    def _importlib(self, path: str) -> str:
        module, _, qualname = path.partition(":")
        self.uses_importlib = True
        return f"importlib.import_module({module!r}).{qualname}"

    # -- typed JSON (constructor arguments) -> expression
    def encoded(self, data: Any, where: str) -> str:
        if data is None or isinstance(data, (bool, int, str)):
            return repr(data)
        if isinstance(data, float):
            return repr(data)
        if isinstance(data, list):
            return "[" + ", ".join(self.encoded(v, where) for v in data) + "]"
        tag = data.get("$type")
        if tag == "tuple":
            items = [self.encoded(v, where) for v in data["items"]]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if tag == "dict":
            return "{" + ", ".join(f"{self.encoded(k, where)}: {self.encoded(v, where)}" for k, v in data["items"]) + "}"
        if tag in ("set", "frozenset"):
            items = ", ".join(self.encoded(v, where) for v in data["items"])
            return f"{tag}([{items}])"
        if tag == "float":
            return f"float({data['value']!r})"
        if tag == "complex":
            return f"complex({data['real']!r}, {data['imag']!r})"
        if tag == "bytes":
            return f"bytes.fromhex({data['hex']!r})"
        if tag == "slice":
            return "slice(" + ", ".join(self.encoded(v, where) for v in data["items"]) + ")"
        if tag == "ellipsis":
            return "..."
        if tag == "dtype":
            return f"torch.{data['value']}"
        if tag == "device":
            return f"torch.device({data['value']!r})"
        if tag == "size":
            return f"torch.Size({data['value']!r})"
        if tag == "import":
            return self.import_expr(data["path"])
        if tag == "tensor":
            key = f"init.{len(self.init_tensors)}"
            self.init_tensors[key] = self.capture.tensor(data["id"])
            return f"_ml_init[{key!r}]"
        if tag == "module":
            entry = self.capture.metadata["constructions"][data["ref"]]
            return self.construction(entry, where)
        if tag == "namedtuple":
            return f"{self.import_expr(data['class'])}(" + ", ".join(self.encoded(v, where) for v in data["items"]) + ")"
        if tag == "dataclass":
            fields = data["fields"]
            pairs = fields["items"] if isinstance(fields, dict) and fields.get("$type") == "dict" else []
            args = ", ".join(f"{k}={self.encoded(v, where)}" for k, v in pairs)
            return f"{self.import_expr(data['class'])}({args})"
        if tag == "codec" and data.get("codec") == "enum":
            return f"{self.import_expr(data['class'])}({self.encoded(data['value'], where)})"
        if tag == "codec" and data.get("codec") == "partial":
            value = data["value"]["items"] if isinstance(data["value"], dict) else []
            parts = {self.encoded(k, where).strip("'\""): v for k, v in value}
            self.uses_functools = True
            args = parts.get("args", {"items": []})
            keywords = parts.get("keywords", {"items": []})
            text = ", ".join([self.encoded(parts["func"], where), *(self.encoded(a, where) for a in args["items"])]
                             + [f"{self.encoded(k, where).strip(chr(39))}={self.encoded(v, where)}"
                                for k, v in keywords["items"]])
            return f"functools.partial({text})"
        raise UnsupportedValueError(f"{where}: a recorded {tag or type(data).__name__} value cannot be written as "
                                    "Python source for the problem file")

    def construction(self, entry: dict[str, Any], where: str) -> str:
        args = [self.encoded(a, where) for a in entry["args"]]
        args += [f"{k}={self.encoded(v, where)}" for k, v in entry["kwargs"].items()]
        return f"{self.import_expr(entry['class'])}({', '.join(args)})"

    def tensor_key(self, tensor: torch.Tensor) -> str | None:
        """The data-file key a call-input tensor was stored under by :meth:`value`."""
        return self._tensor_keys.get(id(tensor))

    # -- live values (call inputs) -> expression
    def value(self, value: Any, key: str, tensors: dict[str, torch.Tensor]) -> str:
        if isinstance(value, torch.Tensor):
            existing = self._tensor_keys.get(id(value))
            if existing is None:
                tensors[key] = value.detach()
                self._tensor_keys[id(value)] = existing = key
            return f"t[{existing!r}]"
        if value is None or isinstance(value, (bool, int, str)) or value is Ellipsis:
            return repr(value)
        if isinstance(value, float):
            return repr(value) if math.isfinite(value) else f"float({repr(value)!r})"
        if isinstance(value, complex):
            return f"complex({value.real!r}, {value.imag!r})"
        if isinstance(value, torch.dtype):
            return f"torch.{str(value).removeprefix('torch.')}"
        if isinstance(value, torch.device):
            return f"torch.device({str(value)!r})"
        if isinstance(value, torch.Size):
            return f"torch.Size({list(value)!r})"
        if type(value) is list:
            return "[" + ", ".join(self.value(v, f"{key}.{i}", tensors) for i, v in enumerate(value)) + "]"
        if type(value) is tuple:
            items = [self.value(v, f"{key}.{i}", tensors) for i, v in enumerate(value)]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if type(value) is dict:
            return "{" + ", ".join(f"{k!r}: {self.value(v, f'{key}.{k}', tensors)}" for k, v in value.items()) + "}"
        raise UnsupportedValueError(f"{key}: a {type(value).__module__}.{type(value).__qualname__} argument cannot be "
                                    "written into a KernelBench problem")


def _attribute_path_works(module: str, qualname: str, obj: Any) -> bool:
    try:
        current: Any = importlib.import_module(module.split(".")[0])
        for part in module.split(".")[1:] + qualname.split("."):
            current = getattr(current, part)
        return current is obj
    except (ImportError, AttributeError):
        return False


# ------------------------------------------------------------------------------------ module source


@dataclass
class ClassSource:
    """How ``problem.py`` gets the captured class: inlined source, or an import."""

    origin: str  # "inlined" or "imported"
    class_expr: str
    code: str = ""
    future_annotations: bool = False
    module: str = ""
    included: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    imports: set[str] = field(default_factory=set)  # top-level packages the inlined code imports


def _free_names(node: ast.AST) -> set[str]:
    """Names a statement reads (over-approximated: every loaded name and attribute root)."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
            names.add(sub.id)
    return names


def _bound_names(node: ast.stmt) -> set[str]:
    """Top-level names a module statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Import):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.ImportFrom):
        return {a.asname or a.name for a in node.names if a.name != "*"}
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, (ast.If, ast.Try, ast.With)) or type(node).__name__ == "TryStar":
        found = set()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                found |= _bound_names(child)
            elif isinstance(child, ast.ExceptHandler):
                for grandchild in child.body:
                    found |= _bound_names(grandchild)
        return found
    return set()


def _segment(lines: list[str], node: ast.stmt) -> str:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "".join(lines[start - 1:node.end_lineno])


def _absolute_import(node: ast.ImportFrom, package: str | None) -> str:
    module = node.module or ""
    if node.level:
        module = importlib.util.resolve_name("." * node.level + module, package)
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
    return f"from {module} import {names}\n"


def class_source(cls: type, extra_names: set[str] | None = None, *, inline: bool = True) -> ClassSource:
    """The source ``problem.py`` needs for ``cls``: torch builtins by import, otherwise the class and
    the top-level code of its module that it uses (imports, helpers, constants), in file order."""
    module_name = cls.__module__
    qualname = cls.__qualname__
    if module_name == "torch" or module_name.startswith("torch."):
        for public in ("torch.nn",):
            if getattr(importlib.import_module(public), cls.__name__, None) is cls:
                return ClassSource("imported", f"{public}.{cls.__name__}", module=module_name)
        return ClassSource("imported", f"{module_name}.{qualname}", module=module_name)
    fallback = ClassSource("imported", f"importlib.import_module({module_name!r}).{qualname}", module=module_name)
    if not inline:
        fallback.notes.append("the class is imported (not inlined), so its module must be importable")
        return fallback
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    try:
        text = inspect.getsource(module)
    except (OSError, TypeError) as error:
        fallback.notes.append(f"source of {module_name} not available ({error}); the class is imported instead")
        return fallback
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    statements = [s for s in tree.body]
    target = next((s for s in statements if isinstance(s, ast.ClassDef) and s.name == qualname), None)
    if target is None:
        fallback.notes.append(f"{qualname} is not a top-level class of {module_name}; the class is imported instead")
        return fallback
    bindings: dict[str, list[int]] = {}
    for i, statement in enumerate(statements):
        if statement is target:
            continue
        for name in _bound_names(statement):
            bindings.setdefault(name, []).append(i)
    include = {statements.index(target)}
    pending = _free_names(target) | set(extra_names or ())
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for i in bindings.get(name, []):
            if i not in include:
                include.add(i)
                pending |= _free_names(statements[i])
    package = getattr(module, "__package__", None)
    future = any(isinstance(s, ast.ImportFrom) and s.module == "__future__" and any(a.name == "annotations" for a in s.names)
                 for s in statements)
    code = f"# from {module_name} ({getattr(module, '__file__', '?')})\n"
    included = []
    imported: set[str] = set()
    previous: ast.stmt | None = None
    for i in sorted(include):
        statement = statements[i]
        if isinstance(statement, ast.ImportFrom) and statement.module == "__future__":
            continue
        if isinstance(statement, ast.ImportFrom) and statement.level:
            chunk = _absolute_import(statement, package)
            imported.add(chunk.split()[1].split(".")[0])
        else:
            if isinstance(statement, ast.Import):
                imported.update(a.name.split(".")[0] for a in statement.names)
            elif isinstance(statement, ast.ImportFrom) and statement.module:
                imported.add(statement.module.split(".")[0])
            chunk = _segment(lines, statement)
        if previous is not None:
            imports = (ast.Import, ast.ImportFrom)
            assigns = (ast.Assign, ast.AnnAssign)
            if (isinstance(statement, imports) and isinstance(previous, imports)) or (
                    isinstance(statement, assigns) and isinstance(previous, assigns)):
                code += "\n"
            elif isinstance(statement, (*imports, *assigns)) and isinstance(previous, (*imports, *assigns)):
                code += "\n\n"
            else:
                code += "\n\n\n"
        code += chunk.rstrip("\n")
        previous = statement
        included.append(", ".join(sorted(_bound_names(statement))) or type(statement).__name__)
    code += "\n"
    _check_reserved(statements, include, module_name)
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    third_party = {name for name in imported if name not in stdlib and name not in ("torch", "__future__")}
    return ClassSource("inlined", qualname, code=code, future_annotations=future, module=module_name, included=included,
                       imports=third_party)


def _check_reserved(statements: list[ast.stmt], include: set[int], module_name: str) -> None:
    for i in include:
        statement = statements[i]
        for name in _bound_names(statement) & (_RESERVED | set(_SAFE_REBINDS)):
            if name in _SAFE_REBINDS and _binds_same(statement, name):
                continue
            raise ModulelensError(f"{module_name} binds {name!r} at top level, which the problem file reserves; "
                                  "export with --no-inline to import the class instead")


def _binds_same(statement: ast.stmt, name: str) -> bool:
    allowed = _SAFE_REBINDS[name]
    if isinstance(statement, ast.Import):
        return any((a.asname or a.name) == name and a.name in allowed for a in statement.names)
    if isinstance(statement, ast.ImportFrom):
        return any((a.asname or a.name) == name and f"{statement.module}.{a.name}" in allowed for a in statement.names)
    return False


# ------------------------------------------------------------------------------------ export


@dataclass
class ExportResult:
    """What :func:`export_kernelbench` wrote."""

    directory: Path
    manifest: dict[str, Any]

    @property
    def problem(self) -> Path:
        return self.directory / "problem.py"

    @property
    def test(self) -> Path:
        return self.directory / TEST_FILE

    def to_dict(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "problem": str(self.problem), "test": str(self.test),
                "manifest": self.manifest}


def _output_leaves(output: Any) -> list[tuple[str, Any]]:
    leaves, _ = pytree.tree_flatten_with_path(output)
    return [("output" + pytree.keystr(kp), leaf) for kp, leaf in leaves]


def _describe_arg(name: str, value: Any, key_of: Callable[[torch.Tensor], str | None],
                  payload_of: Callable[[torch.Tensor], str | None]) -> dict[str, Any]:
    if isinstance(value, torch.Tensor):
        return {"name": name, "kind": "tensor", "shape": list(value.shape), "dtype": dtype_name(value.dtype),
                "key": key_of(value), "payload": payload_of(value)}
    leaves = pytree.tree_leaves(value)
    if any(isinstance(v, torch.Tensor) for v in leaves):
        return {"name": name, "kind": type(value).__name__, "tensors": [
            {"shape": list(v.shape), "dtype": dtype_name(v.dtype), "key": key_of(v), "payload": payload_of(v)}
            for v in leaves if isinstance(v, torch.Tensor)]}
    try:
        json.dumps(value)
        return {"name": name, "kind": "value", "value": value}
    except (TypeError, ValueError):
        return {"name": name, "kind": "value", "value": repr(value)}


def export_kernelbench(
    ref: str | Capture,
    out_dir: str | os.PathLike[str],
    *,
    repo: Repo | str | None = None,
    calls: Sequence[int] | None = None,
    max_calls: int = MAX_CALLS,
    inline: bool = True,
    overwrite: bool = False,
    check: bool = True,
    rtol: float | None = None,
    atol: float | None = None,
) -> ExportResult:
    """Write a KernelBench/KernelAgent problem folder for capture ``ref`` (a ref or a loaded
    :class:`Capture`) into ``out_dir``.

    ``calls`` selects recorded calls by position (default: all, up to ``max_calls`` that share
    the first call's weights). ``inline=False`` imports the class instead of inlining its source.
    ``check`` execs the written ``problem.py`` the way KernelBench does and records in the
    manifest whether its ``Model`` reproduces the recorded outputs. ``rtol``/``atol`` override the
    per-dtype tolerances written into the manifest and the test.

    Example::

        result = export_kernelbench("ranker/top_mlp:v3", "problems/top_mlp")
        print(result.manifest["kernelbench_compatible"], result.problem)
    """
    if isinstance(ref, Capture):
        capture, store = ref, ref.repo
    else:
        store = repo if isinstance(repo, Repo) else Repo(repo, create=False)
        capture = load(ref, repo=store)
    directory = Path(out_dir).expanduser().absolute()
    if directory.exists() and any(directory.iterdir()):
        if not overwrite:
            raise ModulelensError(f"{directory} is not empty (use --force to replace its problem files)")
        for stale in ("problem.py", TEST_FILE, "manifest.json", "data"):
            target = directory / stale
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    left_out: list[dict[str, Any]] = []
    positions = select_calls(capture, calls, max_calls, same_state=True, left_out=left_out)
    binding = bind_calls(capture, positions)
    cls = module_class(capture)
    construction = _construction(capture)
    if construction is None:
        raise RestoreError(f"{capture.ref}: no constructor record ({capture.metadata['module'].get('construction_missing')}); "
                           "a problem file needs the constructor arguments")
    # the module's source first (with a first pass over the constructor to learn the helper names it needs)
    probe = _Renderer(capture, cls.__module__ if inline else None)
    init_expr_args = [probe.encoded(a, f"constructor argument {i}") for i, a in enumerate(construction["args"])]
    [probe.encoded(v, f"constructor argument {k!r}") for k, v in construction["kwargs"].items()]
    source = class_source(cls, probe.needed_names, inline=inline)
    renderer = _Renderer(capture, source.module if source.origin == "inlined" else None)
    init_expr_args = [renderer.encoded(a, f"constructor argument {i}") for i, a in enumerate(construction["args"])]
    init_expr_kwargs = [f"{k}={renderer.encoded(v, f'constructor argument {k!r}')}"
                        for k, v in construction["kwargs"].items()]
    plain_init = bool(binding.init_inputs) or not construction["args"]
    call_tensors: dict[str, torch.Tensor] = {}
    call_exprs = []
    for position in positions:
        values = binding.positional[position]
        items = [renderer.value(v, f"call{capture.calls[position].index}.{name}", call_tensors)
                 for v, name in zip(values, binding.names, strict=True)]
        call_exprs.append(f"    lambda t: [{', '.join(items)}],  # call {capture.calls[position].index}")
    for name, default in binding.defaults_used.items():
        try:
            renderer.value(default, f"default of {name}", {})
        except UnsupportedValueError as error:
            raise ModulelensError(f"cannot export: {error}") from None
    state_index = capture.calls[positions[0]].state_index
    training = capture.calls[positions[0]].training
    weights = {}
    weight_entries = []
    states = capture.metadata.get("states", [])
    if states:
        state = states[state_index]
        for kind, group in (("parameter", state["parameters"]), ("buffer", state["buffers"])):
            for name, entry in group.items():
                tensor = capture.tensor(entry["tensor"])
                weights[name] = tensor
                meta = capture.metadata["tensors"][entry["tensor"]]
                weight_entries.append({"name": name, "kind": kind, "shape": meta["shape"], "dtype": meta["dtype"],
                                       "payload": meta["payload"]})
    outputs: dict[str, torch.Tensor] = {}
    expected: list[list[dict[str, Any]]] = []

    def payload_of(tensor: Any) -> str | None:
        for tid, known in capture._tensors.items():
            if known is tensor:
                return capture.metadata["tensors"][tid]["payload"]
        return None

    call_entries = []
    output_dtypes: list[str] = []
    for position in positions:
        call = capture.calls[position]
        _check_recorded(call.output, f"an output of call {call.index}")
        leaves = []
        for n, (path, leaf) in enumerate(_output_leaves(call.output)):
            if isinstance(leaf, torch.Tensor):
                key = f"call{call.index}.out{n}"
                outputs[key] = leaf
                output_dtypes.append(dtype_name(leaf.dtype))
                leaves.append({"path": path, "kind": "tensor", "key": key, "shape": list(leaf.shape),
                               "dtype": dtype_name(leaf.dtype), "payload": payload_of(leaf)})
            else:
                leaves.append({"path": path, "kind": "value", "value": leaf if _jsonable(leaf) else repr(leaf)})
        expected.append([{k: v for k, v in leaf.items() if k in ("path", "key", "value")} for leaf in leaves])
        arguments = [_describe_arg(name, value, renderer.tensor_key, payload_of)
                     for name, value in zip(binding.names, binding.positional[position], strict=True)]
        call_entries.append({"position": position, "index": call.index, "state": call.state_index,
                             "training": call.training, "autocast": call.autocast, "arguments": arguments,
                             "outputs": leaves})
    tolerances = tolerance_table(output_dtypes or ["float32"], rtol, atol)
    compatible_reasons, notes, precision = _compatibility(capture, positions, binding, call_entries, weights)
    notes.extend(source.notes)
    if renderer.required_modules | source.imports:
        notes.append("problem.py imports " + ", ".join(sorted(renderer.required_modules | source.imports))
                     + ": they must be installed where the problem runs")
    notes.extend(binding.notes)
    if training:
        notes.append("the calls were recorded in training mode; Model stays in training mode "
                     "(outputs that depend on dropout/RNG will not match)")
    # --- write files
    data_dir = directory / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    write_safetensors(data_dir / "weights.safetensors", weights, {"capture": capture.ref})
    write_safetensors(data_dir / "inputs.safetensors", call_tensors, {"capture": capture.ref})
    write_safetensors(data_dir / "outputs.safetensors", outputs, {"capture": capture.ref})
    if renderer.init_tensors:
        write_safetensors(data_dir / "init.safetensors", renderer.init_tensors, {"capture": capture.ref})
    class_short = cls.__qualname__
    init_body = []
    if renderer.init_tensors:
        init_body.append('        _ml_init = _ml_read_safetensors(DATA_DIR / "init.safetensors")')
    if plain_init:
        args_text = ", ".join(["*(init_inputs or get_init_inputs())", *init_expr_kwargs])
    else:
        args_text = ", ".join([*init_expr_args, *init_expr_kwargs])
        init_body.append("        # the recorded constructor arguments are written here (they are not plain values)")
    init_body.append(f"        super().__init__({args_text})")
    init_body.append("        _ml_load_weights(self)")
    if not training:
        init_body.append("        self.train(False)  # the calls were recorded in eval mode")
    forward = ""
    if binding.kw_names:
        n = len(binding.names) - len(binding.kw_names)
        positional = binding.names[:n]
        call_args = ", ".join(positional + [f"{k}={k}" for k in binding.kw_names])
        forward = (f"\n    def forward(self, {', '.join(binding.names)}):\n"
                   f'        """{class_short}.forward with its keyword-only arguments taken by position."""\n'
                   f"        return super().forward({call_args})\n")
    header_imports = []
    if renderer.uses_importlib or source.class_expr.startswith("importlib."):
        header_imports.append("import importlib")
    if renderer.uses_functools:
        header_imports.append("import functools")
    problem_text = templates.fill(templates.PROBLEM, {
        "FUTURE": "from __future__ import annotations\n\n" if source.future_annotations else "",
        "REF": capture.ref,
        "CLASS": capture.module_class.replace(":", "."),
        "QUALNAME": capture.metadata["module"].get("qualified_name") or "",
        "CALL_COUNT": str(len(positions)),
        "DATA_ENV": templates.DATA_ENV,
        "DATA_DIR": repr(str(data_dir)),
        "READER": templates.READER,
        "SOURCE": ("\n".join(header_imports) + "\n" if header_imports else "")
        + (source.code if source.origin == "inlined" else f"# {capture.module_class} is imported, not inlined\n"),
        "CLASS_EXPR": source.class_expr,
        "CLASS_SHORT": class_short,
        "INIT_BODY": "\n".join(init_body),
        "FORWARD": forward,
        "INIT_INPUTS": repr(binding.init_inputs) if plain_init else "[]",
        "CALLS": "\n".join(call_exprs),
    })
    weight_lines = "\n".join(f"        {e['name']}  {e['dtype']}{e['shape']}" for e in weight_entries) or "        (none)"
    signature = f"kernel_function({', '.join(binding.names + [e['name'] for e in weight_entries])})"
    test_text = templates.fill(templates.TEST, {
        "REF": capture.ref,
        "CLASS_SHORT": class_short,
        "SIGNATURE": signature,
        "WEIGHT_LINES": weight_lines,
        "OUTPUT_DESC": _describe_outputs(call_entries[0]["outputs"]),
        "TOLERANCE_DESC": "; ".join(f"{d}: exact" if t["exact"] else f"{d}: rtol={t['rtol']:g}, atol={t['atol']:g}"
                                    for d, t in tolerances.items()),
        "DATA_ENV": templates.DATA_ENV,
        "DATA_DIR": repr(str(data_dir)),
        "TOLERANCES": repr({d: (t["rtol"], t["atol"]) for d, t in tolerances.items() if not t["exact"]}),
        "WEIGHT_NAMES": repr([e["name"] for e in weight_entries]),
        "CALLS": "\n".join(call_exprs),
        "EXPECTED": json.dumps(expected),
        "READER": templates.READER,
    })
    ast.parse(problem_text)
    ast.parse(test_text)
    (directory / "problem.py").write_text(problem_text)
    (directory / TEST_FILE).write_text(test_text)
    capture_json = (store.version_path(capture.name, capture.version) / CAPTURE_FILE).read_bytes()
    manifest: dict[str, Any] = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "capture": {"ref": capture.ref, "name": capture.name, "version": capture.version,
                    "capture_id": hash_bytes(capture_json), "module_class": capture.module_class,
                    "qualified_name": capture.metadata["module"].get("qualified_name"),
                    "repo": str(store.root), "created": capture.metadata.get("created")},
        "model": {"source": source.origin, "class_expr": source.class_expr, "inlined_from": source.module,
                  "inlined_statements": source.included, "init_inputs": binding.init_inputs if plain_init else [],
                  "constructor_inline": not plain_init, "training": training, "state": state_index,
                  "forward_arguments": binding.names, "keyword_arguments": binding.kw_names,
                  "defaults_filled": sorted(binding.defaults_used),
                  "requires_modules": sorted(renderer.required_modules | source.imports)},
        "calls": call_entries,
        "left_out_calls": left_out,
        "weights": weight_entries,
        "tolerances": tolerances,
        "kernelbench_compatible": not compatible_reasons,
        "kernelbench_incompatible_reasons": compatible_reasons,
        "kernelbench_precision": precision,
        "kernel_function_signature": signature,
        "data_dir": str(data_dir),
        "data_dir_env": templates.DATA_ENV,
        "files": {},
        "commands": {
            "kernelagent": f"python -m Fuser.auto_agent --problem {directory / 'problem.py'} "
                           f"--test-paths {directory / TEST_FILE} > {directory / 'agent_result.json'}",
            "verify": f"modulelens kernel verify {capture.ref} --candidate {directory / 'agent_result.json'}"
                      f"{'' if store.root == _default_root() else f' --repo {store.root}'}",
            "test": f"cd <dir with kernel.py> && python {directory / TEST_FILE}",
        },
        "notes": notes,
    }
    if check:
        manifest["self_check"] = check_problem(problem_text, outputs, expected, tolerances)
    for path in sorted([directory / "problem.py", directory / TEST_FILE, *data_dir.iterdir()]):
        manifest["files"][str(path.relative_to(directory))] = hash_bytes(path.read_bytes())
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    return ExportResult(directory, manifest)


def _default_root() -> Path:
    from modulelens.repo.local import default_repo_path

    return default_repo_path().expanduser().absolute()


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def _describe_outputs(leaves: list[dict[str, Any]]) -> str:
    parts = [f"{leaf['path']} {leaf['dtype']}{leaf['shape']}" if leaf["kind"] == "tensor"
             else f"{leaf['path']} = {leaf['value']!r}" for leaf in leaves]
    return "; ".join(parts) if parts else "nothing (None)"


def _compatibility(capture: Capture, positions: list[int], binding: CallBinding, call_entries: list[dict[str, Any]],
                   weights: dict[str, torch.Tensor]) -> tuple[list[str], list[str], str | None]:
    """Reasons KernelBench's evaluator would not reproduce the recorded calls, notes, and its precision."""
    reasons: list[str] = []
    notes: list[str] = []
    floating: set[str] = set()
    for entry in call_entries:
        for argument in entry["arguments"]:
            if argument["kind"] == "tensor":
                if argument["dtype"] in ("bool",) or not getattr(torch, argument["dtype"]).is_floating_point:
                    reasons.append(f"input {argument['name']!r} is {argument['dtype']}: KernelBench casts every input "
                                   "tensor to the evaluation precision (a float dtype), so integer/bool inputs break "
                                   "(KernelBench issue #151)")
                else:
                    floating.add(argument["dtype"])
            elif "tensors" in argument:
                reasons.append(f"argument {argument['name']!r} holds tensors inside a {argument['kind']}: KernelBench "
                               "moves and casts only top-level tensor arguments")
        leaves = entry["outputs"]
        tensor_leaves = [leaf for leaf in leaves if leaf["kind"] == "tensor"]
        if len(leaves) != 1 or len(tensor_leaves) != 1 or leaves[0]["path"] != "output":
            what = ("no tensor" if not tensor_leaves else f"{len(tensor_leaves)} tensors") + (
                f" and {len(leaves) - len(tensor_leaves)} other value(s)" if len(leaves) > len(tensor_leaves) else "")
            reasons.append(f"call {entry['index']} returns {what}: KernelBench compares exactly one output tensor")
        elif getattr(torch, tensor_leaves[0]["dtype"]).is_floating_point:
            floating.add(tensor_leaves[0]["dtype"])
        if entry["autocast"]:
            reasons.append(f"call {entry['index']} ran under autocast {entry['autocast']}; problem.py runs without it")
    for tensor in weights.values():
        if tensor.dtype.is_floating_point:
            floating.add(dtype_name(tensor.dtype))
    precision = None
    if len(floating) > 1:
        reasons.append(f"floating tensors have several dtypes ({', '.join(sorted(floating))}): KernelBench casts the "
                       "model and every input to one precision")
    elif floating:
        only = next(iter(floating))
        precision = _KB_PRECISIONS.get(only)
        if precision is None:
            reasons.append(f"{only} is not a KernelBench precision (fp32, fp16, bf16)")
    seen = []
    for reason in reasons:
        if reason not in seen:
            seen.append(reason)
    return seen, notes, precision


def check_problem(problem_text: str, outputs: dict[str, torch.Tensor], expected: list[list[dict[str, Any]]],
                  tolerances: dict[str, Any]) -> dict[str, Any]:
    """Load ``problem.py`` from its text as KernelBench does (``exec``, no ``__file__``) and run
    ``Model(*get_init_inputs())`` on every recorded call's inputs against the recorded outputs."""
    from modulelens.restore.compare import compare

    namespace: dict[str, Any] = {"__name__": "modulelens_problem_check"}
    result: dict[str, Any] = {"reproduces_recorded_outputs": False, "calls": []}
    try:
        exec(compile(problem_text, "<string>", "exec"), namespace)
        torch.manual_seed(0)
        with torch.no_grad():
            model = namespace["Model"](*namespace["get_init_inputs"]())
            tensors = namespace["_ml_read_safetensors"](Path(namespace["DATA_DIR"]) / "inputs.safetensors")
            ok = True
            for i, build in enumerate(namespace["_ML_CALLS"]):
                got = pytree.tree_leaves(model(*build(tensors)))
                want = [outputs[leaf["key"]] if "key" in leaf else leaf.get("value") for leaf in expected[i]]
                worst = 0.0
                passed = len(got) == len(want)
                for w, g in zip(want, got, strict=False):
                    dtype = dtype_name(w.dtype) if isinstance(w, torch.Tensor) else ""
                    tol = tolerances.get(dtype, {"rtol": 0.0, "atol": 0.0, "exact": True})
                    leaf = compare(w, g, exact=tol["exact"], rtol=tol["rtol"], atol=tol["atol"])[0]
                    worst = max(worst, leaf.max_abs_error)
                    passed = passed and leaf.passed
                result["calls"].append({"call": i, "passed": passed, "max_abs_error": worst})
                ok = ok and passed
        result["reproduces_recorded_outputs"] = ok
    except Exception as error:  # reported in the manifest; the files are still useful to read
        result["error"] = f"{type(error).__name__}: {error}"
    return result

