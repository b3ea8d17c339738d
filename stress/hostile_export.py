"""Hostile captures through kernel export and the MCP tool ``export_kernel_problem`` (issue 21, defect 1).

Export writes ``problem.py`` and ``test_modulelens.py`` from a capture and runs ``problem.py`` for
its self-check, so every string a capture holds is a way to put code into files that KernelBench,
KernelAgent and the exporter run. Each case here is a capture whose strings try to break out of
the literal, comment or docstring they land in -- quotes, newlines, triple quotes, backslashes,
unicode line separators -- through every string field that reaches generated code: the module's
qualified name, parameter and buffer names, ``**kwargs`` keys of a call, constructor keyword names
and string values, ``functools.partial`` keyword names, dataclass fields, enum values,
transformers config keys, dtype/device values, output dict keys, the stored source of a class that
is really imported (a re-export), and a class that exists only in untrusted stored source.

Most cases are *natural*: a real module registered with those names and called with those
keywords (``nn.Module`` accepts any name without a dot). The rest rewrite a real capture's
metadata. The code each string tries to run creates a marker file, so "executed" is a fact on
disk. Checked per case, for ``export_kernelbench`` and for the MCP tool:

- executed: the marker exists (export runs the self-check, so injected code would run);
- written outside: a file appeared in the folder the payloads target, or in the working folder;
- wrong: a natural case that does not reproduce its recorded outputs, a capture string value that is
  not in ``problem.py`` as the same literal, a generated file that does not parse or that calls
  ``open``/``system``/``__import__`` (the payloads' statements);
- unrelated traceback: an exception that is not a modulelens error (a clean refusal is fine).
"""

from __future__ import annotations

import ast
import contextlib
import enum
import functools
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import modulelens
from modulelens.errors import ModulelensError

# ---------------------------------------------------------------------------------- the module


def scaled(x: torch.Tensor, **factors: float) -> torch.Tensor:
    """An activation taking any keyword (a partial of it carries hostile keyword names)."""
    return torch.tanh(x) * (1.0 + 0.0 * len(factors))


@dataclass
class Options:
    scale: float = 1.0


class Kind(enum.Enum):
    PLAIN = "plain"


class Probe(nn.Module):
    """A module whose names, keywords, values and output keys are whatever strings a case gives it."""

    def __init__(self, n: int = 4, label: str = "", key: str = "out", param: str = "weight", buffer: str = "scale",
                 act: Any = None, **options: Any) -> None:
        super().__init__()
        self.register_parameter(param, nn.Parameter(torch.randn(n, n)))
        self.register_buffer(buffer, torch.linspace(0.5, 1.5, n))
        self.param_name, self.buffer_name, self.key, self.label, self.act = param, buffer, key, label, act
        self.options = options

    def forward(self, x: torch.Tensor, extra: Any = None, **kwargs: Any) -> dict[str, torch.Tensor]:
        y = (x @ getattr(self, self.param_name)) * getattr(self, self.buffer_name)
        if self.act is not None:
            y = self.act(y)
        for value in [*kwargs.values(), *(extra.values() if isinstance(extra, dict) else [])]:
            if isinstance(value, torch.Tensor):
                y = y + value.sum()
        return {self.key: y}


# ---------------------------------------------------------------------------------- the cases


def payloads(marker: Path) -> list[tuple[str, str]]:
    """Strings that end the literal/comment/docstring they are put in and run ``open(marker, 'w')``
    (no dots: ``nn.Module`` refuses parameter names with a dot)."""
    code = f"open({str(marker)!r}, 'w')"
    return [
        ("docstring breaker", f"')\n\"\"\"\nimport os; {code}\n\"\"\"('"),
        ("quotes", f"x'\n{code}\n#\"\n{code}"),
        ("triple single quotes", f"'''\n{code}\n'''"),
        ("backslashes", f"\\\\\"\"\"\n{code} # \\"),
        ("unicode line separators", f"\u2028{code}\u2029\x0c{code}\r{code}\x85{code}"),
    ]


@dataclass
class Case:
    """One hostile capture: ``make(repo, name, text)`` saves it and returns its ref; ``edit`` then
    rewrites its metadata; ``value`` is a string that must reach problem.py as the same literal."""

    label: str
    make: Callable[[modulelens.Repo, str, str], str]
    edit: Callable[[dict[str, Any], str, Path], None] | None = None  # (metadata, string, marker)
    natural: bool = True  # a real module's capture: it must export and reproduce its outputs
    value: bool = False
    refused: bool = False  # must be refused (an untrusted stored-source class)


def _capture(repo: modulelens.Repo, name: str, build: Callable[[], nn.Module], *args: Any, **kwargs: Any) -> str:
    torch.manual_seed(0)
    handle = modulelens.track_init()
    try:
        model = nn.Sequential(build())
    finally:
        handle.stop()
    with modulelens.capture(model, targets=["0"], repo=repo, name=name, strict=True) as cap, torch.no_grad():
        model[0](*args, **kwargs)
    return cap.saved[0].ref


def _probe(**init: Any) -> Callable[[modulelens.Repo, str, str], str]:
    """A Probe built with ``init`` (``TEXT`` replaced by the case's string), called on one input."""
    def make(repo: modulelens.Repo, name: str, text: str) -> str:
        options = {(text if k == "TEXT" else k): (text if v == "TEXT" else v) for k, v in init.items()}
        return _capture(repo, name, lambda: Probe(**options), torch.randn(2, 4))
    return make


def _called(**call: Any) -> Callable[[modulelens.Repo, str, str], str]:
    def make(repo: modulelens.Repo, name: str, text: str) -> str:
        kwargs = {(text if k == "TEXT" else k): v for k, v in call.items()}
        if "extra" in kwargs:
            kwargs["extra"] = {text: torch.ones(2)}
        return _capture(repo, name, Probe, torch.randn(2, 4), **kwargs)
    return make


def _construction(meta: dict[str, Any]) -> dict[str, Any]:
    return meta["constructions"][meta["module"]["construction"]]


def _set_kwarg(value: Callable[[str], Any]) -> Callable[[dict[str, Any], str, Path], None]:
    def edit(meta: dict[str, Any], text: str, marker: Path) -> None:
        _construction(meta)["kwargs"]["extra_option"] = value(text)
    return edit


def _set_qualified_name(meta: dict[str, Any], text: str, marker: Path) -> None:
    meta["module"]["qualified_name"] = text


def _reexport_with_stored_source(meta: dict[str, Any], text: str, marker: Path) -> None:
    """The class path names a re-export (``transformers:LlamaModel``, defined in
    ``transformers.models.llama.modeling_llama``) and the capture stores source under the
    re-exporting module's name whose class body runs code."""
    path = "transformers:LlamaModel"
    meta["module"]["class"] = path
    _construction(meta)["class"] = path
    source = f"import torch\nclass LlamaModel(torch.nn.Module):\n    open({str(marker)!r}, 'w')\n    LABEL = {text!r}\n"
    meta["sources"] = {"transformers": {"file": "/nonexistent/transformers/__init__.py", "text": source,
                                        "hash": "blake3:" + "0" * 64, "classes": {"LlamaModel": {}}}}


def _untrusted_stored_class(meta: dict[str, Any], text: str, marker: Path) -> None:
    meta["module"]["class"] = "evil_export_module:Evil"
    _construction(meta).update({"class": "evil_export_module:Evil", "args": [], "kwargs": {}})
    source = f"import torch\nclass Evil(torch.nn.Module):\n    open({str(marker)!r}, 'w')\n    LABEL = {text!r}\n"
    meta["sources"] = {"evil_export_module": {"file": "/nonexistent/evil_export_module.py", "text": source,
                                              "hash": "blake3:" + "0" * 64, "classes": {}}}


def _llama_model(repo: modulelens.Repo, name: str, text: str) -> str:
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                         max_position_embeddings=16)
    return _capture(repo, name, lambda: LlamaModel(config), torch.randint(0, 32, (1, 4)))


def _config_keys(text: str) -> dict[str, Any]:
    from modulelens.format.transformers_codecs import CODEC_NAME

    config = {"$type": "dict", "items": [["hidden_size", 8], ["num_attention_heads", 2], [text, 1]]}
    return {"$type": "codec", "codec": CODEC_NAME, "class": "transformers.models.llama.configuration_llama:LlamaConfig",
            "value": {"$type": "dict", "items": [["config", config]]}}


CASES: list[Case] = [
    Case("qualified name", _probe(), edit=_set_qualified_name, natural=False),
    Case("parameter name", _probe(param="TEXT")),
    Case("buffer name", _probe(buffer="TEXT")),
    Case("constructor string value", _probe(label="TEXT"), value=True),
    Case("constructor keyword name", _probe(TEXT=3), value=True),
    Case("output dict key", _probe(key="TEXT")),
    Case("call **kwargs key", _called(TEXT=torch.ones(2))),
    Case("call dict input key", _called(extra=None)),
    Case("partial keyword name", lambda repo, name, text: _capture(
        repo, name, lambda: Probe(act=functools.partial(scaled, **{text: 2.0})), torch.randn(2, 4))),
    Case("dataclass field name", lambda repo, name, text: _capture(repo, name, lambda: Probe(opts=Options()), torch.randn(2, 4)),
         edit=lambda meta, text, marker: _construction(meta)["kwargs"]["opts"]["fields"]["items"].append([text, 1.0]),
         natural=False),
    Case("enum value", lambda repo, name, text: _capture(repo, name, lambda: Probe(kind=Kind.PLAIN), torch.randn(2, 4)),
         edit=lambda meta, text, marker: _construction(meta)["kwargs"]["kind"].update(value=text), natural=False),
    Case("transformers config key", _probe(), edit=_set_kwarg(_config_keys), natural=False),
    Case("dtype value", _probe(), edit=_set_kwarg(lambda text: {"$type": "dtype", "value": text}), natural=False),
    Case("device value", _probe(), edit=_set_kwarg(lambda text: {"$type": "device", "value": text}), natural=False),
    Case("import path", _probe(), edit=_set_kwarg(lambda text: {"$type": "import", "path": f"torch:{text}"}),
         natural=False),
    Case("stored source of a re-exported class", _llama_model, edit=_reexport_with_stored_source, natural=False),
    Case("class only in untrusted stored source", _probe(), edit=_untrusted_stored_class, natural=False, refused=True),
]


# ---------------------------------------------------------------------------------- the checks


@dataclass
class Tally:
    tried: int = 0
    survived: int = 0
    executed: int = 0
    outside: int = 0
    wrong: int = 0
    tracebacks: int = 0
    notes: list[str] = field(default_factory=list)


_CALLED = {"open", "system", "__import__", "exec", "eval"}


def generated_code_problems(directory: Path) -> list[str]:
    """Why the generated files are not safe: a parse error, or a call the payloads make."""
    problems = []
    for name in ("problem.py", "test_modulelens.py"):
        try:
            tree = ast.parse((directory / name).read_text())
        except SyntaxError as error:
            problems.append(f"{name} does not parse: {error}")
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                called = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if called in _CALLED:
                    problems.append(f"{name} line {node.lineno} calls {called}")
    return problems


def _holds_literal(directory: Path, text: str) -> bool:
    tree = ast.parse((directory / "problem.py").read_text())
    return any(isinstance(node, ast.Constant) and node.value == text for node in ast.walk(tree))


class ToolRefusedError(Exception):
    """The MCP tool answered with a one-line tool error (a clean refusal)."""


def plant(repo: modulelens.Repo, ref: str, edit: Callable[[dict[str, Any], str, Path], None], text: str,
          marker: Path) -> None:
    """Rewrite the metadata of ``ref`` with ``edit``."""
    name, version = repo.resolve(ref)
    path = repo.version_path(name, version) / "capture.json"
    meta = json.loads(path.read_text())
    edit(meta, text, marker)
    os.chmod(path, 0o644)
    path.write_text(json.dumps(meta))


def _export_mcp(repo: modulelens.Repo, ref: str, out: Path) -> dict[str, Any]:
    """``export_kernel_problem`` through the MCP SDK's in-process client; a known error comes back as
    a tool error (raised here as ToolRefusedError), anything else is raised as it is."""
    import anyio
    from mcp import Client

    from modulelens.interfaces.mcp_server import build_server

    async def call() -> Any:
        async with Client(build_server(str(repo.root)), raise_exceptions=True) as client:
            return await client.call_tool("export_kernel_problem", {"ref": ref, "output_dir": str(out)})

    result = anyio.run(call)
    if result.is_error:
        text = "\n".join(getattr(c, "text", "") for c in result.content)
        if text.strip().endswith("Error executing tool export_kernel_problem"):  # the SDK's word for a crash
            raise RuntimeError(f"the tool crashed: {text[:200]}")
        if "\n" in text.strip():
            raise RuntimeError(f"a tool error of several lines: {text[:200]}")
        raise ToolRefusedError(text)
    return result.structured_content["manifest"]


def _export_api(repo: modulelens.Repo, ref: str, out: Path) -> dict[str, Any]:
    from modulelens.kernels.export import export_kernelbench

    return export_kernelbench(ref, out, repo=repo).manifest


def run_case(case: Case, text: str, repo: modulelens.Repo, work: Path, tally: Tally, label: str,
             ways: tuple[str, ...] = ("api", "mcp")) -> None:
    """Make the case's capture, export it through the API and the MCP tool (``ways``), and tally
    what happened."""
    outside = work / "outside"
    marker = outside / "marker"
    try:
        ref = case.make(repo, f"x{tally.tried}", text)
        if case.edit is not None:
            plant(repo, ref, case.edit, text, marker)
    except ModulelensError as error:  # the capture itself refused the names (not an export result)
        tally.notes.append(f"{label}: not captured ({type(error).__name__})")
        return
    for how, export in (("api", _export_api), ("mcp", _export_mcp)):
        if how not in ways:
            continue
        tally.tried += 1
        out = work / f"problem-{tally.tried}"
        before = set(os.listdir(os.getcwd()))
        problem = ""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                manifest = export(repo, ref, out)
            if case.refused:
                problem = "exported a class that exists only in untrusted stored source"
            else:
                problem = "; ".join(generated_code_problems(out))
                check = manifest.get("self_check", {})
                if not problem and case.natural and not check.get("reproduces_recorded_outputs"):
                    problem = f"does not reproduce its recorded outputs ({check.get('error')})"
                if not problem and case.value and not _holds_literal(out, text):
                    problem = "the string is not in problem.py as the same literal"
        except (ModulelensError, ToolRefusedError) as error:
            if case.refused and "trust" not in str(error):
                problem = f"refused without saying how to trust: {str(error)[:120]}"
        except Exception as error:  # an unrelated traceback
            tally.tracebacks += 1
            tally.notes.append(f"{label} ({how}): {type(error).__name__}: {str(error)[:160]}")
            continue
        executed = marker.exists()
        written = executed or any(outside.iterdir()) or set(os.listdir(os.getcwd())) - before
        tally.executed += executed
        tally.outside += bool(written)
        if problem:
            tally.wrong += 1
            tally.notes.append(f"{label} ({how}): {problem[:200]}")
        tally.survived += not (executed or written or problem)
        for leftover in outside.iterdir():
            leftover.unlink()
        shutil.rmtree(out, ignore_errors=True)


def run_all(work: Path, payload_count: int | None = None, ways: tuple[str, ...] = ("api", "mcp")) -> Tally:
    """Every case with every payload string (the first ``payload_count`` of them)."""
    tally = Tally()
    (work / "outside").mkdir(parents=True, exist_ok=True)
    repo = modulelens.Repo(work / "repo")
    for case in CASES:
        for kind, text in payloads(work / "outside" / "marker")[:payload_count]:
            run_case(case, text, repo, work, tally, f"{case.label} / {kind}", ways)
    return tally


def hostile_export_row(tmp: Path, payload_count: int | None = None, ways: tuple[str, ...] = ("api", "mcp")) -> Any:
    """The stress row: hostile captures through export and the MCP export tool (``payload_count``
    payload strings per field, all of them by default; ``ways`` says which of the two)."""
    from stress.table import Row

    start = time.perf_counter()
    work = tmp / "hostile-export"
    with contextlib.chdir(tmp):
        tally = run_all(work, payload_count, ways)
    row = Row("hostile captures through export / MCP export")
    row.tried, row.survived, row.executed = tally.tried, tally.survived, tally.executed
    row.wrong = tally.wrong + tally.outside + tally.tracebacks
    shown = len(payloads(work)[:payload_count])
    through = " + ".join({"api": "export API", "mcp": "MCP tool"}[way] for way in ways)
    row.notes = [f"{len(CASES)} string fields x {shown} payloads, {through}: "
                 f"{tally.executed} executed, {tally.outside} written outside, {tally.wrong} wrong, "
                 f"{tally.tracebacks} unrelated tracebacks", *tally.notes]
    row.seconds = time.perf_counter() - start
    return row


