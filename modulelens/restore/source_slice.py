"""Take from a captured file only what some classes need: the dependency slice that is executed
when a class is rebuilt from the source stored with a capture.

A training script usually runs its job at top level (no ``if __name__ == "__main__":`` guard).
Executing it, or guessing which statements "look safe", would train the model again or fail half
way (issue 11). Instead the slice starts from the wanted top-level names (the classes a capture
references), keeps the statements that bind them, adds every module-level name those statements
read (in method bodies, decorators, base classes, defaults), and repeats until nothing new is
needed: imports, helper functions, constants and other classes that really are dependencies.
Statements keep their order in the file; ``from __future__`` and ``import *`` always stay (they
change how the rest compiles or may bind anything), and ``if __name__ == "__main__":`` never does.
"""

from __future__ import annotations

import ast
import builtins
import functools
import symtable
from collections.abc import Iterable

_BUILTINS = frozenset(dir(builtins))


def slice_source(text: str, filename: str, roots: Iterable[str]) -> ast.Module:
    """The statements of ``text`` that define ``roots`` and, transitively, what they use.

    Args:
        text: the module's source.
        filename: shown in tracebacks and syntax errors.
        roots: top-level names wanted (class names; a class inside a function needs the function).

    Returns:
        An ``ast.Module`` to compile and execute.

    Raises:
        SyntaxError: the source does not parse.

    Example::

        tree = slice_source("import torch\\nclass Net(torch.nn.Module): ...\\ntrain()", "train.py", ["Net"])
        # keeps the import and the class, drops train()
    """
    keep = set(needed_statements(text, filename, roots))
    tree = ast.parse(text, filename=filename)
    tree.body = [node for i, node in enumerate(tree.body) if i in keep]
    return tree


def needed_statements(text: str, filename: str, roots: Iterable[str]) -> list[int]:
    """Positions in ``ast.parse(text).body`` of the slice :func:`slice_source` keeps, in file order.

    Used directly by the KernelBench inliner (:mod:`modulelens.kernels.inline`), which copies the
    kept statements' text rather than executing them.

    Args:
        text: the module's source.
        filename: shown in syntax errors.
        roots: top-level names wanted.

    Returns:
        Sorted statement positions: those binding ``roots``, what they read (transitively),
        ``from __future__`` imports and ``import *``.

    Raises:
        SyntaxError: the source does not parse.

    Example::

        needed_statements("import os\\nimport torch\\nclass Net(torch.nn.Module): ...", "m.py", ["Net"])  # [1, 2]
    """
    statements = _parse(text, filename)
    binders: dict[str, list[int]] = {}
    for position, (bound, _reads) in enumerate(statements):
        for name in bound:
            binders.setdefault(name, []).append(position)
    keep = {i for i, (bound, _reads) in enumerate(statements) if "*" in bound or "__future__" in bound}
    wanted = list(roots)
    seen: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name in seen:
            continue
        seen.add(name)
        for position in binders.get(name, ()):
            if position not in keep:
                keep.add(position)
                wanted.extend(statements[position][1])
    return sorted(keep)


@functools.lru_cache(maxsize=32)
def _parse(text: str, filename: str) -> tuple[tuple[frozenset[str], frozenset[str]], ...]:
    """Per top-level statement: the names it binds and the module-level names it reads (cached:
    one captured file serves many captures and classes)."""
    scopes = symtable.symtable(text, filename, "exec").get_children()
    result: list[tuple[frozenset[str], frozenset[str]]] = []
    for node in ast.parse(text, filename=filename).body:
        if _is_main_guard(node):
            result.append((frozenset(), frozenset()))
            continue
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
        last = node.end_lineno or node.lineno
        reads = _module_scope_reads(node)
        for scope in scopes:
            if first <= scope.get_lineno() <= last:
                reads |= _global_reads(scope)
        result.append((frozenset(bound_names(node)), frozenset(reads - _BUILTINS)))
    return tuple(result)


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    sides = [node.test.left, *node.test.comparators]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)


def bound_names(node: ast.stmt) -> set[str]:
    """Module-level names a statement binds (not those local to its functions and classes);
    ``"__future__"`` for a future import and ``"*"`` for ``import *``."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.ImportFrom):
        if node.module == "__future__":
            return {"__future__"}
        return {"*" if a.name == "*" else (a.asname or a.name) for a in node.names}
    if isinstance(node, ast.Import):
        return {a.asname or a.name.partition(".")[0] for a in node.names}
    names: set[str] = set()
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.stmt):
            names |= bound_names(child)
        elif isinstance(child, ast.ExceptHandler):
            names |= {n for s in child.body for n in bound_names(s)} | ({child.name} if child.name else set())
        else:
            names |= {n.id for n in _module_scope_nodes(child) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return names


def _module_scope_reads(node: ast.AST) -> set[str]:
    """Names read by the parts of a statement that run at module level (decorators, defaults,
    base classes, right-hand sides), not inside the bodies of the scopes it creates."""
    return {n.id for n in _module_scope_nodes(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _module_scope_nodes(node: ast.AST) -> list[ast.AST]:
    found: list[ast.AST] = []
    pending = [node]
    while pending:
        current = pending.pop()
        found.append(current)
        if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = current.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, (args.vararg, args.kwarg))]
            annotations = [a.annotation for a in every if a.annotation is not None]
            pending.extend([*current.decorator_list, *args.defaults, *(d for d in args.kw_defaults if d is not None),
                            *annotations, *([current.returns] if current.returns is not None else [])])
        elif isinstance(current, ast.ClassDef):
            pending.extend([*current.decorator_list, *current.bases, *current.keywords])
        elif isinstance(current, ast.Lambda):
            pending.extend([*current.args.defaults, *(d for d in current.args.kw_defaults if d is not None)])
        elif isinstance(current, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            pending.append(current.generators[0].iter)  # the rest is the comprehension's own scope
        else:
            pending.extend(ast.iter_child_nodes(current))
    return found


def _global_reads(scope: symtable.SymbolTable) -> set[str]:
    """Module-level names read anywhere in a function or class scope and the scopes inside it
    (symtable tells a global from a local or an enclosing function's variable)."""
    names = {s.get_name() for s in scope.get_symbols() if s.is_global() and s.is_referenced()}
    for child in scope.get_children():
        names |= _global_reads(child)
    return names
