"""The class-source inliner: the captured class plus the top-level code of its module it uses.

``problem.py`` must run where only torch is installed, so the module's source is copied in: the
class statement, then every top-level statement (imports, helper functions, constants, other
classes) that binds a name it reads, followed transitively: the same dependency slice that
rebuilds a class from stored source (:func:`modulelens.restore.source_slice.needed_statements`),
copied as text instead of executed. Relative imports become absolute. A ``torch`` builtin is
subclassed by import instead.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass, field

from modulelens.errors import KernelError, UnsupportedValueError
from modulelens.kernels.render import comment_text, dotted, literal
from modulelens.restore.source_slice import bound_names, needed_statements

RESERVED = {"Model", "get_inputs", "get_init_inputs", "get_benchmark_config", "DATA_DIR", "_Captured", "_ML_CALLS",
            "_MLModule", "_ml_module"}
_SAFE_REBINDS = {  # names the template uses; the module may bind them only to the same thing
    "json": ("json",), "os": ("os",), "sys": ("sys",), "Path": ("pathlib.Path",), "torch": ("torch",),
    "nn": ("torch.nn",),
}


@dataclass
class ClassSource:
    """How ``problem.py`` gets the captured class: inlined source, or an import."""

    origin: str  # "inlined" or "imported"
    class_expr: str
    code: str = ""
    future_annotations: bool = False
    module: str = ""
    included: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    imports: set[str] = field(default_factory=set)  # top-level packages the inlined code imports


def _checked_name(name: str, what: str) -> str:
    """A dotted name that generated code may spell (a capture names it: docs/security.md)."""
    try:
        return dotted(name, what)
    except UnsupportedValueError as error:
        raise KernelError(f"cannot write the class into a problem file: {error}") from None


def _segment(lines: list[str], node: ast.stmt) -> str:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "".join(lines[start - 1:node.end_lineno])


def _absolute_import(node: ast.ImportFrom, package: str | None) -> str:
    module = node.module or ""
    if node.level:
        try:
            module = _checked_name(importlib.util.resolve_name("." * node.level + module, package), "a relative import")
        except (ImportError, ValueError) as error:
            raise KernelError(f"a relative import of the class's module cannot be made absolute ({error})") from None
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
    return f"from {module} import {names}\n"


def inlined_class_source(cls: type, extra_names: set[str] | None = None, *, inline: bool = True,
                 module_name: str | None = None, text: str | None = None) -> ClassSource:
    """The source ``problem.py`` needs for ``cls``: torch builtins by import, otherwise the class and
    the top-level code of its module that it uses (imports, helpers, constants), in file order.

    Args:
        cls: the captured class.
        extra_names: module-level names the constructor arguments refer to (kept as well).
        inline: ``False`` imports the class by path instead.
        module_name: the module the class was captured from (default ``cls.__module__``); differs
            for a class rebuilt from the source stored with a capture (``__main__``, a script).
        text: that module's source (default: ``inspect.getsource`` of the live module).

    Returns:
        A :class:`ClassSource`: ``origin`` ``"inlined"`` with the code, or ``"imported"`` with a note why.

    Raises:
        ModulelensError: the inlined code binds a name the problem file reserves.
    """
    module_name = _checked_name(module_name or cls.__module__, "the class's module")
    qualname = _checked_name(cls.__qualname__, "the class's name")
    if module_name == "torch" or module_name.startswith("torch."):
        for public in ("torch.nn",):
            if getattr(importlib.import_module(public), cls.__name__, None) is cls:
                return ClassSource("imported", f"{public}.{cls.__name__}", module=module_name)
        return ClassSource("imported", f"{module_name}.{qualname}", module=module_name)
    fallback = ClassSource("imported", f"importlib.import_module({literal(module_name, 'module')}).{qualname}",
                           module=module_name)
    if not inline:
        fallback.notes.append("the class is imported (not inlined), so its module must be importable")
        return fallback
    if text is None and _reads_its_own_module(cls):
        fallback.notes.append(f"{qualname} is a transformers PreTrainedModel, which reads its own module file and type "
                              "hints when it is defined, so it cannot be defined from inlined text; it is imported")
        return fallback
    origin = f"<stored with the capture: {module_name}>"
    package = module_name.rpartition(".")[0] if module_name != "__main__" else None
    if text is None:
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
        origin = getattr(module, "__file__", "?")
        package = getattr(module, "__package__", None)
        try:
            text = inspect.getsource(module)
        except (OSError, TypeError) as error:
            fallback.notes.append(f"source of {module_name} not available ({error}); the class is imported instead")
            return fallback
    statements = ast.parse(text).body
    target = next((s for s in statements if isinstance(s, ast.ClassDef) and s.name == qualname), None)
    if target is None:
        fallback.notes.append(f"{qualname} is not a top-level class of {module_name}; the class is imported instead")
        return fallback
    include = set(needed_statements(text, f"<{module_name}>", {qualname, *(extra_names or ())}))
    _check_reserved(statements, include, module_name)
    source = _join_statements([statements[i] for i in sorted(include)], text.splitlines(keepends=True), package)
    source.code = f"# from {comment_text(module_name)} ({comment_text(origin)})\n" + source.code
    source.class_expr = qualname
    source.module = module_name
    source.future_annotations = any(
        isinstance(s, ast.ImportFrom) and s.module == "__future__" and any(a.name == "annotations" for a in s.names)
        for s in statements)
    return source


def _reads_its_own_module(cls: type) -> bool:
    """A transformers ``PreTrainedModel`` subclass: defining one runs ``inspect.getsource`` and
    ``typing.get_type_hints`` on it, which need the real module it lives in."""
    return any(base.__name__ == "PreTrainedModel" and base.__module__ == "transformers.modeling_utils"
               for base in cls.__mro__)


def _join_statements(statements: list[ast.stmt], lines: list[str], package: str | None) -> ClassSource:
    """The statements' text in file order (PEP 8 spacing, relative imports made absolute)."""
    code = ""
    included = []
    imported: set[str] = set()
    previous: ast.stmt | None = None
    for statement in statements:
        if isinstance(statement, ast.ImportFrom) and statement.module == "__future__":
            continue
        if isinstance(statement, ast.ImportFrom) and statement.level:
            chunk = _absolute_import(statement, package)
            imported.add(chunk.split()[1].split(".")[0])
        else:
            if isinstance(statement, ast.Import):
                imported.update(a.name.split(".")[0] for a in statement.names)
            elif isinstance(statement, ast.ImportFrom) and statement.module:
                imported.add(statement.module.split(".")[0])
            chunk = _segment(lines, statement)
        if previous is not None:
            code += _blank_lines(previous, statement)
        code += chunk.rstrip("\n")
        previous = statement
        included.append(", ".join(sorted(bound_names(statement))) or type(statement).__name__)
    stdlib: frozenset[str] = getattr(sys, "stdlib_module_names", frozenset())
    third_party = {name for name in imported if name not in stdlib and name not in ("torch", "__future__")}
    return ClassSource("inlined", "", code=code + "\n", included=included, imports=third_party)


def _blank_lines(previous: ast.stmt, statement: ast.stmt) -> str:
    imports = (ast.Import, ast.ImportFrom)
    assigns = (ast.Assign, ast.AnnAssign)
    if (isinstance(statement, imports) and isinstance(previous, imports)) or (
            isinstance(statement, assigns) and isinstance(previous, assigns)):
        return "\n"
    if isinstance(statement, (*imports, *assigns)) and isinstance(previous, (*imports, *assigns)):
        return "\n\n"
    return "\n\n\n"


def _check_reserved(statements: list[ast.stmt], include: set[int], module_name: str) -> None:
    for i in include:
        statement = statements[i]
        for name in bound_names(statement) & (RESERVED | set(_SAFE_REBINDS)):
            if name in _SAFE_REBINDS and _binds_same(statement, name):
                continue
            raise KernelError(f"{module_name} binds {name!r} at top level, which the problem file reserves; "
                                  "export with --no-inline to import the class instead")


def _binds_same(statement: ast.stmt, name: str) -> bool:
    allowed = _SAFE_REBINDS[name]
    if isinstance(statement, ast.Import):
        return any((a.asname or a.name) == name and a.name in allowed for a in statement.names)
    if isinstance(statement, ast.ImportFrom):
        return any((a.asname or a.name) == name and f"{statement.module}.{a.name}" in allowed for a in statement.names)
    return False
