"""Identity of source code kept with a capture: the hash both capture and restore compare."""

from __future__ import annotations

import inspect
import os
import weakref

from modulelens.format.tensors import hash_bytes

# class -> ((source file, its mtime_ns and size), hash of the class's source)
_CLASS_HASHES: weakref.WeakKeyDictionary[type, tuple[tuple[str, int, int], str | None]] = weakref.WeakKeyDictionary()


def source_hash(text: str) -> str:
    """Content hash of a source text (the same algorithm as payloads)."""
    return hash_bytes(text.encode("utf-8"))


def class_source(cls: type) -> str | None:
    """The source text of ``cls``'s own definition, or None when Python cannot find it."""
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return None


def class_source_hash(cls: type) -> str | None:
    """``source_hash(class_source(cls))``, remembered while the class's file is unchanged on disk.

    ``inspect.getsource`` parses the whole defining file on every call (~3 ms for a small file),
    and every load compares each captured class with the current one
    (:func:`modulelens.restore.source.source_changes`), so uncached it was a tenth of the time to
    a runnable module (benchmarks/bench_save_load.py). Keyed on the file's mtime and size because
    ``getsource`` reads the file as it is now, not as it was imported.
    """
    key = None
    try:
        file = inspect.getsourcefile(cls)
        if file:
            info = os.stat(file)
            key = (file, info.st_mtime_ns, info.st_size)
    except (OSError, TypeError):  # a builtin class, or its file is gone: nothing to key on
        pass
    known = _CLASS_HASHES.get(cls) if key is not None else None
    if known is not None and known[0] == key:
        return known[1]
    own = class_source(cls)
    digest = source_hash(own) if own is not None else None
    if key is not None:
        _CLASS_HASHES[cls] = (key, digest)
    return digest
