"""What people read (issue 23 item 7, issue 21 defect 6): Python-like values in ``show``, ``ls``
filters and columns, plain ``--help`` that fits 80 columns, and no raw control character from a
capture ever reaching the terminal."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import modulelens
from modulelens.interfaces.cli import app
from modulelens.interfaces.output import safe_text, safe_tree, text_table
from modulelens.interfaces.value_text import call_text, python_like

HOSTILE = "\x1b]52;c;aGk=\x07\x1b]0;title\x07\x1b[2J\x9b2J\x9d0;x\x9c\r\u202e"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]")


def run(*args: str, columns: int = 200) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})
    return result.exit_code, result.output


# ------------------------------------------------------------------------------------- safe_text


def test_safe_text_escapes_what_a_terminal_acts_on() -> None:
    assert safe_text("plain text, ünïcödé") == "plain text, ünïcödé"
    escaped = safe_text(HOSTILE)
    assert not RAW.search(escaped)
    assert escaped.startswith("\\x1b]52;c;aGk=\\x07") and "\\x9b" in escaped and escaped.endswith("\\x0d\\u202e")
    assert safe_text("a\nb\tc") == "a\nb\tc" and safe_text("a\nb\tc", one_line=True) == "a\\x0ab\\x09c"
    assert safe_text(safe_text(HOSTILE)) == safe_text(HOSTILE)  # idempotent: nothing left to escape
    assert not RAW.search("".join(text_table(["name"], [[HOSTILE]], fit=False)))


def _escaped_by_definition(text: str, one_line: bool) -> str:
    """safe_text's contract, one character at a time: C0, DEL, C1, bidi and other format
    characters, line and paragraph separators and the BOM escaped; tab and newline only in one line."""
    unsafe = {*range(0x20), *range(0x7F, 0xA0), *range(0x200B, 0x2010), *range(0x202A, 0x202F),
              *range(0x2066, 0x206A), 0x2028, 0x2029, 0xFEFF}
    return "".join((f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                   if ord(c) in unsafe and (one_line or c not in "\n\t") else c for c in text)


def test_safe_text_and_safe_tree_escape_every_character_as_defined() -> None:
    # every code point of the basic plane (where every unsafe one is) and a sample of the others,
    # inside text, in running text and in one line
    for code in [*range(0x10000), *range(0x10000, 0x110000, 251)]:
        text = f"a{chr(code)}b"
        for one_line in (False, True):
            assert safe_text(text, one_line=one_line) == _escaped_by_definition(text, one_line), hex(code)
    # safe_tree first checks a whole result in one pass (its JSON text): every character that
    # needs escaping, in a key or a value, deep or shallow, still gets escaped; a backslash or a
    # value JSON cannot write takes the slow path and is kept as it is
    for code in [*range(0x2100), 0x2028, 0x2029, 0x202E, 0x2066, 0xFEFF, 0xD800, 0x1F600]:
        text = f"x{chr(code)}y"
        escaped = _escaped_by_definition(text, False)
        result = [{"ref": "a:v1", "tags": ["t", text], text: 1}, (text, None, 2.5)]
        assert safe_tree(result) == [{"ref": "a:v1", "tags": ["t", escaped], escaped: 1}, (escaped, None, 2.5)], hex(code)
    plain = [{"ref": "mlp:v1", "path": "C:\\runs\\b\\u0041", "calls": 3, "problem": None}]
    assert safe_tree(plain) == plain
    marker = object()
    assert safe_tree({"x\x1b": marker, ("k",): "v\x9b"}) == {"x\\x1b": marker, ("k",): "v\\x9b"}


# ------------------------------------------------------------------------------------- value_text


def test_python_like_values() -> None:
    tuple_ = {"$type": "tuple", "items": [1, {"$type": "dtype", "value": "float32"}]}
    assert python_like(tuple_) == "(1, torch.float32)"
    assert python_like({"$type": "tuple", "items": ["a"]}) == "('a',)"
    assert python_like({"$type": "dict", "items": [["k", [1, 2]], [3, None]]}) == "{'k': [1, 2], 3: None}"
    assert python_like({"$type": "float", "value": "nan"}) == "float('nan')"
    assert python_like({"$type": "size", "value": [2, 3]}) == "torch.Size([2, 3])"
    assert python_like({"$type": "device", "value": "cuda:0"}) == "torch.device('cuda:0')"
    assert python_like({"$type": "import", "path": "torch.nn.modules.activation:GELU"}) == "GELU"
    enum = {"$type": "codec", "codec": "enum", "class": "mylib:Mode", "value": "fast"}
    assert python_like(enum) == "Mode('fast')"
    partial = {"$type": "codec", "codec": "partial", "class": "functools:partial", "value": {"$type": "dict", "items": [
        ["func", {"$type": "import", "path": "torch.nn.functional:gelu"}], ["args", {"$type": "tuple", "items": []}],
        ["keywords", {"$type": "dict", "items": [["approximate", "tanh"]]}]]}}
    assert python_like(partial) == "partial(gelu, approximate='tanh')"
    config = {"$type": "codec", "codec": "transformers.PretrainedConfig", "class": "transformers:LlamaConfig",
              "value": {"$type": "dict", "items": [["config", {"$type": "dict", "items": [
                  ["transformers_version", "5.0"], ["hidden_size", 64], ["num_heads", 4]]}]]}}
    assert python_like(config) == "LlamaConfig(hidden_size=64, num_heads=4, transformers_version='5.0')"
    data = {"$type": "dataclass", "class": "m:Cfg", "fields": {"$type": "dict", "items": [["a", 1]]}}
    assert python_like(data) == "Cfg(a=1)"
    assert python_like(list(range(20)), max_items=3) == "[0, 1, 2, ... +17 more]"
    assert python_like("x" * 50, limit=10) == "'xxxxxxxx…"
    assert python_like({"$type": "unrecorded", "class": "mylib.Cache"}) == "<unrecorded mylib.Cache>"
    assert python_like({"$type": "from-the-future", "x": 1}) == "<from-the-future x=1>"  # a newer format: readable
    assert python_like({"$type": "tuple"}) == "<tuple>"  # damaged: named, never a crash
    nested = {"m1": {"class": "torch.nn.modules.linear:Linear", "args": [4, 8], "kwargs": {"bias": False}}}
    assert call_text("torch.nn.modules.container:Sequential", [{"$type": "module", "ref": "m1"}], {},
                     constructions=nested) == "Sequential(Linear(4, 8, bias=False))"
    tensors = {"t0": {"dtype": "float32", "shape": [3, 4]}}
    assert python_like({"$type": "tensor", "id": "t0"}, tensors=tensors) == "tensor(float32[3, 4])"


# ------------------------------------------------------------------------------------- show and ls


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readable") / "repo"
    tracking = modulelens.track_init()
    try:
        mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(8, 2))
        norm = torch.nn.LayerNorm(4, eps=1e-6)
    finally:
        tracking.stop()
    with modulelens.capture(mlp, targets=["."], repo=root, name="mlp", tags=["nightly", f"evil{HOSTILE}"],
                            metadata={"run": f"r{HOSTILE}"}, record=modulelens.Recording(max_calls=3)):
        for _ in range(3):
            mlp(torch.randn(2, 4))
    with modulelens.capture(norm, targets=["."], repo=root, name="norm"):
        norm(torch.randn(2, 4))
    return root


def test_show_writes_constructor_arguments_and_tags_as_python(repo: Path) -> None:
    code, out = run("show", "mlp", "--repo", str(repo))
    assert code == 0, out
    assert "constructor: Sequential(Linear(4, 8), GELU(approximate='tanh'), Linear(8, 2))" in out
    assert "$type" not in out and "tags: nightly, evil\\x1b]52;c;aGk=\\x07" in out
    assert "metadata: run='r\\x1b]52" in out
    assert not RAW.search(out)
    code, out = run("show", "norm", "--repo", str(repo))
    assert "constructor: LayerNorm(4, eps=1e-06)" in out


def test_ls_filters_sorts_and_shows_tags_and_calls(repo: Path) -> None:
    code, out = run("ls", "--repo", str(repo))
    assert code == 0 and out.splitlines()[1].split() == ["ref", "aliases", "module", "class", "calls", "tags", "payload",
                                                         "created"]
    assert "nightly, evil\\x1b" in out and not RAW.search(out)
    mlp_row = next(line for line in out.splitlines() if line.startswith("mlp:v1"))
    assert " Sequential " in mlp_row and " 3 " in mlp_row
    for args, refs in ((["--class", "LayerNorm"], ["norm:v1"]), (["--class", "Seq*"], ["mlp:v1"]),
                       (["--class", "torch.nn.modules.normalization:*"], ["norm:v1"]),
                       (["--tag", "nightly"], ["mlp:v1"]), (["--tag", "nightly", "--tag", "other"], []),
                       (["--since", "1h"], ["mlp:v1", "norm:v1"]), (["--since", "2999-01-01"], []),
                       (["--since", "2000-01-01T00:00"], ["mlp:v1", "norm:v1"]),
                       (["--sort", "calls"], ["mlp:v1", "norm:v1"]), (["--sort", "size"], ["mlp:v1", "norm:v1"])):
        code, out = run("ls", "--repo", str(repo), "--json", *args)
        import json

        assert code == 0, out
        assert [row["ref"] for row in json.loads(out)["result"]] == refs, args
    for bad in (["--since", "yesterday"], ["--sort", "colour"]):
        code, out = run("ls", "--repo", str(repo), *bad)
        assert code == 2 and out.startswith("error:"), out


def test_ls_filters_read_no_capture_file(repo: Path, tmp_path: Path) -> None:
    """The filters and columns come from the listing's summaries: with every capture file replaced
    by junk after a writer stored the summaries, ``ls --class --tag --since`` still lists right."""
    import json
    import shutil
    import time

    copy = tmp_path / "repo"
    shutil.copytree(repo, copy)
    time.sleep(1.2)  # summaries of folders changed less than a second ago are not keyed (docs/repo-layout.md)
    modulelens.Repo(copy).gc()  # a writer: stores the summaries, keyed
    for capture_file in copy.glob("names/*/versions/*/capture.json"):
        capture_file.write_text("junk")
    code, out = run("ls", "--repo", str(copy), "--json", "--class", "Seq*", "--tag", "nightly", "--since", "1d",
                    "--sort", "created")
    assert code == 0, out
    [row] = json.loads(out)["result"]
    assert (row["ref"], row["calls"], row["problem"]) == ("mlp:v1", 3, None)


# ------------------------------------------------------------------------------------- help


def test_help_at_80_columns_keeps_names_and_sentences_whole() -> None:
    code, out = run("--help", columns=80)
    assert code == 0
    fsck = out[out.index("  fsck"):out.index("  run ")]
    assert " ".join(fsck.split()).endswith("exit 3 when something is broken (and not repaired).")
    code, out = run("run", "--help", columns=80)
    assert code == 0 and "╭" not in out and "…" not in out  # plain click help, no cut boxes
    assert "--exit-after-capture / --no-exit-after-capture" in out and "-t, --target TARGET" in out
    assert all(len(line) <= 80 for line in out.splitlines())


def test_hostile_text_never_reaches_the_terminal_raw(tmp_path: Path) -> None:
    """The stress row's repo (stress/hostile_terminal.py) through every command, in process."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from stress.hostile_terminal import COMMANDS, build_repo, raw_controls

    repo = build_repo(tmp_path)
    for command in COMMANDS:
        result = CliRunner().invoke(app, [*command, "--repo", str(repo)], env={"COLUMNS": "200"})
        assert result.exception is None or isinstance(result.exception, SystemExit), (command, result.exception)
        assert not raw_controls(result.output.encode()), (command, result.output)


def test_a_push_to_wandb_without_a_login_is_one_line(repo: Path, tmp_path: Path) -> None:
    import os
    import subprocess

    from child_process import PYTHON, subprocess_env

    env = {k: v for k, v in subprocess_env().items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"), NETRC=os.devnull)
    done = subprocess.run([PYTHON, "-m", "modulelens", "push", "mlp", "--repo", str(repo), "--to",
                           "wandb://team/wandb-registry-model/ranker"], capture_output=True, text=True, env=env,
                          timeout=300, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert done.returncode == 7, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [errors[0]] and "W&B: No API key configured" in errors[0] and "Traceback" not in done.stderr


def test_a_transformers_capture_adds_no_is_hf_initialized_note(tmp_path: Path) -> None:
    """transformers marks every module it initialised (`_is_hf_initialized = True`, after
    construction): that bookkeeping flag is not recorded as state, so no command notes restoring it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tracking = modulelens.track_init()
    try:
        model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1))
    finally:
        tracking.stop()
    assert model.model.layers[0].mlp._is_hf_initialized
    with modulelens.capture(model, targets=["model.layers.0.mlp"], repo=tmp_path, name="llama"):
        model(torch.randint(0, 64, (1, 5)))
    meta = modulelens.Repo(tmp_path).read_metadata("llama/model.layers.0.mlp", 1)
    assert "_is_hf_initialized" not in json_text(meta)
    code, out = run("replay", "llama/model.layers.0.mlp", "--repo", str(tmp_path))
    assert code == 0 and "PASS" in out and "_is_hf_initialized" not in out and "note:" not in out, out
    code, out = run("show", "llama/model.layers.0.mlp", "--repo", str(tmp_path))
    assert "LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32" in out, out


def json_text(value: object) -> str:
    import json

    return json.dumps(value)


def test_list_modules_never_cuts_a_class_path(tmp_path: Path) -> None:
    import subprocess

    from child_process import PYTHON, subprocess_env

    script = tmp_path / "job.py"
    script.write_text("import torch\nnet = torch.nn.Sequential(torch.nn.Linear(2, 2))\nnet(torch.ones(1, 2))\n")
    done = subprocess.run([PYTHON, "-m", "modulelens", "run", "--list-modules", "--repo", str(tmp_path / "repo"), "--",
                           PYTHON, str(script)], capture_output=True, text=True, env=subprocess_env(COLUMNS="40"),
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "0               torch.nn.modules.linear:Linear" in done.stdout, done.stdout
    assert "<root>          torch.nn.modules.container:Sequential" in done.stdout
