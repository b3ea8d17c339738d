"""Resolve the classes a capture names, falling back to the source stored with it.

Order for ``module:Qual.Name``: import it (a ``__main__`` path only counts when this process runs
the very script that was captured); if that fails, and the capture stored the defining file (see
:mod:`modulelens.tracing.source`), execute that file's *definitions* into a fresh module and take
the class from there. This is the one place where code from a capture runs: it is the user's own
source, recorded from their job. Only imports, ``def``/``class`` statements, ``try`` blocks of
imports and simple assignments run; everything else at module level (a training loop, an
``if __name__ == "__main__":`` block, calls) is skipped.

When the class that is imported has changed since the capture (its source hash differs), or a
captured script's file changed on disk, a :class:`SourceChangedWarning` is issued and noted.
"""

from __future__ import annotations

import ast
import os
import sys
import types
from typing import Any

from modulelens.errors import RestoreError
from modulelens.format.sources import class_source, source_hash
from modulelens.format.values import import_object

_EXECUTED: dict[str, types.ModuleType] = {}  # source hash -> module built from it (one per process)
_SAFE_CALLS = {"namedtuple", "NamedTuple", "TypeVar", "NewType", "ParamSpec", "getLogger", "field", "dataclass",
               "make_dataclass", "Enum", "IntEnum", "partial", "frozenset", "set", "dict", "list", "tuple", "cast"}


def _call_names(node: ast.AST) -> set[str]:
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "?"))
    return names


def _is_definition(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        value = node.value
        return value is None or _call_names(value) <= _SAFE_CALLS
    if isinstance(node, ast.Try):
        body = [*node.body, *node.orelse, *node.finalbody, *(s for h in node.handlers for s in h.body)]
        return all(_is_definition(s) or isinstance(s, ast.Pass) for s in body)
    return False


def definitions_only(text: str, filename: str) -> ast.Module:
    """The module's imports, definitions and simple assignments (see the module docstring)."""
    tree = ast.parse(text, filename=filename)
    tree.body = [node for node in tree.body if _is_definition(node)]
    return tree


def _module_from_source(module_name: str, entry: dict[str, Any]) -> types.ModuleType:
    digest = entry["hash"]
    cached = _EXECUTED.get(digest)
    if cached is not None:
        return cached
    safe = "".join(c if c.isalnum() else "_" for c in module_name)
    name = f"modulelens_source.{safe}_{digest.partition(':')[2][:12]}"
    module = types.ModuleType(name)
    module.__file__ = entry.get("file") or f"<captured {module_name}>"
    sys.modules[name] = module  # dataclasses and typing look classes' modules up here
    try:
        code = compile(definitions_only(entry["text"], module.__file__), module.__file__, "exec")
        exec(code, module.__dict__)  # the user's own captured source; see the module docstring
    except Exception as error:
        del sys.modules[name]
        raise RestoreError(f"the source stored for {module_name} ({module.__file__}) does not run here: "
                           f"{type(error).__name__}: {error}") from None
    _EXECUTED[digest] = module
    return module


def _lookup(module: types.ModuleType, qualname: str, entry: dict[str, Any]) -> Any:
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


class SourceResolver:
    """``resolve(path)`` for one capture; ``notes`` collects what happened (also warned)."""

    def __init__(self, sources: dict[str, dict[str, Any]], ref: str, *, run_source: bool = True) -> None:
        self.sources = sources
        self.ref = ref
        self.run_source = run_source
        self.notes: list[str] = []
        self._cache: dict[str, Any] = {}

    def resolve(self, path: str) -> Any:
        cached = self._cache.get(path)
        if cached is None:
            cached = self._cache[path] = self._resolve(path)
        return cached

    def _resolve(self, path: str) -> Any:
        module_name, _, qualname = path.partition(":")
        entry = self.sources.get(module_name)
        if (module_name != "__main__" or self._running_captured_script(entry)) and "<locals>" not in qualname:
            try:
                return import_object(path)
            except (ImportError, AttributeError) as error:
                if entry is None or "text" not in entry:
                    raise RestoreError(f"{self.ref}: cannot import {path} ({error}) and the capture holds "
                                       "no source for it") from None
        if entry is None or "text" not in entry:
            raise RestoreError(f"{self.ref}: {path} cannot be imported here and the capture holds no source for it")
        if not self.run_source:
            raise RestoreError(f"{self.ref}: {path} cannot be imported here; its source is stored with the capture "
                               f"({entry.get('file')}) but running it was turned off (load(..., run_source=False))")
        try:
            obj = _lookup(_module_from_source(module_name, entry), qualname, entry)
        except (AttributeError, KeyError, SyntaxError, NameError) as error:
            raise RestoreError(f"{self.ref}: the source stored for {module_name} does not define {qualname} "
                               f"({type(error).__name__}: {error})") from None
        note = f"classes of {module_name} were rebuilt from the source stored with the capture ({entry.get('file')})"
        if note not in self.notes:
            self.notes.append(note)
        return obj

    @staticmethod
    def _running_captured_script(entry: dict[str, Any] | None) -> bool:
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        if entry is None or not entry.get("file") or not main_file:
            return entry is None
        try:
            return os.path.samefile(main_file, entry["file"])
        except OSError:
            return False

    def check_changes(self) -> list[str]:
        """Messages about captured user classes whose code is not what was captured (also noted;
        the caller warns with :class:`SourceChangedWarning`)."""
        changed: list[str] = []
        for module_name, entry in self.sources.items():
            if module_name == "__main__" or not entry.get("classes"):
                changed.extend(self._check_file(module_name, entry))
                continue
            for qualname, info in entry["classes"].items():
                if info.get("hash") is None or "<locals>" in qualname:
                    continue
                try:
                    current = class_source(import_object(f"{module_name}:{qualname}"))
                except Exception:  # not importable here: the stored source will be used
                    continue
                if current is not None and source_hash(current) != info["hash"]:
                    changed.append(f"{module_name}.{qualname} has changed since it was captured "
                                   f"(its source differs); replay may not match")
        self.notes.extend(changed)
        return changed

    @staticmethod
    def _check_file(module_name: str, entry: dict[str, Any]) -> list[str]:
        file = entry.get("file")
        if not file or not entry.get("hash") or not os.path.isfile(file):
            return []
        try:
            with open(file, encoding="utf-8") as handle:
                current = handle.read()
        except (OSError, UnicodeDecodeError):
            return []
        if source_hash(current) == entry["hash"]:
            return []
        return [f"{file} ({module_name}) has changed since it was captured; the captured source is used"]
