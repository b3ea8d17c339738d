"""Checking a stored tool report (profile, verify, replay, kernel) before anything shows or copies it.

Reports live beside a version (``reports/<kind>-<stamp>-<id>.json``) and travel with push and
pull, so a report may come from anyone, like a capture's metadata (:mod:`.validate`). A report is
an open JSON object: a tool may add fields, and a reader ignores the ones it does not know. The
fields readers do use (the UI's tables and plots, ``show``'s list, ``modulelens.Repo.reports``)
must have the types the tools write: a number where a number is drawn, a list of objects where a
table is built. Non-finite numbers are the strings ``"nan"``, ``"inf"`` and ``"-inf"``
(``tools/reports.json_safe``). Anything else is a :class:`CorruptCaptureError` naming the field.
Nesting and size are bounded; nothing here imports or calls anything a report names.
"""

from __future__ import annotations

from collections.abc import Mapping

from modulelens.errors import CorruptCaptureError

MAX_DEPTH = 64  # nesting of a report's JSON (a report nested 200,000 deep is refused before it is used)
MAX_ITEMS = 1 << 20  # values in one report, counted over every level
NON_FINITE = frozenset({"nan", "inf", "-inf"})

_NUMBER = "number"  # int or float (not bool), or one of NON_FINITE
_TEXT = "text"
_FLAG = "flag"
_COUNT = "count"
_OBJECTS = "objects"  # a list of objects
_TEXTS = "texts"  # a list of strings
_OBJECT = "object"

# Fields by where they are in a report: each optional, ``None`` allowed wherever it is.
_TOP: dict[str, str] = {
    "kind": _TEXT, "created": _TEXT, "ref": _TEXT, "device": _TEXT, "mode": _TEXT,
    "status": _TEXT, "error": _TEXT, "passed": _FLAG, "speedup": _NUMBER, "notes": _TEXTS, "failures": _TEXTS,
    "calls": _OBJECTS, "top_ops": _OBJECTS, "batch_sweep": _OBJECTS, "latency": _OBJECT, "memory": _OBJECT,
    "flops": _OBJECT, "bytes_moved": _OBJECT, "achieved_flops_per_s": _NUMBER, "arithmetic_intensity": _NUMBER,
    "unverified": _TEXTS,
}
_PARTS: dict[str, dict[str, str]] = {
    "calls": {"index": _COUNT, "passed": _FLAG, "status": _TEXT, "error": _TEXT, "detail": _TEXT,
              "max_abs_error": _NUMBER, "max_rel_error": _NUMBER, "mean_abs_error": _NUMBER, "mean_rel_error": _NUMBER},
    "top_ops": {"name": _TEXT, "self_ms_per_iter": _NUMBER, "percent": _NUMBER},
    "batch_sweep": {"batch_size": _COUNT, "median_ms": _NUMBER, "p10_ms": _NUMBER, "p90_ms": _NUMBER,
                    "throughput_per_s": _NUMBER, "achieved_flops_per_s": _NUMBER, "flops": _NUMBER, "error": _TEXT},
    "latency": {"median_ms": _NUMBER, "p10_ms": _NUMBER, "p90_ms": _NUMBER, "iterations": _COUNT},
    "memory": {"peak_bytes": _NUMBER},
    "flops": {"total": _NUMBER},
    "bytes_moved": {"total": _NUMBER},
}


def validate_report(data: object, where: str) -> dict[str, object]:
    """Check a parsed report; return it unchanged.

    Args:
        data: the report's parsed JSON.
        where: what to name in an error (the report's file).

    Returns:
        ``data``, a dict whose known fields have the types the tools write.

    Raises:
        CorruptCaptureError: not an object, nested too deep, too big, or a known field of another type.

    Example::

        validate_report({"kind": "profile", "latency": {"median_ms": 1.5}}, "profile-1.json")   # fine
        validate_report({"kind": "verify", "calls": [{"max_abs_error": [1]}]}, "verify-1.json")
        # CorruptCaptureError: verify-1.json: calls[0].max_abs_error: expected a number, found list
    """
    if not isinstance(data, dict):
        raise CorruptCaptureError(f"{where}: a report must be a JSON object, found {type(data).__name__}")
    _bounded(data, where)
    _fields(data, _TOP, where, "")
    for part, fields in _PARTS.items():
        value = data.get(part)
        if isinstance(value, list):
            for i, item in enumerate(value):
                _fields(item, fields, where, f"{part}[{i}].")
        elif isinstance(value, dict):
            _fields(value, fields, where, f"{part}.")
    return data


def is_number(value: object) -> bool:
    """A number a report may hold: int or float (not bool), or ``"nan"``/``"inf"``/``"-inf"``."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) or (isinstance(value, str) and value in NON_FINITE)


def _fields(obj: Mapping[str, object], fields: dict[str, str], where: str, prefix: str) -> None:
    for key, kind in fields.items():
        value = obj.get(key)
        if value is not None and not _is(value, kind):
            raise CorruptCaptureError(f"{where}: {prefix}{key}: expected {_NAMES[kind]}, found {type(value).__name__}")


def _is(value: object, kind: str) -> bool:
    if kind == _NUMBER:
        return is_number(value)
    if kind == _COUNT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _TEXT:
        return isinstance(value, str)
    if kind == _FLAG:
        return isinstance(value, bool)
    if kind == _OBJECT:
        return isinstance(value, dict)
    if kind == _TEXTS:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)  # _OBJECTS


_NAMES = {_NUMBER: "a number", _COUNT: "an integer", _TEXT: "a string", _FLAG: "true or false",
          _OBJECT: "an object", _TEXTS: "a list of strings", _OBJECTS: "a list of objects"}


def _bounded(data: object, where: str) -> None:
    """Refuse a report nested deeper than :data:`MAX_DEPTH` or holding more than :data:`MAX_ITEMS` values
    (walked with a list, not recursion: a deep report must not exhaust the stack)."""
    pending: list[tuple[object, int]] = [(data, 0)]
    seen = 0
    while pending:
        value, depth = pending.pop()
        seen += 1
        if seen > MAX_ITEMS:
            raise CorruptCaptureError(f"{where}: more than {MAX_ITEMS:,} values")
        if isinstance(value, (dict, list)):
            if depth >= MAX_DEPTH:
                raise CorruptCaptureError(f"{where}: nested more than {MAX_DEPTH} deep")
            children = value.values() if isinstance(value, dict) else value
            pending.extend((child, depth + 1) for child in children)
