"""Kernel export writes no code from a capture (issue 21, defect 1).

The hostile captures come from ``stress/hostile_export.py`` (the stress suite's row uses the same
cases with every payload string): strings with quotes, newlines, triple quotes, backslashes and
unicode line separators in every field that reaches ``problem.py`` / ``test_modulelens.py``. Each
payload, if it escaped its literal, would create a marker file; export runs ``problem.py`` for its
self-check, so "executed" is checked on disk.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import modulelens
from modulelens.errors import UnsupportedValueError
from modulelens.interfaces.cli import app
from modulelens.kernels.export import export_kernelbench
from modulelens.kernels.render import comment_text, dotted, identifier, keyword_arguments, literal
from stress import hostile_export as hx

HOSTILE = [text for _, text in hx.payloads(Path("/nonexistent/marker"))] + [
    "'", '"', '"""', "'''", "\\", "\\'", "\n", "\r\n", "\u2028", "\u2029", "\x85", "\x0c", "\x00", "\x1b]52;c;aGk=\x07",
    "é\U0001f600", "a\\\n'''\"\"\"b",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_literals_read_back_exactly_and_stay_one_token(text: str) -> None:
    for value in (text, [text, (text,)], {text: text}):
        source = literal(value, "test")
        assert source.isascii() and "\n" not in source and "\r" not in source
        assert ast.literal_eval(source) == value


@pytest.mark.parametrize("text", HOSTILE)
def test_comment_text_cannot_end_a_docstring_or_a_comment(text: str) -> None:
    shown = comment_text(f"model.{text}.mlp")
    assert not set(shown) & set("'\"\\\n\r\x0c\x0b\x00") and shown.isascii() and shown.isprintable()
    ast.parse(f'"""{shown}"""\n# {shown}\nx = 1\n')


@pytest.mark.parametrize("text", [*HOSTILE, "class", "None", "a b", "ℌ", ""])
def test_identifiers_are_checked_and_keywords_passed_as_a_dict(text: str) -> None:
    with pytest.raises(UnsupportedValueError, match="not a plain Python identifier"):
        identifier(text, "name")
    with pytest.raises(UnsupportedValueError):
        dotted(f"pkg.{text}", "path")
    call = f"f({', '.join(keyword_arguments([('ok', '1'), (text, '2')], 'test'))})"
    tree = ast.parse(call, mode="eval")
    assert [k.arg for k in tree.body.keywords] == ["ok", None]  # the hostile name travels inside **{...}
    assert ast.literal_eval(tree.body.keywords[1].value.keys[0]) == text
    assert dotted("transformers.models.llama", "path") == "transformers.models.llama"


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[modulelens.Repo, Path]:
    (tmp_path / "outside").mkdir()
    return modulelens.Repo(tmp_path / "repo"), tmp_path


def _run(case: hx.Case, text: str, repo: modulelens.Repo, work: Path, monkeypatch: pytest.MonkeyPatch,
         ways: tuple[str, ...] = ("api",)) -> hx.Tally:
    (work / "cwd").mkdir(exist_ok=True)
    monkeypatch.chdir(work / "cwd")  # nothing may appear in the working folder either
    tally = hx.Tally()
    hx.run_case(case, text, repo, work, tally, case.label, ways)
    return tally


@pytest.mark.parametrize("case", hx.CASES, ids=[c.label for c in hx.CASES])
def test_every_field_with_a_docstring_breaker(case: hx.Case, hostile: tuple[modulelens.Repo, Path],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    repo, work = hostile
    text = hx.payloads(work / "outside" / "marker")[0][1]
    tally = _run(case, text, repo, work, monkeypatch)
    assert tally.tried and (tally.executed, tally.outside, tally.wrong, tally.tracebacks) == (0, 0, 0, 0), tally.notes
    assert tally.survived == tally.tried, tally.notes


@pytest.mark.parametrize("kind", [k for k, _ in hx.payloads(Path("/m"))])
def test_every_payload_in_the_qualified_name_and_a_parameter_name(kind: str, hostile: tuple[modulelens.Repo, Path],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    repo, work = hostile
    text = dict(hx.payloads(work / "outside" / "marker"))[kind]
    for case in (c for c in hx.CASES if c.label in ("qualified name", "parameter name")):
        tally = _run(case, text, repo, work, monkeypatch)
        assert (tally.executed, tally.outside, tally.wrong, tally.tracebacks) == (0, 0, 0, 0), tally.notes


def test_the_issue_payload_through_the_mcp_tool(hostile: tuple[modulelens.Repo, Path],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    repo, work = hostile
    text = hx.payloads(work / "outside" / "marker")[0][1]
    case = next(c for c in hx.CASES if c.label == "qualified name")
    tally = _run(case, text, repo, work, monkeypatch, ways=("api", "mcp"))
    assert tally.tried == 2 and tally.survived == 2, tally.notes
    assert not (work / "outside" / "marker").exists()


def test_the_generated_files_hold_the_names_as_data(hostile: tuple[modulelens.Repo, Path]) -> None:
    """A natural capture with a hostile parameter name, output key and **kwargs key exports, runs
    and reproduces, and the names are in the files only inside literals, docstrings and comments."""
    repo, work = hostile
    text = hx.payloads(work / "outside" / "marker")[0][1]
    torch.manual_seed(0)
    with modulelens.track_init():
        model = torch.nn.Sequential(hx.Probe(param=text, key=text, label=text))
    with modulelens.capture(model, targets=["0"], repo=repo, name="probe", strict=True) as cap, torch.no_grad():
        model[0](torch.randn(2, 4), **{text: torch.ones(2)})
    result = export_kernelbench(cap.saved[0].ref, work / "p", repo=repo)
    assert result.manifest["self_check"]["reproduces_recorded_outputs"] is True, result.manifest["self_check"]
    assert not hx.generated_code_problems(work / "p")
    problem = ast.parse(result.problem.read_text())
    model = next(n for n in problem.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    forward = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    params = [a.arg for a in forward.args.args]
    assert params[:2] == ["self", "x"] and params[-1].startswith("arg")  # the **kwargs key is not a name
    constants = {n.value for n in ast.walk(problem) if isinstance(n, ast.Constant)}
    assert text in constants
    assert json.loads((work / "p" / "manifest.json").read_text())["model"]["keyword_arguments"] == [text]
    assert not (work / "outside" / "marker").exists()


def test_untrusted_stored_source_is_refused_with_how_to_trust(hostile: tuple[modulelens.Repo, Path]) -> None:
    repo, work = hostile
    marker = work / "outside" / "marker"
    case = next(c for c in hx.CASES if c.refused)
    ref = case.make(repo, "evil", "x")
    hx.plant(repo, ref, case.edit, "x", marker)
    with pytest.raises(modulelens.UntrustedCodeError, match="modulelens trust --repo DIR"):
        export_kernelbench(ref, work / "p", repo=repo)
    run = CliRunner().invoke(app, ["export", ref, "-o", str(work / "q"), "--repo", str(repo.root)])
    assert run.exit_code == modulelens.UntrustedCodeError.exit_code and "Traceback" not in run.output
    assert "trust" in run.output and not marker.exists()
