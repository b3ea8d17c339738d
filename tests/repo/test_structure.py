"""The shape of ``modulelens/repo/``: one ``Repo`` over one ``Store`` interface, imports in one direction.

Issue 24: the repo was a class hierarchy (``RemoteRepo(Repo)`` overriding 36 methods, ``__new__``
dispatch, ``is_remote`` branches) whose files imported each other in a circle. These tests keep it
an interface: both stores implement all of :class:`Store`, the front end never names a store class
or asks whether it is remote, and the package's import graph has no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from modulelens.repo.local import LocalStore
from modulelens.repo.remote import RemoteStore
from modulelens.repo.store import Store

REPO_PACKAGE = Path(__file__).resolve().parents[2] / "modulelens" / "repo"
FRONT_END = ("repository.py", "index.py", "fsck.py", "transfer.py", "layout.py", "packs.py", "wandb_registry.py",
             "garbage.py", "publish.py", "payload_writes.py", "note_edits.py", "reports.py", "versions.py", "aliases.py")


def _module(path: Path) -> str:
    return "modulelens.repo" if path.name == "__init__.py" else f"modulelens.repo.{path.stem}"


def _runtime_imports(path: Path) -> set[str]:
    """Modules of ``modulelens.repo`` that ``path`` imports, at the top or inside functions
    (imports under ``if TYPE_CHECKING:`` are for annotations only and are not counted, as in
    tests/test_architecture.py)."""
    tree = ast.parse(path.read_text())
    skip = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for stmt in node.body for sub in ast.walk(stmt)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("modulelens.repo."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("modulelens.repo."))
    return {name for name in found if name.count(".") == 2}


def _graph() -> dict[str, set[str]]:
    return {_module(p): _runtime_imports(p) - {_module(p)} for p in sorted(REPO_PACKAGE.glob("*.py"))}


def test_the_repo_package_has_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(target):], target]))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def _layers() -> list[list[str]]:
    """The layer table of ``modulelens/repo/__init__.py``'s docstring, top layer first."""
    doc = ast.get_docstring(ast.parse((REPO_PACKAGE / "__init__.py").read_text())) or ""
    table = doc.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    return [line.split() for line in table.splitlines()]


def test_the_documented_layers_are_the_imports() -> None:
    layers = _layers()
    level = {f"modulelens.repo.{name}": i for i, names in enumerate(layers) for name in names}
    graph = _graph()
    assert set(level) == set(graph) - {"modulelens.repo"}, "every module of repo/ in exactly one layer"
    upward = [f"{m} imports {t}" for m, targets in graph.items() if m in level
              for t in targets if level[t] <= level[m]]
    assert not upward, upward


def test_docs_architecture_has_a_row_for_every_module() -> None:
    table = (REPO_PACKAGE.parents[1] / "docs" / "architecture.md").read_text()
    missing = [p.name for p in REPO_PACKAGE.glob("*.py") if f"| `modulelens/repo/{p.name}` |" not in table]
    assert not missing, missing


def test_the_interface_is_the_only_thing_the_stores_share() -> None:
    for store in (LocalStore, RemoteStore):
        assert issubclass(store, Store) and not store.__abstractmethods__, store
        assert store.__mro__[1] is Store, f"{store.__name__} must implement Store, not extend another store"


def test_storage_knows_nothing_of_trust() -> None:
    """Trust is policy (repo/trust.py's ``TrustPolicy``, resolved by ``load()``): no store has a trust or
    provenance member, and no store module imports the trust module."""
    for store in (Store, LocalStore, RemoteStore):
        members = [name for name in dir(store) if any(word in name for word in ("trust", "seal", "sign", "provenance"))]
        assert not members, f"{store.__name__}: {members}"
    graph = _graph()
    assert all("modulelens.repo.trust" not in graph[f"modulelens.repo.{m}"] for m in ("store", "remote")), graph


@pytest.mark.parametrize("filename", FRONT_END)
def test_the_front_end_never_asks_which_store_it_has(filename: str) -> None:
    """No ``isinstance`` on a store, no store class named, no ``is_remote`` branch: what differs
    between stores is a method of :class:`Store` (``open_store``, which builds them, aside)."""
    tree = ast.parse((REPO_PACKAGE / filename).read_text())
    offences = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or function.name in ("open_store", "is_remote"):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Name) and node.id in ("LocalStore", "RemoteStore"):
                offences.append(f"line {node.lineno}: names {node.id}")
            elif isinstance(node, ast.Attribute) and node.attr == "is_remote":
                offences.append(f"line {node.lineno}: asks is_remote")
    assert not offences, f"{filename}: " + "; ".join(offences)
