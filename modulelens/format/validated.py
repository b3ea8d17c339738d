"""Capture documents this process has found valid, remembered by the hash of their bytes, so that
loading the same ``capture.json`` again does not check it again.

The check (:func:`modulelens.format.validate.validate_capture`) is a function of the bytes alone, so
skipping it for bytes already found valid skips only a repetition; it was three quarters of reading
a 1 GiB capture's metadata on every load (220 of 285 us, issue 37, benchmarks/bench_save_load.py).
Changed bytes (a damaged or edited file) hash differently and are checked afresh.
"""

from __future__ import annotations

import xxhash

from modulelens.format.validate import validate_capture

_TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~2 ms of a fresh `show`, issue 37)
if _TYPE_CHECKING:
    from typing import Any

    from modulelens.format.spec import CaptureMetadata

# (xxh3-128 of the bytes, whether every call was checked) of each document found valid; cleared when
# full. xxh3-128 detects accidental equality, which is all a repetition needs: a document made to
# collide with another one this process checked would have to be crafted against a known document.
_FOUND_VALID: set[tuple[bytes, bool]] = set()
_FOUND_VALID_MAX = 4096


def validated_capture(data: Any, source: bytes, where: str, *, calls: bool = True) -> CaptureMetadata:
    """``data``, parsed from ``source``, as capture metadata: checked with
    :func:`~modulelens.format.validate.validate_capture` unless this process found the same bytes
    valid before.

    Args:
        data: the parsed document.
        source: the bytes it was parsed from.
        where: names the document in errors.
        calls: check every recorded call too (see ``validate_capture``).

    Returns:
        The same object, typed.

    Raises:
        CorruptCaptureError: the first problem found, naming its field.

    Example::

        meta = validated_capture(json.loads(raw), raw, "mlp:v3")
    """
    seen = (xxhash.xxh3_128_digest(source), calls)
    if seen in _FOUND_VALID:
        return data  # found valid before: the same bytes, so the same document
    checked = validate_capture(data, where, calls=calls)
    if len(_FOUND_VALID) >= _FOUND_VALID_MAX:
        _FOUND_VALID.clear()
    _FOUND_VALID.add(seen)
    return checked
