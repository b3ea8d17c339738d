"""Test tiers (docs/architecture.md "Test tiers"): what each test costs, read from what it uses.

Every test gets the markers of the costly things it uses (``MARKERS``); the fast tier (``bash
scripts/test``) is every test with none of them, and ``bash scripts/test --all`` runs every tier.
A marker comes from

- what the test's code reaches (``Classifier``): its own body, every fixture it requests (however
  deep, and those it asks for by name with ``request.getfixturevalue``), and what they call, read
  from the bytecode and followed to any depth: this checkout's helpers (``tests/``, ``stress/``,
  ``census/``, ``examples/``) through functions and classes, the library through its functions
  (``modulelens.verify_kernel`` starts worker processes), and the interfaces a test drives by name
  (a ``modulelens`` command line run with a ``CliRunner``, a ``%ml_*`` magic, an MCP tool).
  Third-party code is not entered but recognised by the name it is reached by (``RULES``:
  ``subprocess.run``, ``nbclient.NotebookClient``, ``seaweed.SeaweedServer``, ``"torch.distributed.run"``
  in a command line);
- or a decorator (``@pytest.mark.subprocess``...), for what no rule can see.

A rule that misses is caught when the test runs: ``ProcessWatch`` sees every process a test
starts (``sys.addaudithook``, plus multiprocessing's spawn, which raises no audit event), and a
fast-tier test that starts one fails, naming the command and the marker to add. So a new test lands
in its tier, or fails loudly in the fast one; it never makes the fast tier slow in silence.
"""

from __future__ import annotations

import builtins
import dataclasses
import dis
import functools
import importlib
import inspect
import os
import sys
import time
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "modulelens"
# Where the code the rules follow through functions and classes lives: this checkout, and the rootdir
# of a pytest run of its own (configure() adds it).
PROJECT_ROOTS: list[Path] = [ROOT]

MARKERS: dict[str, str] = {
    "subprocess": "starts a process: a fresh Python (a CLI run as a user would, a worker), a fork, a tool",
    "server": "starts a server process: SeaweedFS's S3 gateway, `modulelens ui`, an MCP stdio server",
    "browser": "drives a real headless Chromium through Selenium",
    "distributed": "runs torch.distributed: torchrun, a process group",
    "census": "runs the fidelity census (python -m census: a sample; .ci/run runs the whole census instead)",
    "notebook": "executes a notebook on a real Jupyter kernel",
    "packaging": "runs pip or makes a virtual environment",
    "slow": "long in-process work: set by hand (no rule sees how long a computation takes), or building the huge "
            "captures of stress/huge_captures.py",
}
# Markers that mean a process is started (by a library the rules do not enter: jupyter_client, selenium...).
PROCESS_KINDS = frozenset({"server", "browser", "distributed", "census", "notebook", "packaging"})
FAST_TIER = "fast"
ALL_TIERS = "all"


@dataclasses.dataclass(frozen=True)
class Rule:
    """When a test gets ``marker``: it reaches a qualified name in ``names`` (a module or class
    matches its members too), a string constant of this checkout's code containing one of
    ``substrings``, or one that is exactly one of ``words`` (the module of ``python -m census``);
    the last two only when the test also has ``only_with`` (a word alone, like "pip", is too common)."""

    marker: str
    names: tuple[str, ...] = ()
    substrings: tuple[str, ...] = ()
    words: tuple[str, ...] = ()
    only_with: str | None = None


RULES = (
    Rule("subprocess", names=(
        "subprocess", "multiprocessing", "torch.multiprocessing", "concurrent.futures.process", "pty.spawn", "pty.fork",
        "os.fork", "os.forkpty", "os.system", "os.popen", "os.posix_spawn", "os.posix_spawnp", "os.execv", "os.execve",
        "os.execl", "os.execle", "os.execlp", "os.execvp", "os.execvpe", "os.spawnv", "os.spawnl",
        "asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell", "mcp.client.stdio",
        # a W&B run starts its `wandb-core` service process
        "wandb.init")),
    Rule("server", names=("seaweed.SeaweedServer", "stress.browser.ui_server", "uvicorn", "mcp.client.stdio")),
    Rule("browser", names=("selenium", "stress.browser.chromium")),
    Rule("distributed", names=("torch.distributed.init_process_group", "torch.distributed.run", "torch.distributed.launch",
                               "torch.distributed.elastic", "torch.multiprocessing.spawn",
                               "torch.multiprocessing.start_processes"),
         substrings=("torch.distributed.run", "torchrun", "init_process_group")),
    Rule("census", words=("census",), only_with="subprocess"),
    Rule("notebook", names=("nbclient", "jupyter_client", "nbconvert")),
    Rule("packaging", names=("venv", "ensurepip", "pip"), words=("pip", "venv", "ensurepip"), only_with="subprocess"),
    # the UI's huge captures (50,000 calls, a million leaves, 3,000 reports): ~40 s to build, in-process
    Rule("slow", names=("stress.huge_captures.huge_repo", "stress.huge_captures.many_calls",
                        "stress.huge_captures.many_leaves", "stress.huge_captures.many_reports")),
)
# The library's own spelling of some standard names (``os.fork.__module__`` is "posix").
_MODULE_ALIASES = {"posix": "os"}
# Programs a test may start in the fast tier: each capture records the commit (``git rev-parse``)
# and ``platform.processor()`` runs ``uname -p``, milliseconds each; everything else costs a
# process start at least, a Python one 1-5 s.
CHEAP_PROGRAMS = frozenset({"git", "uname"})
# The library's functions that start only such a program.
CHEAP_LIBRARY_FUNCTIONS = frozenset({"modulelens.tracing.environment._git_commit"})


def _matches(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _unwrap(obj: Any) -> Any:
    """The function under decorators (``@contextmanager``, a pytest fixture definition)."""
    try:
        return inspect.unwrap(obj) if callable(obj) and not isinstance(obj, type) else obj
    except ValueError:  # a cycle of __wrapped__
        return obj


def _origin(obj: Any) -> str | None:
    """"project" for the code of this checkout's tests and tools, "library" for modulelens, else None."""
    code = getattr(obj, "__code__", None)
    filename = code.co_filename if isinstance(code, types.CodeType) else None
    if filename is None and inspect.isclass(obj):
        filename = getattr(sys.modules.get(obj.__module__), "__file__", None)
    return _origin_of_file(filename) if filename else None


@functools.cache
def _origin_of_file(filename: str) -> str | None:
    path = Path(filename).resolve()
    if path.is_relative_to(LIBRARY):
        return "library"
    if any(path.is_relative_to(root) and not path.is_relative_to(root / ".venv") for root in PROJECT_ROOTS):
        return "project"
    return None


def _qualified_name(obj: Any) -> str | None:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    # tests import support modules both as ``seaweed`` and as ``support.seaweed``: one name for the rules
    module = _MODULE_ALIASES.get(module, module.removeprefix("support."))
    return f"{module}.{qualname}"


@dataclasses.dataclass(frozen=True)
class _Code:
    """Code the rules read: a code object, the globals it runs with, and where it comes from."""

    code: types.CodeType
    namespace: dict[str, Any] = dataclasses.field(compare=False, hash=False)
    origin: str


def _codes_of(obj: Any) -> list[_Code]:
    """What following ``obj`` reads: this checkout's functions and classes (every method, of its
    project base classes too) and the library's functions. Not the library's classes: a method is
    reached through an instance, which bytecode does not type, and following every method of
    ``Repo`` would reach everything."""
    if isinstance(obj, _Code):
        return [obj]
    obj = _unwrap(obj)
    origin = _origin(obj)
    if origin == "project" and inspect.isclass(obj):
        found = []
        for cls in obj.__mro__:
            if cls is object or _origin(cls) != "project":
                continue
            for member in vars(cls).values():
                for candidate in (member, getattr(member, "__func__", None), getattr(member, "fget", None)):
                    if inspect.isfunction(candidate):
                        found.append(_Code(candidate.__code__, candidate.__globals__, origin))
        return found
    if origin is not None and inspect.isfunction(obj) and _qualified_name(obj) not in CHEAP_LIBRARY_FUNCTIONS:
        return [_Code(obj.__code__, obj.__globals__, origin)]
    return []


@dataclasses.dataclass
class _Uses:
    """What one function's own code uses: qualified names, string constants, what it calls that is followed."""

    names: set[str] = dataclasses.field(default_factory=set)
    strings: set[str] = dataclasses.field(default_factory=set)
    callees: list[Any] = dataclasses.field(default_factory=list)


def _static_attribute(owner: Any, name: str) -> Any:
    """``owner.name`` for a module or a class, without running code: no lazy import (transformers'
    and torch's modules import on attribute access, seconds each), no descriptor or property."""
    if isinstance(owner, types.ModuleType):
        return vars(owner).get(name)
    if inspect.isclass(owner):
        found = inspect.getattr_static(owner, name, None)
        return getattr(found, "__func__", found)  # a staticmethod's or classmethod's function
    return None  # an instance: a property would run code


def _import(module: str) -> types.ModuleType | None:
    """A module named by an import inside a function: loaded when it is this checkout's (a test
    helper, followed into), else only looked up (importing a third-party library costs seconds)."""
    if module in sys.modules:
        return sys.modules[module]
    top = module.split(".")[0]
    if not any(p.exists() for p in (ROOT / top, ROOT / f"{top}.py", ROOT / "tests" / "support" / f"{top}.py")):
        return None
    try:
        return importlib.import_module(module)
    except Exception:  # a helper that does not import here (a missing extra): its name is all we know
        return None


def _read(code: _Code) -> _Uses:
    """The names ``code`` loads (globals, imports inside it, attribute chains on modules and
    classes, resolved to the objects they name), its string constants, and what it calls that is
    followed; nested code is read with it (lambdas and comprehensions always, nested functions in
    this checkout's code only: the library's register callbacks, like its MCP tools, that it does not call)."""
    found = _Uses()

    def note(obj: Any, spelled: str) -> str:
        qualified = (_qualified_name(obj) if obj is not None else None) or spelled
        found.names.add(qualified)
        if isinstance(obj, str):  # a module-level command line or script the function uses
            found.strings.add(obj)
        elif _codes_of(obj):
            found.callees.append(obj)
        return qualified

    local_imports: dict[str, Any] = {}  # names bound by ``import`` inside the function
    chain: tuple[Any, str] | None = None  # the object and name an attribute load would extend
    importing: tuple[str, Any] | None = None  # the module of the import statement being read
    stored: Any = None  # what the next STORE of that import statement binds
    for instruction in dis.get_instructions(code.code):
        op, arg = instruction.opname, instruction.argval
        if importing is not None and op != "IMPORT_FROM" and not op.startswith("STORE_"):
            importing = None  # the import statement ended
        extended: tuple[Any, str] | None = None
        if op in ("LOAD_GLOBAL", "LOAD_NAME"):
            obj = code.namespace.get(arg, getattr(builtins, arg, None))
            extended = (obj, note(obj, arg))
        elif op.startswith(("LOAD_FAST", "LOAD_DEREF")) and arg in local_imports:
            obj = local_imports[arg]
            extended = (obj, note(obj, arg))
        elif op in ("LOAD_ATTR", "LOAD_METHOD") and chain is not None:
            parent, spelled = chain
            obj = _static_attribute(parent, arg)
            extended = (obj, note(obj, f"{spelled}.{arg}"))
        elif op == "IMPORT_NAME":
            module = _import(arg)
            note(module, arg)
            importing = (arg, module)
            # ``import a.b`` binds ``a``; ``import a.b as c`` goes on with IMPORT_FROM
            stored = _import(arg.split(".")[0]) if "." in arg else module
        elif op == "IMPORT_FROM" and importing is not None:
            module_name, module = importing
            obj = _static_attribute(module, arg)
            if obj is None:
                obj = _import(f"{module_name}.{arg}")
            note(obj, f"{module_name}.{arg}")
            stored = obj
        elif op.startswith(("STORE_FAST", "STORE_DEREF", "STORE_NAME")) and importing is not None:
            local_imports[arg] = stored
        elif op == "LOAD_CONST" and isinstance(arg, str):
            found.strings.add(arg)
        elif op == "LOAD_CONST" and isinstance(arg, tuple):  # a list or tuple of constants
            found.strings.update(item for item in arg if isinstance(item, str))
        elif op == "LOAD_CONST" and isinstance(arg, types.CodeType):
            if code.origin == "project" or arg.co_name.startswith("<"):
                nested = _read(_Code(arg, code.namespace, code.origin))
                found.names |= nested.names
                found.strings |= nested.strings
                found.callees += nested.callees
        chain = extended
    return found


@dataclasses.dataclass(frozen=True)
class _Evidence:
    """What the code reachable from somewhere earns by name, with the strings it uses."""

    hits: dict[str, str]  # marker -> the most specific name that earned it ("subprocess.run")
    drivers: frozenset[int]  # the interfaces (indices into _INTERFACES) whose driver it reaches
    strings: frozenset[str]  # of this checkout's code only: the library's messages mention torchrun and pip


# Names a test reaches next to what starts a process, not what starts it: shown only when nothing else is.
_BYSTANDERS = frozenset({"TimeoutExpired", "CalledProcessError", "SubprocessError", "CompletedProcess", "DEVNULL", "PIPE",
                         "STDOUT"})


def _telling(name: str) -> tuple[bool, int]:
    """How well ``name`` tells why a marker was earned: what starts something, then the most specific."""
    return name.rpartition(".")[2] not in _BYSTANDERS, len(name)


def _merge(parts: Iterable[_Evidence]) -> _Evidence:
    hits: dict[str, str] = {}
    drivers: set[int] = set()
    strings: set[str] = set()
    for part in parts:
        for marker, name in part.hits.items():
            if marker not in hits or _telling(name) > _telling(hits[marker]):
                hits[marker] = name
        drivers |= part.drivers
        strings |= part.strings
    return _Evidence(hits, frozenset(drivers), frozenset(strings))


@dataclasses.dataclass(frozen=True)
class _EntryPoint:
    """A part of an interface a test drives by name: the strings that name it, and the code it runs."""

    label: str  # how the evidence names it: "`modulelens kernel verify`"
    words: tuple[str, ...]  # all of them among the test's strings
    target: Any
    magic: bool = False  # "%ml_export ..." names it as well as "ml_export"


def _cli_commands() -> list[_EntryPoint]:
    import typer

    from modulelens.interfaces.cli import app

    found: list[_EntryPoint] = []
    root = typer.main.get_command(app)
    context = type(root).context_class(root)  # typer brings its own copy of click

    def walk(group: Any, words: tuple[str, ...]) -> None:
        for name in group.list_commands(context):
            command = group.get_command(context, name)
            if hasattr(command, "list_commands"):  # a group: kernel, agent
                walk(command, (*words, name))
            elif command is not None and command.callback is not None:
                found.append(_EntryPoint(f"`modulelens {' '.join((*words, name))}`", (*words, name), command.callback))

    walk(root, ())
    return found


def _magics() -> list[_EntryPoint]:
    from modulelens.interfaces import ipython

    return [_EntryPoint(f"`%{name}`", (name,), function, magic=True)
            for cls in vars(ipython).values() if inspect.isclass(cls) and cls.__module__ == ipython.__name__
            for name, function in vars(cls).items() if name.startswith("ml_") and inspect.isfunction(_unwrap(function))]


def _mcp_tools() -> list[_EntryPoint]:
    from modulelens.interfaces import mcp_server

    # the tools are functions nested in the ones that register them
    return [_EntryPoint(f"the MCP tool {const.co_name}", (const.co_name,), _Code(const, function.__globals__, "library"))
            for function in vars(mcp_server).values()
            if inspect.isfunction(function) and function.__module__ == mcp_server.__name__
            for const in function.__code__.co_consts if isinstance(const, types.CodeType) and not const.co_name.startswith("<")]


# Interfaces a test drives by name, each looked at when the test reaches what drives it: the CLI
# run in-process (a command line's words, "kernel", "verify"; "run" alone is a common word, hence
# the runner), the IPython magics, the MCP tools.
_INTERFACES = (
    (("typer.testing.CliRunner", "click.testing.CliRunner"), _cli_commands),
    (("IPython",), _magics),
    (("modulelens.interfaces.mcp_server", "mcp"), _mcp_tools),
)


class Classifier:
    """Which markers a test's code earns by the rules. Each function is read once and what it
    reaches is summed once (per strongly connected group of functions that call each other), so
    classifying a suite costs about one reading of the code it reaches."""

    def __init__(self, rules: tuple[Rule, ...] = RULES) -> None:
        self.rules = rules
        self._uses: dict[_Code, _Uses] = {}
        self._reached: dict[_Code, _Evidence] = {}
        self._by_name: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {}
        self._interfaces: dict[int, list[_EntryPoint]] = {}

    def markers_of_item(self, item: pytest.Item) -> dict[str, str]:
        """The markers a collected test earns, each with the evidence (``{"subprocess": "reaches
        subprocess.run"}``): from its function, the fixtures it requests, the fixtures its code names
        (``request.getfixturevalue("env")``) and its callable parameters."""
        roots = _roots(item)
        strings = self._evidence(roots).strings
        roots += [definition.func for name in strings for definition in _fixtures_named(item, name)]
        return self.markers_of(roots)

    def markers_of(self, roots: Iterable[Any]) -> dict[str, str]:
        """The markers earned by everything reachable from ``roots`` (functions, classes), each with its evidence."""
        found = self._evidence(list(roots))
        sources = [("", found)]
        for entry in self._entry_points(found.drivers):
            if _drives(entry, found.strings):
                sources.append((f" (through {entry.label})", self._evidence([entry.target])))
        earned = self._judge(sources)
        for kind in sorted(earned.keys() & PROCESS_KINDS):
            # each of them starts a process, whatever library starts it (jupyter_client, selenium...)
            earned.setdefault("subprocess", f"{kind}: {earned[kind]}")
        return earned

    def _evidence(self, roots: list[Any]) -> _Evidence:
        return _merge(self._reach(code) for root in roots for code in _codes_of(root))

    def _entry_points(self, drivers: frozenset[int]) -> Iterator[_EntryPoint]:
        """The entry points of the interfaces whose driver the test reaches (an interface whose
        optional dependency is missing here, IPython or mcp, has none)."""
        for index in sorted(drivers):
            if index not in self._interfaces:
                try:
                    self._interfaces[index] = _INTERFACES[index][1]()
                except ImportError:
                    self._interfaces[index] = []
            yield from self._interfaces[index]

    def _own(self, code: _Code) -> tuple[_Evidence, list[_Code]]:
        """What ``code`` itself earns by name and uses, and the code it calls that is followed."""
        if code not in self._uses:
            self._uses[code] = _read(code)
        uses = self._uses[code]
        hits: dict[str, str] = {}
        drivers: set[int] = set()
        for name in uses.names:
            markers, interfaces = self._classify_name(name)
            for marker in markers:
                if marker not in hits or _telling(name) > _telling(hits[marker]):
                    hits[marker] = name
            drivers.update(interfaces)
        strings = frozenset(uses.strings) if code.origin == "project" else frozenset()
        return _Evidence(hits, frozenset(drivers), strings), [c for callee in uses.callees for c in _codes_of(callee)]

    def _classify_name(self, name: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
        if name not in self._by_name:
            self._by_name[name] = (tuple(rule.marker for rule in self.rules if _matches(name, rule.names)),
                                   tuple(i for i, (drivers, _) in enumerate(_INTERFACES) if _matches(name, drivers)))
        return self._by_name[name]

    def _reach(self, start: _Code) -> _Evidence:
        """Everything reachable from ``start``, summed per strongly connected group (Tarjan's
        algorithm, iterative: call chains are deeper than Python's recursion limit allows)."""
        if start in self._reached:
            return self._reached[start]
        index: dict[_Code, int] = {}
        low: dict[_Code, int] = {}
        own: dict[_Code, _Evidence] = {}
        below: dict[_Code, list[_Evidence]] = {}
        group: list[_Code] = []
        on_group: set[_Code] = set()
        work: list[tuple[_Code, Iterator[_Code]]] = []

        def enter(code: _Code) -> None:
            index[code] = low[code] = len(index)
            own[code], callees = self._own(code)
            below[code] = []
            group.append(code)
            on_group.add(code)
            work.append((code, iter(callees)))

        enter(start)
        while work:
            code, callees = work[-1]
            callee = next(callees, None)
            if callee is not None:
                if callee in self._reached:
                    below[code].append(self._reached[callee])
                elif callee not in index:
                    enter(callee)
                elif callee in on_group:
                    low[code] = min(low[code], index[callee])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[code])
            if low[code] == index[code]:  # ``code`` heads a group: everything in it reaches the same
                members = []
                while True:
                    member = group.pop()
                    on_group.discard(member)
                    members.append(member)
                    if member is code:
                        break
                summed = _merge([own[m] for m in members] + [e for m in members for e in below[m]])
                for member in members:
                    self._reached[member] = summed
                if work and work[-1][0] not in self._reached:
                    below[work[-1][0]].append(summed)
        return self._reached[start]

    def _judge(self, sources: list[tuple[str, _Evidence]]) -> dict[str, str]:
        """The markers earned, each with the first evidence (``sources``: where, what was reached there)."""
        earned: dict[str, str] = {}
        for where, found in sources:  # by name first, so that ``only_with`` can see those
            for marker, name in found.hits.items():
                earned.setdefault(marker, f"reaches {name}{where}")
        for rule in self.rules:
            if rule.only_with is not None and rule.only_with not in earned:
                continue
            for where, found in sources:
                text = next((t for t in sorted(found.strings) if any(s in t for s in rule.substrings)), None)
                if text is not None:
                    earned.setdefault(rule.marker, f"uses the string {text[:60]!r}{where}")
                word = next((w for w in rule.words if w in found.strings), None)
                if word is not None:
                    earned.setdefault(rule.marker, f"names {word!r} with a process{where}")
        return earned


def _drives(entry: _EntryPoint, strings: set[str]) -> bool:
    if entry.magic:
        [word] = entry.words
        return any(s == word or s == f"%{word}" or s.startswith((f"%{word} ", f"%{word}\n")) for s in strings)
    return all(word in strings for word in entry.words)


def _roots(item: pytest.Item) -> list[Any]:
    """What a test runs: its function, every fixture it requests (directly or through other
    fixtures, autouse included) and the followed callables among its parameters."""
    roots: list[Any] = []
    function = getattr(item, "function", None)
    if function is not None:
        roots.append(function)
    # pytest has no public accessor for the fixture definitions a test resolved to
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        roots += [definition.func for definition in (info.name2fixturedefs.get(name, ()) if info is not None else ())]
    callspec = getattr(item, "callspec", None)
    for value in (callspec.params.values() if callspec is not None else ()):
        members = vars(value).values() if dataclasses.is_dataclass(value) and not isinstance(value, type) else [value]
        roots += [member for member in members if callable(member) and _codes_of(member)]
    return roots


def _fixtures_named(item: pytest.Item, name: str) -> list[Any]:
    """The fixture definitions ``name`` resolves to for ``item``, if it names one (pytest's fixture
    manager has no public lookup; ``request.getfixturevalue`` uses this one)."""
    if not name.isidentifier():
        return []
    manager = getattr(item.session, "_fixturemanager", None)
    try:
        return list(manager.getfixturedefs(name, item) or ()) if manager is not None else []
    except Exception:  # its signature changed: the guard still sees what such a fixture starts
        return []


def is_fast(item: pytest.Item) -> bool:
    return not any(item.get_closest_marker(marker) for marker in MARKERS)


# -- the guard -------------------------------------------------------------------------------------

def _program(argv: Any) -> str:
    """The program a command line runs (the one after ``env VAR=...`` when it starts with env)."""
    words = [argv] if isinstance(argv, (str, bytes, os.PathLike)) else list(argv or ())
    words = [os.fsdecode(w) for w in words]
    if len(words) == 1 and " " in words[0]:  # a shell command line
        words = words[0].split()
    while words and (Path(words[0]).name == "env" or "=" in words[0] or words[0].startswith("-")):
        words = words[1:]
    return Path(words[0]).name if words else ""


class ProcessWatch:
    """Every process this pytest process starts while a test runs: ``subprocess``, ``os``'s fork,
    spawn and system (audit events) and multiprocessing's spawn and forkserver starts (no audit
    event: the one function that makes them is wrapped). Forked children record nothing."""

    _EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system"})
    _installed: ClassVar[list[ProcessWatch]] = []  # one audit hook and one wrapper serve them all (a hook cannot be removed)

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._recording = False
        self.started: list[str] = []

    def install(self) -> None:
        if not ProcessWatch._installed:
            sys.addaudithook(ProcessWatch._audit)
            import multiprocessing.util

            spawn = multiprocessing.util.spawnv_passfds

            @functools.wraps(spawn)
            def watched(path: Any, args: Any, passfds: Any) -> Any:
                for watch in ProcessWatch._installed:
                    watch._record("multiprocessing", args)
                return spawn(path, args, passfds)

            multiprocessing.util.spawnv_passfds = watched
        if self not in ProcessWatch._installed:
            ProcessWatch._installed.append(self)

    def start(self) -> None:
        self.started = []
        self._recording = True

    def stop(self) -> None:
        self._recording = False

    @staticmethod
    def _audit(event: str, args: tuple[Any, ...]) -> None:
        if event in ProcessWatch._EVENTS:
            for watch in ProcessWatch._installed:
                watch._record(event, args)

    def _record(self, event: str, args: Any) -> None:
        if not self._recording or os.getpid() != self._pid:
            return
        if event in ("os.fork", "os.forkpty"):
            self.started.append(f"{event}()")
            return
        argv = {"multiprocessing": lambda: args, "subprocess.Popen": lambda: args[1], "os.posix_spawn": lambda: args[1],
                "os.spawn": lambda: args[2], "os.system": lambda: args[0]}[event]()
        if _program(argv) in CHEAP_PROGRAMS:
            return
        words = [argv] if isinstance(argv, (str, bytes, os.PathLike)) else list(argv or ())
        self.started.append(" ".join(os.fsdecode(w) for w in words)[:200])


def guard_message(item: pytest.Item, started: list[str]) -> str:
    more = f" (and {len(started) - 1} more)" if len(started) > 1 else ""
    return (f"{item.nodeid} is in the fast tier but started a process: {started[0]}{more}. The tier rules "
            f"(tests/support/tiers.py; docs/architecture.md \"Test tiers\") did not see it: mark the test "
            f"@pytest.mark.subprocess (or with what it starts: {', '.join(sorted(PROCESS_KINDS))}), "
            f"or teach RULES the helper it uses.")


def _describe(selected: list[pytest.Item], deselected: list[pytest.Item], tier: str, seconds: float) -> str:
    counts = {marker: sum(1 for item in [*selected, *deselected] if item.get_closest_marker(marker)) for marker in MARKERS}
    kinds = ", ".join(f"{marker} {count}" for marker, count in counts.items() if count)
    if tier == FAST_TIER:
        return (f"tier: fast, {len(selected)} tests ({len(deselected)} of other tiers deselected: {kinds}; "
                f"`bash scripts/test --all` runs every tier; tiers read in {seconds:.1f} s)")
    return f"tier: all, {len(selected)} tests (outside the fast tier: {kinds}; tiers read in {seconds:.1f} s)"


# -- the hooks (tests/conftest.py imports them: one home for the tiers, also for a pytest run of its own) ---

TIER_ENV = "MODULELENS_TEST_TIER"
_WATCH = ProcessWatch()
_SUMMARY: list[str] = []  # printed after collection (by the controller, at the end, under xdist)
_FROM_WORKERS: list[str] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--tier", choices=(FAST_TIER, ALL_TIERS), default=None,
                     help=f"which tests run: '{FAST_TIER}' (unit and in-process: no test marked {', '.join(MARKERS)}) "
                          f"or '{ALL_TIERS}' (the default; ${TIER_ENV} sets it too)")
    parser.addoption("--tier-why", action="store_true",
                     help="print each test's tier markers with the evidence for each (with --collect-only: no run)")


def configure(config: pytest.Config) -> None:
    """Register the markers and start watching for processes (from the conftest's pytest_configure)."""
    for marker, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{marker}: {meaning} (outside the fast tier)")
    if config.rootpath.resolve() not in PROJECT_ROOTS:
        PROJECT_ROOTS.append(config.rootpath.resolve())
        _origin_of_file.cache_clear()
    _WATCH.install()


def _tier(config: pytest.Config) -> str:
    chosen = config.getoption("--tier") or os.environ.get(TIER_ENV) or ALL_TIERS
    if chosen not in (FAST_TIER, ALL_TIERS):
        raise pytest.UsageError(f"${TIER_ENV}={chosen!r}: expected '{FAST_TIER}' or '{ALL_TIERS}'")
    return chosen


@pytest.hookimpl(tryfirst=True)  # before ``-m`` is applied, so that it can select on these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    started = time.perf_counter()
    classifier = Classifier()
    _SUMMARY.clear()
    for item in items:
        try:
            earned = classifier.markers_of_item(item)
        except Exception as error:  # a defect of the rules must not stop the run; the guard still watches
            item.warn(pytest.PytestWarning(f"test tiers: could not read what this test uses ({error!r})"))
            continue
        for marker in sorted(earned):
            if not item.get_closest_marker(marker):
                item.add_marker(marker)
        if config.getoption("--tier-why"):
            reasons = "; ".join(f"{marker}: {earned.get(marker, 'marked in its file')}"
                                for marker in MARKERS if item.get_closest_marker(marker))
            _SUMMARY.append(f"{item.nodeid}: {reasons or 'fast tier (nothing costly reached)'}")
    tier = _tier(config)
    selected = [item for item in items if tier == ALL_TIERS or is_fast(item)]
    deselected = [item for item in items if tier == FAST_TIER and not is_fast(item)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected
    _SUMMARY.append(_describe(selected, deselected, tier, time.perf_counter() - started))


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    return list(_SUMMARY)


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)  # an xdist worker: hand the summary over
    if output is not None:
        output["tier_summary"] = list(_SUMMARY)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    if not _FROM_WORKERS:
        _FROM_WORKERS.extend(getattr(node, "workeroutput", {}).get("tier_summary", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _FROM_WORKERS:
        terminalreporter.write_line(line)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    _WATCH.start()
    try:
        return (yield)
    finally:
        _WATCH.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """A fast-tier test that started a process fails (after its own verdict): the rules missed what
    it uses, and the fast tier would get slow without anyone noticing."""
    report: pytest.TestReport = yield
    if call.when in ("call", "teardown") and _WATCH.started and is_fast(item):
        message = guard_message(item, _WATCH.started)
        _WATCH.started = []
        if report.passed:
            report.outcome = "failed"
            report.longrepr = message
        else:
            report.sections.append(("test tiers", message))
    return report
