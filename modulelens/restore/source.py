"""Running the source stored with a capture: only with the user's trust (docs/security.md).

When a class a capture names cannot be imported here (a ``__main__`` class, a script folder that is
not on the path), the capture may hold the defining file's source (see
:mod:`modulelens.tracing.source`). :class:`modulelens.restore.classes.ClassResolver` runs it only
when the user trusts the capture's source (``load(..., trust_source=True)``, ``--trust-source``, or a
repo the user marked trusted); even then only the classes the capture names and what they depend
on run (imports, helper functions, constants: :mod:`modulelens.restore.source_slice`), not the rest
of a script (its training loop, an ``if __name__ == "__main__":`` block). Class bodies, decorators,
default arguments and the module-level statements they need do run: that is why this needs trust.

When the class that is imported has changed since the capture (its source hash differs), or a
captured script's file changed on disk, a :class:`SourceChangedWarning` is issued and noted.
"""

from __future__ import annotations

import os
import stat
import sys
import types
from typing import Any

from modulelens.errors import RestoreError
from modulelens.format.imports import AllowHere, import_checked
from modulelens.format.sources import class_source_hash, source_hash
from modulelens.format.spec import SourceFile
from modulelens.restore.source_slice import slice_source

_MAX_SOURCE_BYTES = 16 << 20
_EXECUTED: dict[tuple[str, tuple[str, ...]], types.ModuleType] = {}  # (source hash, roots) -> module, per process
def module_from_source(module_name: str, entry: SourceFile, text: str, wanted: str) -> types.ModuleType:
    """The classes a capture names from a stored source file (and ``wanted``, a qualified name),
    with what they depend on, as a fresh module (cached per source hash and classes). Runs code
    from the capture: callers check the user's trust first."""
    digest = source_hash(text)  # the text's own hash: a claimed one could alias another capture's module
    # The classes by their top-level name (a class defined in a function needs that function): the
    # slice executed is what they depend on (restore/source_slice.py).
    names = [q for q in entry.get("classes", {}) if isinstance(q, str)]
    roots = tuple(sorted({q.partition(".")[0] for q in [*names, wanted]}))
    cached = _EXECUTED.get((digest, roots))
    if cached is not None:
        return cached
    safe = "".join(c if c.isalnum() else "_" for c in module_name)
    name = f"modulelens_source.{safe}_{digest.partition(':')[2][:12]}"
    module = types.ModuleType(name)
    module.__file__ = entry.get("file") or f"<captured {module_name}>"
    sys.modules[name] = module  # dataclasses and typing look classes' modules up here
    try:
        code = compile(slice_source(text, module.__file__, roots), module.__file__, "exec")
        exec(code, module.__dict__)  # the user's own captured source; see the module docstring
    except Exception as error:
        del sys.modules[name]
        raise RestoreError(f"the source stored for {module_name} ({module.__file__}) does not run here: "
                           f"{type(error).__name__}: {error}") from None
    _EXECUTED[(digest, roots)] = module
    return module


def built_from_stored_source(cls: type) -> bool:
    """Whether ``cls`` was defined by source stored with a capture (run by :func:`module_from_source`
    after the user's trust was checked), rather than imported from installed code.

    The kernel exporter inlines a class's stored source into ``problem.py`` only when this holds, so a
    capture's text reaches generated code exactly when the user let it run on load.

    Example::

        built_from_stored_source(cap.module_type)   # True for a trusted __main__ class
    """
    home = sys.modules.get(getattr(cls, "__module__", None) or "")
    return home is not None and any(home is module for module in _EXECUTED.values())


def lookup(module: types.ModuleType, qualname: str, entry: SourceFile) -> object:
    """``qualname`` in a module built from stored source; a class defined in a function is
    re-created from its own stored text (runs code: callers check trust first)."""
    if "<locals>" in qualname:  # re-create a class defined in a function from its own source
        text = entry.get("classes", {}).get(qualname, {}).get("text")
        if text is None:
            raise AttributeError(qualname)
        import textwrap

        namespace = dict(module.__dict__)
        exec(compile(textwrap.dedent(text), module.__file__ or "<captured>", "exec"), namespace)
        return namespace[qualname.rsplit(".", 1)[-1]]
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def source_changes(sources: dict[str, SourceFile], forbidden: list[str],
                   allow_here: AllowHere | None = None) -> list[str]:
    """Messages about captured user classes whose code is not what was captured (the caller
    notes them and warns with :class:`SourceChangedWarning`). Only modules the import rules allow
    are imported to compare (:func:`modulelens.format.imports.import_checked`, with ``allow_here``)."""
    changed: list[str] = []
    for module_name, entry in sources.items():
        if module_name == "__main__" or not entry.get("classes"):
            changed.extend(_file_changes(module_name, entry))
            continue
        for qualname, info in entry["classes"].items():
            if info.get("hash") is None or "<locals>" in qualname:
                continue
            try:
                current = class_source_hash(import_checked(f"{module_name}:{qualname}", forbidden, allow_here))
            except Exception:  # not importable (or refused) here: the stored source would be used
                continue
            if current is not None and current != info["hash"]:
                changed.append(f"{module_name}.{qualname} has changed since it was captured "
                               f"(its source differs); replay may not match")
    return changed


def _file_changes(module_name: str, entry: SourceFile) -> list[str]:
    file = entry.get("file")
    if not isinstance(file, str) or not file or not entry.get("hash"):
        return []
    try:  # the path comes from the capture: read only a regular file of source-like size
        info = os.stat(file)
    except (OSError, ValueError):
        return []
    if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_SOURCE_BYTES:
        return []
    try:
        with open(file, encoding="utf-8") as handle:
            current = handle.read()
    except (OSError, UnicodeDecodeError):
        return []
    if source_hash(current) == entry["hash"]:
        return []
    return [f"{file} ({module_name}) has changed since it was captured; the captured source is used"]
