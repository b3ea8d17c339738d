"""The package's shape: imports go one way, and the public API is exactly what ``__all__`` lists.

Layers, lowest first (docs/architecture.md): errors ← format ← repo ← tracing / restore ← tools ←
kernels ← demo / testing ← interfaces ← the top-level package. A module may import its own layer
or a lower one, never a higher one; tracing and restore, side by side, do not import each other.
Imports under ``if TYPE_CHECKING:`` are for annotations only and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import modulelens

PACKAGE = Path(modulelens.__file__).resolve().parent

LAYERS = {
    "modulelens.errors": 0,
    "modulelens.format": 1,
    "modulelens.repo": 2,
    "modulelens.tracing": 3,
    "modulelens.restore": 3,
    "modulelens.tools": 4,
    "modulelens.kernels": 5,
    "modulelens.demo": 6,
    "modulelens.testing": 6,
    "modulelens.interfaces": 7,
    "modulelens": 8,
}
SIDE_BY_SIDE = {frozenset({"modulelens.tracing", "modulelens.restore"})}

# Upward imports not yet removed: each entry is a debt; the list only shrinks (it is empty now).
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _layer_of(module: str) -> str:
    parts = module.split(".")
    for size in (2, 1):
        key = ".".join(parts[:size])
        if key in LAYERS:
            return key
    raise AssertionError(f"{module} belongs to no layer; add its package to LAYERS")


def _module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """Every modulelens module imported by ``tree``, outside ``if TYPE_CHECKING:`` blocks."""
    found: set[str] = set()
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("modulelens"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            if base.startswith("modulelens"):
                found.add(base)
    return found


def _all_imports() -> list[tuple[str, str]]:
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "agent_skill/files" in path.as_posix() or "_bootstrap" in path.parts:
            continue  # files copied into users' projects or run as sitecustomize: not package modules
        module = _module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        edges.extend((module, target) for target in _imports(tree, module, path.name == "__init__.py"))
    return edges


def test_imports_go_one_way() -> None:
    upward = []
    for module, target in _all_imports():
        here, there = _layer_of(module), _layer_of(target)
        if (module, target) in KNOWN_UPWARD or (target == "modulelens" and here == "modulelens.interfaces"):
            continue  # an interface may use the public facade (``modulelens.load``, ``__version__``) as users do
        if LAYERS[there] > LAYERS[here] or frozenset({here, there}) in SIDE_BY_SIDE:
            upward.append(f"{module} imports {target} ({here} may not import {there})")
    assert not upward, "\n".join(upward)


def test_known_upward_imports_still_exist() -> None:
    """A removed debt must leave KNOWN_UPWARD too, so the list can only shrink."""
    edges = set(_all_imports())
    assert KNOWN_UPWARD <= edges, sorted(KNOWN_UPWARD - edges)


def test_every_package_module_has_a_layer() -> None:
    for module, target in _all_imports():
        _layer_of(module)
        _layer_of(target)


def test_public_api_is_exactly_all() -> None:
    """``__all__`` lists every public name of ``modulelens`` and nothing else (as httpx pins its API)."""
    public = {name for name in dir(modulelens) if not name.startswith("_")}  # lazy names included
    submodules = {name for name in public if type(getattr(modulelens, name)).__name__ == "module"}
    assert set(modulelens.__all__) == (public - submodules) | {"__version__"}
    for name in modulelens.__all__:
        assert hasattr(modulelens, name), name
