"""Identity of source code kept with a capture: the hash both capture and restore compare."""

from __future__ import annotations

import inspect

from modulelens.format.tensors import hash_bytes


def source_hash(text: str) -> str:
    """Content hash of a source text (the same algorithm as payloads)."""
    return hash_bytes(text.encode("utf-8"))


def class_source(cls: type) -> str | None:
    """The source text of ``cls``'s own definition, or None when Python cannot find it."""
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return None
