"""Checking an op trace document against the format before anything uses it (docs/format.md,
"Op traces"): the same rules as a capture's (format/validate_fields.py), and every index (module,
parent, source, op range) and kept value inside what exists.
"""

from __future__ import annotations

import re
from typing import Any, cast

from modulelens.errors import CorruptCaptureError
from modulelens.format.spec import OP_TRACE_FORMAT, OP_TRACE_VERSION, OpTraceDocument
from modulelens.format.validate_fields import DTYPE_NAME, FieldChecker

_FINGERPRINT = re.compile(r"xxh3_128:[0-9a-f]{32}")
_SCALARS = (type(None), bool, int, float, str)


class _TraceChecker(FieldChecker):
    """An op trace document (docs/format.md, "Op traces"): the same rules as the capture's, and
    every index (module, parent, source, op range) and kept value inside what exists."""

    def __init__(self, doc: dict[str, Any], where: str, value_entry: Any) -> None:
        super().__init__(doc, where)
        self.value_entry = value_entry

    def document(self) -> None:
        doc = self.meta
        if doc.get("format") != OP_TRACE_FORMAT:
            raise self.fail("format", f"{doc.get('format')!r} is not {OP_TRACE_FORMAT!r}")
        version = self.field(doc, "version", int, "trace")
        if version > OP_TRACE_VERSION:
            raise self.fail("version", f"op trace version {version}; this modulelens reads up to {OP_TRACE_VERSION} "
                                       "(upgrade modulelens)")
        sources = self.field(doc, "sources", list, "trace")
        for i, text in enumerate(sources):
            self.expect(text, str, f"sources[{i}]")
        for key in ("truncated", "values_dropped", "values_bytes"):
            if (self.field(doc, key, int, "trace", optional=True) or 0) < 0:
                raise self.fail(key, "negative")
        ops = self.field(doc, "ops", list, "trace")
        modules = self.field(doc, "modules", list, "trace")
        if not modules:
            raise self.fail("modules", "empty (the traced module's own call is modules[0])")
        for i, call in enumerate(modules):
            where = f"modules[{i}]"
            self.expect(call, dict, where)
            self.field(call, "path", str, where)
            self.field(call, "class", str, where)
            parent = self.field(call, "parent", int, where)
            if not (parent == -1 if i == 0 else 0 <= parent < i):
                raise self.fail(f"{where}.parent", f"{parent} is not an earlier module call")
            start, end = self.field(call, "start", int, where), self.field(call, "end", int, where)
            if not 0 <= start <= end <= len(ops):
                raise self.fail(where, f"ops [{start}, {end}) are not within the {len(ops)} ops")
            self.outputs(self.field(call, "outputs", list, where), f"{where}.outputs")
        for i, op in enumerate(ops):
            where = f"ops[{i}]"
            self.expect(op, dict, where)
            self.field(op, "op", str, where)
            if not 0 <= self.field(op, "module", int, where) < len(modules):
                raise self.fail(f"{where}.module", f"{op['module']} is not one of the {len(modules)} module calls")
            if not -1 <= self.field(op, "source", int, where) < len(sources):
                raise self.fail(f"{where}.source", f"{op['source']} is not one of the {len(sources)} sources")
            for k, item in enumerate(self.field(op, "inputs", list, where)):
                item = self.expect(item, list, f"{where}.inputs[{k}]")
                if len(item) != 2 or not isinstance(item[0], str):
                    raise self.fail(f"{where}.inputs[{k}]", "not [dtype, shape]")
                self.dims(self.expect(item[1], list, f"{where}.inputs[{k}]"), f"{where}.inputs[{k}]")
            self.outputs(self.field(op, "outputs", list, where), f"{where}.outputs")

    def outputs(self, values: list[Any], where: str) -> None:
        for k, value in enumerate(values):
            here = f"{where}[{k}]"
            self.expect(value, dict, here)
            if "scalar" in value:
                self.expect(value["scalar"], _SCALARS, f"{here}.scalar")
                continue
            dtype = self.field(value, "dtype", str, here)
            if not DTYPE_NAME.fullmatch(dtype):
                raise self.fail(f"{here}.dtype", f"{dtype!r} is not a dtype name")
            shape = self.dims(self.field(value, "shape", list, here), f"{here}.shape")
            fingerprint = self.field(value, "fingerprint", (str, type(None)), here, optional=True)
            if fingerprint is not None and not _FINGERPRINT.fullmatch(fingerprint):
                raise self.fail(f"{here}.fingerprint", "not xxh3_128:<32 hex digits>")
            stats = self.field(value, "stats", (dict, type(None)), here, optional=True)
            for key, number in (stats or {}).items():
                if not isinstance(number, (int, float, str, type(None))):
                    raise self.fail(f"{here}.stats.{key}", f"expected a number, found {type(number).__name__}")
            tid = self.field(value, "value", str, here, optional=True)
            if tid is not None:
                entry = self.value_entry(tid)
                if entry is None or entry.get("dtype") != dtype or list(entry.get("shape", ())) != shape:
                    raise self.fail(f"{here}.value", f"{tid!r} is not a stored {dtype}{shape} tensor")


def validate_op_trace(data: object, where: str, value_entry: Any) -> OpTraceDocument:
    """``data`` as an op trace document, after checking it against the format.

    Args:
        data: the parsed trace document.
        where: names the document in errors.
        value_entry: ``value_entry(id)`` -> the ``{"dtype", "shape"}`` of a kept value (an entry of
            the capture's tensor table), or ``None`` when there is no such tensor.

    Returns:
        The same object, typed.

    Raises:
        CorruptCaptureError: the first problem found, naming its field.

    Example::

        doc = validate_op_trace(json.loads(text), "ranker/mlp:v3 calls[0].op_trace", meta["tensors"].get)
    """
    if not isinstance(data, dict):
        raise CorruptCaptureError(f"{where}: not an op trace")
    try:
        _TraceChecker(data, where, value_entry).document()
    except RecursionError:
        raise CorruptCaptureError(f"{where}: nested too deeply") from None
    return cast(OpTraceDocument, data)
