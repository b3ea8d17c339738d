"""The checks every JSON document modulelens reads shares (format/validate.py, format/validate_trace.py):
a field of the right JSON type, a list or table of bounded length, a shape of bounded rank and
sizes, each failure a :class:`CorruptCaptureError` naming the document and the field.
"""

from __future__ import annotations

import re

from modulelens.errors import CorruptCaptureError

_TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~2 ms of a fresh `show`, issue 37)
if _TYPE_CHECKING:
    from typing import Any

MAX_NDIM = 64
MAX_NUMEL = 1 << 50
MAX_ITEMS = 1 << 22  # entries in any one table or list
DTYPE_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")  # any torch dtype's name (qint8, uint4...): torch checks it exists


class FieldChecker:
    """Checks fields of the document ``doc``, naming ``where`` in each error.

    Args:
        doc: the parsed document.
        where: names the document in errors (its path or ref).
    """

    def __init__(self, doc: dict[str, Any], where: str) -> None:
        self.meta = doc
        self.where = where

    def fail(self, field: str, problem: str) -> CorruptCaptureError:
        return CorruptCaptureError(f"{self.where}: {field}: {problem}")

    def expect(self, value: Any, kind: type | tuple[type, ...], field: str) -> Any:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise self.fail(field, f"expected {names}, found {type(value).__name__}")
        if isinstance(value, (list, dict)) and len(value) > MAX_ITEMS:
            raise self.fail(field, f"{len(value)} entries (at most {MAX_ITEMS})")
        return value

    def field(self, obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str,
              optional: bool = False) -> Any:
        if key not in obj:
            if optional:
                return None
            raise self.fail(where, f"missing {key!r}")
        value = obj[key]
        # the common case without building the field's name: validation is on every load's path
        # (len of obj[key]: `type(value) is kind` narrows `value` to object for the type checker)
        if type(value) is kind and ((kind is not list and kind is not dict) or len(obj[key]) <= MAX_ITEMS):
            return value
        return self.expect(value, kind, f"{where}.{key}")

    def dims(self, values: list[Any], where: str) -> list[int]:
        if len(values) > MAX_NDIM:
            raise self.fail(where, f"{len(values)} dimensions (at most {MAX_NDIM})")
        for value in values:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value > MAX_NUMEL:
                raise self.fail(where, f"{value!r} is not a size")
        return values
