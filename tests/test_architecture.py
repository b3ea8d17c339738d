"""The package's shape: imports go one way, and the public API is exactly what ``__all__`` lists.

Layers, lowest first (docs/architecture.md): errors ← format ← repo ← tracing / restore ← tools ←
kernels ← demo / testing ← interfaces ← the top-level package. A module may import its own layer
or a lower one, never a higher one; tracing and restore, side by side, do not import each other.
Imports under ``if TYPE_CHECKING:`` are for annotations only and are not counted.

Also: no import cycle between files (through a package's ``__init__`` included), and the module map of
docs/architecture.md names every module, with its layer and whether it is public API (issue 24).
"""

from __future__ import annotations

import ast
import importlib
import re
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


# ------------------------------------------------------------------------------ no file cycles


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package its imports run, for every file under ``root``.

    Imports inside functions count as much as module-level ones (only ``TYPE_CHECKING`` blocks are
    left out). ``from package import name`` runs the submodule when ``name`` is one, else the
    package's ``__init__.py``: so re-exported names lead to the ``__init__`` that re-exports them.
    """
    package = root.name
    files = {}
    for path in sorted(root.rglob("*.py")):
        if "agent_skill/files" in path.as_posix() or "_bootstrap" in path.parts:
            continue
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                for stmt in node.body for sub in ast.walk(stmt)}
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names if alias.name in files)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".")
                    anchor = anchor[: len(anchor) - node.level + (1 if path.name == "__init__.py" else 0)]
                    base = ".".join([*anchor, base] if base else anchor)
                if base != package and not base.startswith(package + "."):
                    continue
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    targets.add(submodule if submodule in files else base)
        graph[module] = {t for t in targets if t in files and t != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_no_import_cycle_between_files() -> None:
    cycles = import_cycles(import_graph(PACKAGE))
    assert not cycles, "import cycles between files:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_cycle_check_sees_a_cycle_through_a_package_init(tmp_path: Path) -> None:
    """The check is not vacuous: a module importing what its own package's ``__init__`` re-exports
    is a cycle (the shape ``kernels/export.py`` had), and so is a plain two-file circle."""
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("from pkg.sub.a import thing\n")
    (root / "sub" / "a.py").write_text("thing = 1\n")
    (root / "sub" / "b.py").write_text("from pkg.sub import thing\n")
    (root / "c.py").write_text("def later():\n    from . import d\n")
    (root / "d.py").write_text("from pkg import c\n")
    (root / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import f\n")
    (root / "f.py").write_text("import pkg.e\n")
    assert import_cycles(import_graph(root)) == [["pkg.c", "pkg.d"]]
    (root / "sub" / "a.py").write_text("from pkg.sub import b\nthing = 1\n")
    assert sorted(import_cycles(import_graph(root))) == [["pkg.c", "pkg.d"], ["pkg.sub", "pkg.sub.a", "pkg.sub.b"]]


# ------------------------------------------------------------------------------ the map

ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def _map_rows() -> list[list[str]]:
    """The cells of the module table of docs/architecture.md (the table whose header names ``module``)."""
    lines = ARCHITECTURE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| layer | module |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def _package_files() -> set[str]:
    return {path.relative_to(PACKAGE.parent).as_posix() for path in PACKAGE.rglob("*.py")}


def _covered(row: list[str]) -> set[str]:
    """The files a row names: its module, or for a folder row each file named in it by its path in the folder."""
    named = row[1].strip("`")
    if not named.endswith("/"):
        return {named}
    text = " | ".join(row[2:])
    return {f"{named}{path}" for path in re.findall(r"`([^`]+\.py)`", text)}


def test_architecture_map_names_every_module() -> None:
    """One row per module: a new file must get its row, a removed one lose it."""
    rows = _map_rows()
    assert len(rows) > 100, "the module table of docs/architecture.md was not found whole (a blank line splits it?)"
    named = [name for row in rows for name in _covered(row)]
    files = _package_files()
    missing = sorted(files - set(named))
    stale = sorted(set(named) - files)
    doubled = sorted({name for name in named if named.count(name) > 1})
    assert not missing, f"modules without a row in docs/architecture.md: {missing}"
    assert not stale, f"rows of docs/architecture.md for files that do not exist: {stale}"
    assert not doubled, f"modules with more than one row: {doubled}"


def test_architecture_map_layers_match_the_import_check() -> None:
    for row in _map_rows():
        module = row[1].strip("`").removesuffix("/").removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        if "agent_skill.files" in module or "_bootstrap" in module or module == "modulelens.__main__":
            continue
        assert int(row[0]) == LAYERS[_layer_of(module)], row[:2]


API_PACKAGES = ["modulelens", "modulelens.format", "modulelens.repo", "modulelens.restore", "modulelens.tracing",
                "modulelens.kernels"]


def test_architecture_map_marks_exactly_the_public_modules() -> None:
    """``public`` in the API column: a module that defines a name of an API package's ``__all__`` (or
    is such a package, or ``modulelens.testing``); every other module is ``internal``."""
    public = {"modulelens/testing.py"}
    for package_name in API_PACKAGES:
        package = importlib.import_module(package_name)
        public.add(package_name.replace(".", "/") + "/__init__.py")
        for name in package.__all__:
            defined_in = getattr(getattr(package, name), "__module__", None)
            if defined_in and defined_in.startswith("modulelens") and defined_in != package_name:
                public.add(importlib.import_module(defined_in).__file__.removeprefix(str(PACKAGE.parent) + "/"))
    marked = {row[1].strip("`") for row in _map_rows() if row[2].startswith("public")}
    assert {row[2].split(":")[0] for row in _map_rows()} == {"public", "internal"}
    assert marked == public, {"marked but not public": sorted(marked - public), "public but not marked": sorted(public - marked)}


#: Modules allowed over the limit, with their line counts: each may only shrink, and leaves this table
#: once it is at most 800 lines. Empty since issue 39 split the last four along their jobs; keep it so.
_OVER_800_YET: dict[str, int] = {}


def test_no_module_is_over_800_lines() -> None:
    """Issue 39: a file over 800 lines holds more than one job; split it along its jobs."""
    package = Path(modulelens.__file__).parent
    lines = {str(path.relative_to(package)): len(path.read_text().splitlines()) for path in sorted(package.rglob("*.py"))}
    too_long = {module: n for module, n in lines.items() if n > _OVER_800_YET.get(module, 800)}
    assert not too_long, f"over 800 lines (or longer than when listed in _OVER_800_YET): {too_long}"
    fixed = [module for module in _OVER_800_YET if lines.get(module, 0) <= 800]
    assert not fixed, f"at most 800 lines now: remove {fixed} from _OVER_800_YET"


#: Calls that write a file (or make one appear) by their dotted name; ``open()`` counts with a mode
#: that writes. Directories may be made (``tempfile.mkdtemp``: a fallback repo's folder).
_WRITING_CALLS = {"os.write", "os.pwrite", "os.writev", "os.replace", "os.rename", "os.link", "os.symlink",
                  "os.truncate", "os.ftruncate", "os.posix_fallocate", "os.fsync", "os.fdatasync", "shutil.copy",
                  "shutil.copy2", "shutil.copyfile", "shutil.move", "tempfile.mkstemp", "tempfile.NamedTemporaryFile",
                  "tempfile.TemporaryFile", "tempfile.SpooledTemporaryFile", "torch.save", "np.save", "numpy.save",
                  "np.savez", "numpy.savez"}
_WRITING_METHODS = {"write_bytes", "write_text", "tofile", "touch"}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _file_writes(source: str) -> list[tuple[int, str]]:
    """Where ``source`` opens or makes a file for writing: ``(line, call)``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
        if name in _WRITING_CALLS or method in _WRITING_METHODS:
            found.append((node.lineno, name or method))
        elif name == "os.open":
            flags = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
            if not flags or any(flag in flags for flag in ("O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC")):
                found.append((node.lineno, f"os.open(..., {flags})"))
        elif name in ("open", "io.open") or method == "open":  # open(path, mode) or path.open(mode)
            at = 1 if name in ("open", "io.open") else 0
            mode = node.args[at] if len(node.args) > at else next((k.value for k in node.keywords if k.arg == "mode"), None)
            if mode is not None and not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)
                                         and not set(mode.value) & set("wax+")):
                found.append((node.lineno, f"{name or method}(..., mode={ast.unparse(mode)})"))
    return found


def test_tracing_writes_no_file_itself() -> None:
    """Issue 39: captured bytes take one path to disk, the store's blob writer (repo/blob_writer.py,
    ``Repo.blob_writer``). ``tracing/`` only records and hands bytes to ``repo/``; a file written
    here would re-implement the blob protocol (durable writes, hashing, markers) beside the store."""
    writes = {f"tracing/{path.name}:{line}": call for path in sorted((PACKAGE / "tracing").rglob("*.py"))
              for line, call in _file_writes(path.read_text())}
    assert not writes, ("modulelens/tracing/ writes files itself; stream the bytes through the repo's blob writer "
                        f"(Repo.blob_writer) or a helper of repo/files.py instead: {writes}")


def test_the_file_write_check_sees_writes() -> None:
    sample = ("import os\nfd = os.open(p, os.O_WRONLY)\nopen(p, 'wb')\nopen(p, mode='a')\nPath(p).write_bytes(b'')\n"
              "open(p)\nopen(p, 'rb')\npath.open('w')\nos.replace(a, b)\nopen(p, m)\nos.open(p, os.O_RDONLY)\n")
    assert [line for line, _ in _file_writes(sample)] == [2, 3, 4, 5, 8, 9, 10]


def _aliases_of_any(trees: list[ast.Module]) -> set[str]:
    """``Any`` and every module-level name bound to it (``JSON = Any``): an alias is still ``Any``."""
    names = {"Any"}
    for tree in trees:
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            bound = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            if (isinstance(value, ast.Name) and value.id == "Any") or (isinstance(value, ast.Attribute) and value.attr == "Any"):
                names |= {target.id for target in bound if isinstance(target, ast.Name)}
    return names


def _mentions(annotation: ast.expr, names: set[str]) -> bool:
    for node in ast.walk(annotation):
        if (isinstance(node, ast.Name) and node.id in names) or (isinstance(node, ast.Attribute) and node.attr in names):
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
            if names & set(re.findall(r"\w+", node.value)):
                return True
    return False


#: Issue 39: at most this share of the package's function signatures (a parameter or the return)
#: may mention ``Any``; 37% before the typing work. Lower it as signatures get types, never raise it.
_ANY_SHARE_AT_MOST = 0.15


def test_any_is_in_at_most_15_percent_of_signatures() -> None:
    """Typing stops nowhere: values only passed on are ``object``, documents the TypedDicts of
    ``format/spec.py``, modules and tensors their torch types (docs/architecture.md, "Type checking")."""
    package = Path(modulelens.__file__).parent
    trees = {path: ast.parse(path.read_text()) for path in sorted(package.rglob("*.py"))}
    names = _aliases_of_any(list(trees.values()))
    total, loose = 0, {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            total += 1
            args = node.args
            annotations = [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
                           if a is not None and a.annotation is not None]
            if node.returns is not None:
                annotations.append(node.returns)
            if any(_mentions(annotation, names) for annotation in annotations):
                module = str(path.relative_to(package))
                loose[module] = loose.get(module, 0) + 1
    share = sum(loose.values()) / total
    worst = sorted(loose.items(), key=lambda item: -item[1])[:8]
    assert share <= _ANY_SHARE_AT_MOST, (f"Any in {sum(loose.values())} of {total} signatures ({share:.1%} > "
                                         f"{_ANY_SHARE_AT_MOST:.0%}); most in {worst}")
