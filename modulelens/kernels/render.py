"""Recorded values as Python source for the generated problem files.

:class:`SourceRenderer` writes constructor arguments (typed JSON from the capture) and live call
inputs as Python expressions: plain values as literals, tensors as keys into the data files,
objects by import path (``torch.nn.functional.gelu``, ``importlib.import_module(...)``), names of
the inlined module as bare names. Anything it cannot write raises :class:`UnsupportedValueError`
naming the argument: a problem file never gets a made-up value.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import torch

from modulelens.errors import UnsupportedValueError
from modulelens.format.imports import resolve_import
from modulelens.restore.loader import Capture


class SourceRenderer:
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
        if self.inline_module is None or module != self.inline_module:
            resolve_import(path)  # generated code names only what a capture may name (docs/security.md)
        if module == "builtins":
            return qualname
        if self.inline_module is not None and module == self.inline_module and "." not in qualname:
            self.needed_names.add(qualname)
            return qualname
        if module == "torch" or module.startswith("torch."):
            obj = resolve_import(path)
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
