"""Recorded values as Python source for the generated problem files.

A capture is untrusted data (docs/security.md), and the problem files are code that KernelBench,
KernelAgent and the exporter's own self-check run. So everything from a capture that reaches
generated code passes through one of four doors in this module:

- :func:`identifier` / :func:`dotted`: ASCII identifiers (not keywords) and dotted paths of them;
  anything else is refused, or (a keyword name) passed as ``**{'name': value}``;
- :func:`literal`: plain values written by ``ascii()``/``repr`` of ``int``, finite ``float``, ``str``,
  ``bool``, ``None`` and containers of them (``ascii`` escapes quotes, newlines, backslashes and every
  non-ASCII character, so no string can end its literal or its line);
- objects by import path, checked by the import rules (:func:`modulelens.format.imports.resolve_import`);
- :func:`comment_text`: free text a human reads in a docstring or comment (names, class paths,
  shapes), reduced to a small alphabet without quotes, backslashes or line breaks.

:class:`SourceRenderer` writes constructor arguments (typed JSON from the capture) and live call
inputs as Python expressions: plain values as literals, tensors as keys into the data files,
objects by import path, names of the inlined module as bare names, and the codec values a
constructor takes in practice -- enums, ``functools.partial``, dataclasses, namedtuples and
``transformers`` configurations (``LlamaConfig.from_dict({...})``, as the codec decodes them).
Anything it cannot write raises :class:`UnsupportedValueError` naming the argument: a problem file
never gets a made-up value.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import keyword
import math
import string
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeGuard

import torch

from modulelens.errors import RestoreError, UnsupportedValueError, UntrustedCodeError
from modulelens.format.imports import parse_import_path, resolve_import
from modulelens.format.spec import Construction
from modulelens.format.transformers_codecs import CODEC_NAME as CONFIG_CODEC
from modulelens.format.values import import_path, is_state_object, state_attributes
from modulelens.restore.loader import Capture

_COMMENT_ALPHABET = frozenset(string.ascii_letters + string.digits + " _.,:;/-+*=<>()[]{}@#%&!?|~^$")
_RUNTIME_CONFIG_KEYS = ("attn_implementation", "experts_implementation")  # see format/transformers_codecs.py

# Helper functions a problem file gets only when a value needs one (fixed text, no capture data).
HELPERS = {
    "_ml_dataclass": '''
def _ml_dataclass(cls, init, later):
    """A dataclass built from its init fields, then its init=False fields set (as modulelens restores it)."""
    value = cls(**init)
    for name, field_value in later.items():
        object.__setattr__(value, name, field_value)
    return value
'''.strip("\n"),
    "_ml_only_tensor": '''
def _ml_only_tensor(output):
    """The one tensor of a forward's output whose other values are None or objects (KernelBench compares one tensor)."""
    return next(v for v in torch.utils._pytree.tree_leaves(output) if isinstance(v, torch.Tensor))
'''.strip("\n"),
    "_ml_state": '''
def _ml_state(cls, attributes):
    """An object rebuilt from its recorded attributes without running __init__ (as modulelens restores
    state objects such as transformers caches)."""
    value = cls.__new__(cls)
    value.__dict__.update(attributes)
    return value
'''.strip("\n"),
}


def _shown(value: object, limit: int = 60) -> str:
    """A capture value in an error message: escaped (no terminal control characters), shortened."""
    text = ascii(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def identifier(name: object, what: str) -> str:
    """``name`` when it is a plain ASCII Python identifier that is not a keyword.

    Raises:
        UnsupportedValueError: anything else (naming ``what``).

    Example::

        identifier("hidden_states", "argument")      # 'hidden_states'
        identifier("x)\\nimport os", "argument")     # UnsupportedValueError
    """
    if is_identifier(name):
        return name
    raise UnsupportedValueError(f"{what}: {_shown(name)} is not a plain Python identifier, so it cannot be "
                                "written into a problem file")


def is_identifier(name: object) -> TypeGuard[str]:
    """Whether ``name`` may be written into generated code as a bare name."""
    return isinstance(name, str) and name.isascii() and name.isidentifier() and not keyword.iskeyword(name)


def dotted(path: object, what: str) -> str:
    """``a.b.C`` made of :func:`identifier` parts (a module or qualified name)."""
    if not isinstance(path, str) or not path:
        raise UnsupportedValueError(f"{what}: {_shown(path)} is not a dotted Python name")
    for part in path.split("."):
        identifier(part, what)
    return path


def literal(value: object, what: str) -> str:
    """``value`` as a Python literal; only plain data (``None``, ``bool``, ``int``, ``float``,
    ``str``, ``bytes`` and lists, tuples, dicts, sets of them).

    Strings are written with ``ascii()``: quotes, backslashes, newlines, line separators and every
    non-ASCII character come out escaped, so the literal is one token on one line.

    Raises:
        UnsupportedValueError: any other type (naming ``what``).
    """
    if value is None or isinstance(value, bool):
        return repr(value)
    if type(value) is int:
        return repr(value)
    if type(value) is float:
        return repr(value) if math.isfinite(value) else f"float({repr(value)!a})"
    if type(value) is str:
        return ascii(value)
    if type(value) is bytes:
        return f"bytes.fromhex({value.hex()!a})"
    if type(value) is list:
        return "[" + ", ".join(literal(v, what) for v in value) + "]"
    if type(value) is tuple:
        items = [literal(v, what) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if type(value) is dict:
        return "{" + ", ".join(f"{literal(k, what)}: {literal(v, what)}" for k, v in value.items()) + "}"
    if isinstance(value, (set, frozenset)) and type(value) in (set, frozenset):
        return f"{type(value).__name__}([" + ", ".join(sorted(literal(v, what) for v in value)) + "])"
    raise UnsupportedValueError(f"{what}: a {type(value).__module__}.{type(value).__qualname__} value is not a "
                                "plain literal")


def comment_text(text: object, limit: int = 160) -> str:
    """Free text for a docstring or comment: characters outside a small safe alphabet (quotes,
    backslashes, line breaks, control and non-ASCII characters) become ``?``; at most ``limit``."""
    shown = "".join(c if c in _COMMENT_ALPHABET else "?" for c in str(text))
    return shown if len(shown) <= limit else shown[:limit - 3] + "..."


def keyword_arguments(pairs: Iterable[tuple[object, str]], what: str) -> list[str]:
    """``name=expression`` for identifier names; any other name (a keyword such as ``class``, or a
    key that is no identifier) goes into one ``**{'name': expression}``, as Python passes it."""
    plain, other = [], []
    for name, expression in pairs:
        if not isinstance(name, str):
            raise UnsupportedValueError(f"{what}: keyword {_shown(name)} is not a string")
        if is_identifier(name):
            plain.append(f"{name}={expression}")
        else:
            other.append(f"{literal(name, what)}: {expression}")
    return plain + ([f"**{{{', '.join(other)}}}"] if other else [])


def _dtype(name: object, what: str) -> str:
    if isinstance(name, str) and is_identifier(name) and isinstance(getattr(torch, name, None), torch.dtype):
        return f"torch.{name}"
    raise UnsupportedValueError(f"{what}: {_shown(name)} is not a torch dtype")


def _dict_text(items: Sequence[tuple[object, str]], where: str) -> str:
    """``{'key': expression, ...}`` with literal keys."""
    return "{" + ", ".join(f"{literal(k, where)}: {e}" for k, e in items) + "}"


def _listed(data: Mapping[str, object], what: str) -> list[object]:
    """The ``items`` of an encoded sequence (tuple, set, slice, namedtuple)."""
    items = data.get("items")
    if isinstance(items, list):
        return items
    raise UnsupportedValueError(f"{what}: a malformed recorded {_shown(data.get('$type'))}")


def _items(data: object, what: str) -> list[list[object]]:
    """The ``[key, value]`` pairs of an encoded dict (``{"$type": "dict", "items": [...]}``)."""
    if isinstance(data, dict) and data.get("$type") == "dict" and isinstance(data.get("items"), list):
        if all(isinstance(pair, list) and len(pair) == 2 for pair in data["items"]):
            return data["items"]
    raise UnsupportedValueError(f"{what}: a malformed recorded dict")


class SourceRenderer:
    """Turns recorded values into Python expressions for the generated files."""

    def __init__(self, capture: Capture, inline_module: str | None) -> None:
        self.capture = capture
        self.inline_module = inline_module
        self.needed_names: set[str] = set()
        self.init_tensors: dict[str, torch.Tensor] = {}
        self.uses_importlib = False
        self.uses_functools = False
        self.helpers: set[str] = set()
        self.required_modules: set[str] = set()
        self._tensor_keys: dict[int, str] = {}

    # -- objects by import path
    def import_expr(self, path: object, kind: str = "value") -> str:
        """An expression naming the object at ``path``: checked by the import rules (a name of the
        inlined module is written bare, as the inlined source defines it)."""
        try:
            module, parts = parse_import_path(path)
        except UntrustedCodeError as error:
            raise UnsupportedValueError(f"cannot write {_shown(path)} into a problem file: {error}") from None
        qualname = ".".join(identifier(p, f"import path {_shown(path)}") for p in parts)
        dotted(module, f"import path {_shown(path)}")
        if self.inline_module is not None and module == self.inline_module:
            self.needed_names.add(parts[0])  # the inlined source defines it at top level
            return qualname
        obj = self._resolve(str(path), kind)  # generated code names only what a capture may name (docs/security.md)
        if module == "builtins":
            return qualname
        if module == "torch" or module.startswith("torch."):
            if len(parts) == 1:
                for public in ("torch.nn", "torch.nn.functional", "torch"):
                    if getattr(importlib.import_module(public), qualname, None) is obj:
                        return f"{public}.{qualname}"
            if _attribute_path_works(module, qualname, obj):
                return f"{module}.{qualname}"
            return self._importlib(module, qualname)
        self.required_modules.add(module)
        return self._importlib(module, qualname)

    def _resolve(self, path: str, kind: str) -> object:
        try:
            return resolve_import(path, kind, [self.capture.repo.root])  # type: ignore[arg-type]
        except (ImportError, AttributeError) as error:
            raise RestoreError(f"{self.capture.ref}: cannot import {_shown(path, 120)} here ({error})") from None

    def _importlib(self, module: str, qualname: str) -> str:
        self.uses_importlib = True
        return f"importlib.import_module({literal(module, 'module')}).{qualname}"

    # -- typed JSON (constructor arguments) -> expression
    def encoded(self, data: object, where: str) -> str:
        """A recorded (typed JSON) value as an expression."""
        if data is None or isinstance(data, (bool, int, float, str)):
            return literal(data, where)
        if isinstance(data, list):
            return "[" + ", ".join(self.encoded(v, where) for v in data) + "]"
        if not isinstance(data, dict):
            raise UnsupportedValueError(f"{where}: a malformed recorded value")
        tag = data.get("$type")
        simple = self._simple(tag, data, where)
        if simple is not None:
            return simple
        if tag == "tensor":
            key = f"init.{len(self.init_tensors)}"
            self.init_tensors[key] = self.capture.tensor(data["id"])
            return f"_ml_init[{literal(key, where)}]"
        if tag == "module":
            entry = self.capture.metadata["constructions"][data["ref"]]
            return self.construction(entry, where)
        if tag == "namedtuple":
            return f"{self.import_expr(data['class'], 'class')}(" + ", ".join(
                self.encoded(v, where) for v in _listed(data, where)) + ")"
        if tag == "dataclass":
            return self._dataclass(data, where)
        if tag == "codec":
            return self._codec(data, where)
        raise UnsupportedValueError(f"{where}: a recorded {_shown(tag or type(data).__name__)} value cannot be "
                                    "written as Python source for the problem file")

    def _simple(self, tag: object, data: Mapping[str, object], where: str) -> str | None:
        """Containers and the scalar tags of the format, or ``None`` for the rest."""
        if tag == "tuple":
            items = [self.encoded(v, where) for v in _listed(data, where)]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if tag == "dict":
            return "{" + ", ".join(f"{self.encoded(k, where)}: {self.encoded(v, where)}"
                                   for k, v in _items(data, where)) + "}"
        if tag in ("set", "frozenset"):
            return f"{tag}([{', '.join(self.encoded(v, where) for v in _listed(data, where))}])"
        if tag == "float":
            value = data.get("value")
            if isinstance(value, str) and value.lower().lstrip("+-") in ("nan", "inf", "infinity"):
                return f"float({literal(value, where)})"
            raise UnsupportedValueError(f"{where}: {_shown(value)} is not a float value")
        if tag == "complex":
            return f"complex({self._number(data.get('real'), where)}, {self._number(data.get('imag'), where)})"
        if tag == "bytes":
            hex_text = data["hex"]
            try:
                if not isinstance(hex_text, str):
                    raise TypeError("not a string")
                return literal(bytes.fromhex(hex_text), where)
            except (TypeError, ValueError):
                raise UnsupportedValueError(f"{where}: malformed recorded bytes") from None
        if tag == "slice":
            return "slice(" + ", ".join(self.encoded(v, where) for v in _listed(data, where)) + ")"
        if tag == "ellipsis":
            return "..."
        if tag == "dtype":
            return _dtype(data.get("value"), where)
        if tag == "device":
            device = data["value"]
            try:
                if not isinstance(device, (str, int, torch.device)):
                    raise TypeError("not a device")
                return f"torch.device({literal(str(torch.device(device)), where)})"
            except (TypeError, RuntimeError):
                raise UnsupportedValueError(f"{where}: {_shown(data.get('value'))} is not a torch device") from None
        if tag == "size":
            value = data.get("value")
            if not (isinstance(value, list) and all(type(v) is int for v in value)):
                raise UnsupportedValueError(f"{where}: a malformed recorded torch.Size")
            return f"torch.Size({literal(value, where)})"
        if tag == "import":
            return self.import_expr(data["path"])
        return None

    @staticmethod
    def _number(value: object, where: str) -> str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return literal(float(value), where)
        raise UnsupportedValueError(f"{where}: {_shown(value)} is not a number")

    def _dataclass(self, data: Mapping[str, object], where: str) -> str:
        cls_expr = self.import_expr(data["class"], "class")
        path = str(data["class"])  # import_expr refused anything but an import path
        pairs = _items(data["fields"], where)
        cls = None if self._bare(path) else self._resolve(path, "class")
        if cls is not None and not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise UnsupportedValueError(f"{where}: {_shown(path)} is not a dataclass")
        init = {f.name for f in dataclasses.fields(cls) if f.init} if cls is not None else None
        first = [(k, self.encoded(v, where)) for k, v in pairs if init is None or k in init]
        later = [(k, self.encoded(v, where)) for k, v in pairs if init is not None and k not in init]
        if not later:
            return f"{cls_expr}({', '.join(keyword_arguments(first, where))})"
        self.helpers.add("_ml_dataclass")
        return f"_ml_dataclass({cls_expr}, {_dict_text(first, where)}, {_dict_text(later, where)})"

    def _bare(self, path: str) -> bool:
        return self.inline_module is not None and path.partition(":")[0] == self.inline_module

    def _codec(self, data: Mapping[str, object], where: str) -> str:
        """Codec values with a source form: what the codec's decoder does, written as Python."""
        name = data.get("codec")
        cls_expr = self.import_expr(data["class"], "class")
        path = str(data["class"])  # import_expr refused anything but an import path
        cls = None if self._bare(path) else self._resolve(path, "class")
        if name == "enum" and (cls is None or (isinstance(cls, type) and issubclass(cls, enum.Enum))):
            return f"{cls_expr}({self.encoded(data['value'], where)})"
        if name == "partial" and cls is functools.partial:
            return self._partial(data["value"], where)
        if name == CONFIG_CODEC and cls is not None and callable(getattr(cls, "from_dict", None)):
            fields = {k: v for k, v in _items(data["value"], where) if isinstance(k, str)}
            if "config" not in fields:
                raise UnsupportedValueError(f"{where}: a malformed recorded {data['class']} configuration")
            runtime = [(k, self.encoded(fields[k], where)) for k in _RUNTIME_CONFIG_KEYS if fields.get(k) is not None]
            return f"{cls_expr}.from_dict({', '.join([self.encoded(fields['config'], where), *keyword_arguments(runtime, where)])})"
        raise UnsupportedValueError(
            f"{where}: a {_shown(name)} codec value ({_shown(data.get('class'))}) cannot be written as Python source "
            "for the problem file (problem files write enums, functools.partial, dataclasses, namedtuples and "
            "transformers configurations; a value of a register_codec type has no source form)")

    def _partial(self, value: object, where: str) -> str:
        parts = {k: v for k, v in _items(value, where) if isinstance(k, str)}
        if "func" not in parts:
            raise UnsupportedValueError(f"{where}: a malformed recorded functools.partial")
        args = parts.get("args", {"$type": "tuple", "items": []})
        keywords = _items(parts.get("keywords", {"$type": "dict", "items": []}), where)
        self.uses_functools = True
        positional = _listed(args if isinstance(args, Mapping) else {}, where)
        text = [self.encoded(parts["func"], where), *(self.encoded(a, where) for a in positional)]
        text += keyword_arguments(((k, self.encoded(v, where)) for k, v in keywords), where)
        return f"functools.partial({', '.join(text)})"

    def construction(self, entry: Construction, where: str) -> str:
        """A nested module's recorded construction as ``Class(args, kwargs)``."""
        args = [self.encoded(a, where) for a in entry["args"]]
        args += keyword_arguments(((k, self.encoded(v, where)) for k, v in entry["kwargs"].items()), where)
        return f"{self.import_expr(entry['class'], 'module')}({', '.join(args)})"

    def tensor_key(self, tensor: torch.Tensor) -> str | None:
        """The data-file key a call-input tensor was stored under by :meth:`value`."""
        return self._tensor_keys.get(id(tensor))

    # -- live values (call inputs) -> expression
    def value(self, value: object, key: str, tensors: dict[str, torch.Tensor]) -> str:
        """A call input as an expression over ``t`` (the inputs file); tensors are stored in ``tensors``."""
        if isinstance(value, torch.Tensor):
            existing = self._tensor_keys.get(id(value))
            if existing is None:
                tensors[key] = value.detach()
                self._tensor_keys[id(value)] = existing = key
            return f"t[{literal(existing, key)}]"
        if value is None or type(value) in (bool, int, float, str, bytes):
            return literal(value, key)
        if value is Ellipsis:
            return "..."
        if type(value) is complex:
            return f"complex({literal(value.real, key)}, {literal(value.imag, key)})"
        if isinstance(value, torch.dtype):
            return _dtype(str(value).removeprefix("torch."), key)
        if isinstance(value, torch.device):
            return f"torch.device({literal(str(value), key)})"
        if isinstance(value, torch.Size):
            return f"torch.Size({literal(list(value), key)})"
        if type(value) is list:
            return "[" + ", ".join(self.value(v, f"{key}.{i}", tensors) for i, v in enumerate(value)) + "]"
        if type(value) is tuple:
            items = [self.value(v, f"{key}.{i}", tensors) for i, v in enumerate(value)]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if type(value) is dict:
            return "{" + ", ".join(f"{literal(k, key)}: {self.value(v, f'{key}.{k}', tensors)}"
                                   for k, v in value.items()) + "}"
        if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
            return self.import_expr(import_path(value))
        if is_state_object(value):  # e.g. a transformers cache: rebuilt from its attributes, as load does
            self.helpers.add("_ml_state")
            attributes = ", ".join(f"{literal(k, key)}: {self.value(v, f'{key}.{k}', tensors)}"
                                   for k, v in state_attributes(value).items())
            return f"_ml_state({self.import_expr(import_path(type(value)), 'class')}, {{{attributes}}})"
        raise UnsupportedValueError(f"{key}: a {type(value).__module__}.{type(value).__qualname__} argument cannot be "
                                    "written into a KernelBench problem")


def _attribute_path_works(module: str, qualname: str, obj: object) -> bool:
    try:
        current: object = importlib.import_module(module.split(".")[0])
        for part in module.split(".")[1:] + qualname.split("."):
            current = getattr(current, part)
        return current is obj
    except (ImportError, AttributeError):
        return False
