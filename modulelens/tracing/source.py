"""Source code stored with a capture, so classes that cannot be imported later still restore.

A class defined in ``__main__`` (a script or a notebook), in a script folder that is not on the
path of the loading process, or inside a function cannot be imported by path in another process.
For every class a capture references that comes from the user's own code (not the standard
library or an installed package) the capture keeps the text of the defining file and a hash of
the class's own source; see :mod:`modulelens.restore.source` for how it is used on load.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from typing import Any

from modulelens.format.sources import class_source, source_hash
from modulelens.format.spec import CaptureMetadata, ClassSource, SourceFile
from modulelens.format.values import import_object

MAX_SOURCE_BYTES = 2_000_000  # a bigger file keeps only its hash
_CLASS_KEYS = ("class", "path", "type")


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.realpath(path))
    return tuple(sorted(roots))


def is_user_module(module_name: str) -> bool:
    """The user's own code: ``__main__``, or a file outside the stdlib and installed packages."""
    if module_name == "__main__":
        return True
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if not file:
        return False
    return not _library_file(file)


@functools.lru_cache(maxsize=4096)
def _library_file(file: str) -> bool:
    """Whether a module file is the standard library's or an installed package's (asked for every
    class a capture names, on every save: ``realpath`` was a fifth of a whole-model save's encoding)."""
    real = os.path.realpath(file)
    if any(part in ("site-packages", "dist-packages") for part in real.split(os.sep)):
        return True
    return any(real.startswith(root + os.sep) for root in _library_roots())


@functools.lru_cache(maxsize=64)
def _file_text(path: str, mtime_ns: int, size: int) -> str:
    """A file's text, read once per version of the file (every capture of a job names the same
    files: a 5,000-line script was re-read and re-hashed on each save)."""
    with open(path, encoding="utf-8") as handle:
        return handle.read()


@functools.lru_cache(maxsize=64)
def _text_hash(text: str) -> str:
    return source_hash(text)


def _module_text(module_name: str) -> tuple[str | None, str | None]:
    """``(file, text)`` of a module's source; a notebook's ``__main__`` gives its cell history."""
    module = sys.modules.get(module_name)
    # CPython deletes ``__main__.__file__`` once the script has run, before ``atexit`` handlers
    # (which save what `modulelens run` captured last); its loader still knows the path.
    file = getattr(module, "__file__", None) or getattr(getattr(module, "__loader__", None), "path", None)
    if file:
        path = os.path.abspath(file)
        try:
            stat = os.stat(path)
            return path, _file_text(path, stat.st_mtime_ns, stat.st_size)
        except (OSError, UnicodeDecodeError):
            return path, None
    cells = getattr(module, "In", None)  # IPython keeps every executed cell in __main__.In
    if isinstance(cells, list) and all(isinstance(c, str) for c in cells):
        return "<ipython>", "\n\n".join(cells)
    return None, None


def referenced_paths(meta: Mapping[str, object]) -> set[str]:
    """Every ``module:Qual.Name`` import path in capture metadata."""
    found: set[str] = set()
    seen: set[int] = set()

    def walk(node: dict[str, object] | list[object]) -> None:
        # Containers only are visited: a capture of many calls holds tens of thousands of scalars.
        # Each once: constructor arguments share the encoding of an object many records hold (a config).
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _CLASS_KEYS and isinstance(value, str) and ":" in value:
                    found.add(value)
                elif isinstance(value, (dict, list)):
                    walk(value)
        else:
            for item in node:
                if isinstance(item, (dict, list)):
                    walk(item)

    walk({k: v for k, v in meta.items() if k not in ("environment", "tensors")})
    return found


def collect_sources(meta: CaptureMetadata, classes: Iterable[type] = ()) -> dict[str, SourceFile]:
    """``{module name: {file, hash, text, classes: {qualname: {hash[, text]}}}}`` for user code."""
    objects: dict[str, Any] = {f"{c.__module__}:{c.__qualname__}": c for c in classes}
    for path in referenced_paths(meta):
        if path not in objects and is_user_module(path.partition(":")[0]):
            try:
                objects[path] = import_object(path)
            except Exception:  # best effort: a path we cannot resolve gets no source
                continue
    sources: dict[str, SourceFile] = {}
    for path, obj in sorted(objects.items()):
        module_name, _, qualname = path.partition(":")
        if not is_user_module(module_name):
            continue
        entry = sources.get(module_name)
        if entry is None:
            file, text = _module_text(module_name)
            entry = {"file": file, "hash": _text_hash(text) if text is not None else None, "classes": {}}
            if text is not None and len(text.encode("utf-8")) <= MAX_SOURCE_BYTES:
                entry["text"] = text
            elif text is not None:
                entry["omitted"] = f"source larger than {MAX_SOURCE_BYTES} bytes"
            sources[module_name] = entry
        own = class_source(obj) if isinstance(obj, type) else None
        info = ClassSource(hash=source_hash(own) if own is not None else None)
        if own is not None and "<locals>" in qualname:
            info["text"] = own  # a class defined in a function: re-created from its own source
        entry["classes"][qualname] = info
    return sources
