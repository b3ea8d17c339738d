"""Your own captures just work where you work; copies of them do not (issue 21, 8; docs/security.md).

A project folder holds the model's module (``mymodel.py``) and a training script whose own class
lives in ``__main__``; the script saves captures of both into a repo. Then, in real processes
started in that folder with no ``PYTHONPATH`` (as a user runs them): ``python -c``, a script of the
project, ``ipython -c`` and a Jupyter notebook reload them with no extra step, while a copied repo,
a pulled or pushed version, an edited capture, a capture signed with another key or a machine
without the key are refused. An explicit ``PYTHONPATH`` naming the folder is honoured even though
``''`` comes first on ``sys.path``.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

import modulelens
from modulelens.errors import CaptureWarning, SigningKeyError, UntrustedCodeError
from modulelens.format.provenance import PROVENANCE_FIELD, field_lines, key_file, seal, stored_field_lines, user_key
from modulelens.repo.trust import Provenance, own_capture, repo_identity
from modulelens.restore.classes import ClassResolver

MODEL = '''
import torch


class Net(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return self.lin(x).relu()
'''

TRAIN = '''
import sys
import torch
import modulelens
from mymodel import Net


class Local(torch.nn.Module):  # a class of the script itself: restored from the source stored with it
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return self.lin(x) * 2


modulelens.track_init()
torch.manual_seed(0)
model = torch.nn.Sequential(Net(4), Local(4))
with modulelens.capture(model, ["0", "1"], repo=sys.argv[1], name="proj") as cap:
    model(torch.randn(2, 4))
print([info.ref for info in cap.saved])
'''

# Loads each job item ({"label", "repo", "ref"[, "config"]}) and replays it; prints one JSON line.
LOADER = '''
import json, os, warnings
import modulelens
warnings.simplefilter("ignore")
out = {}
for item in json.loads(os.environ["OWN_JOB"]):
    if item.get("config"):
        os.environ["XDG_CONFIG_HOME"] = item["config"]
    try:
        cap = modulelens.load(item["ref"], repo=item["repo"])
        out[item["label"]] = {"passed": cap.replay().passed, "module": type(cap.module).__module__}
    except modulelens.ModulelensError as error:
        out[item["label"]] = {"error": type(error).__name__, "message": str(error)}
print("RESULT " + json.dumps(out))
'''

NET, LOCAL = "proj/0:v1", "proj/1:v1"


def _env(config: Path, **extra: str) -> dict[str, str]:
    """A user's shell: no PYTHONPATH (modulelens is installed in this interpreter's environment)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MODULELENS_REPO")}
    env.update(XDG_CONFIG_HOME=str(config), OMP_NUM_THREADS="1", IPYTHONDIR=str(config.parent / "ipython"), **extra)
    return env


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The project folder, the user's config (key) folder and the repo the training script saved into."""
    base = tmp_path_factory.mktemp("own")
    folder, config, repo = base / "project", base / "config", base / "repo"
    folder.mkdir()
    (folder / "mymodel.py").write_text(MODEL)
    (folder / "train.py").write_text(TRAIN)
    (folder / "replay_own.py").write_text(LOADER)
    ran = subprocess.run([sys.executable, "train.py", str(repo)], cwd=folder, env=_env(config),
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and NET.replace(":v1", "") in ran.stdout, ran.stdout + ran.stderr
    return {"folder": folder, "config": config, "repo": repo, "base": base}


def _load(command: list[str], cwd: Path, env: dict[str, str], items: list[dict[str, Any]]) -> dict[str, Any]:
    env = {**env, "OWN_JOB": json.dumps([{k: str(v) for k, v in item.items()} for item in items])}
    ran = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    line = next((x for x in ran.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, ran.stdout[-3000:] + ran.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


def _own_items(repo: Path) -> list[dict[str, Any]]:
    return [{"label": "module in the folder", "repo": repo, "ref": NET},
            {"label": "class of the training script", "repo": repo, "ref": LOCAL}]


def _assert_restored(results: dict[str, Any]) -> None:
    assert results["module in the folder"] == {"passed": True, "module": "mymodel"}, results
    restored = results["class of the training script"]
    assert restored.get("passed") is True and restored["module"].startswith("modulelens_source."), results


@pytest.mark.parametrize("launcher", ["python -c", "script in the project folder", "ipython -c"])
def test_own_captures_reload_where_you_work(project: dict[str, Path], launcher: str) -> None:
    command = {"python -c": [sys.executable, "-c", LOADER],
               "script in the project folder": [sys.executable, "replay_own.py"],
               "ipython -c": [str(Path(sys.executable).parent / "ipython"), "--no-banner", "-c", LOADER]}[launcher]
    _assert_restored(_load(command, project["folder"], _env(project["config"]), _own_items(project["repo"])))


def test_own_captures_reload_in_a_notebook(project: dict[str, Path]) -> None:
    """A class defined in a notebook cell and a class of the project's module, captured in one
    notebook and reloaded in a fresh kernel started in the same folder, with no import and no trust."""
    nbclient = pytest.importorskip("nbclient")
    from nbformat.v4 import new_code_cell, new_notebook

    repo = project["base"] / "notebook-repo"
    capture_cells = [
        "import torch, modulelens\nmodulelens.track_init()\nfrom mymodel import Net",
        "class Cell(torch.nn.Module):\n    def __init__(self, dim):\n        super().__init__()\n"
        "        self.lin = torch.nn.Linear(dim, dim)\n    def forward(self, x):\n        return self.lin(x) - 1",
        f"model = torch.nn.Sequential(Net(4), Cell(4))\nwith modulelens.capture(model, ['0', '1'], repo={str(repo)!r}, "
        "name='nb') as cap:\n    model(torch.randn(2, 4))\nprint([i.ref for i in cap.saved])",
    ]
    reload_cells = [
        "import modulelens",
        f"a = modulelens.load('nb/0', repo={str(repo)!r})\nb = modulelens.load('nb/1', repo={str(repo)!r})\n"
        "print(a.replay().passed, b.replay().passed, type(a.module).__module__, type(b.module).__name__)",
    ]
    outputs = []
    for cells in (capture_cells, reload_cells):
        nb = new_notebook(cells=[new_code_cell(c) for c in cells])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=180, allow_errors=True,
                                         resources={"metadata": {"path": str(project["folder"])}})
        client.execute(env=_env(project["config"], JUPYTER_RUNTIME_DIR=str(project["base"] / "jupyter-runtime")))
        for cell in nb.cells:
            errors = [o for o in cell["outputs"] if o["output_type"] == "error"]
            assert not errors, f"{cell['source']!r}: {errors[0]['ename']}: {errors[0]['evalue']}"
        outputs.append("".join(o.get("text", "") for o in nb.cells[-1]["outputs"] if o["output_type"] == "stream"))
    assert "nb/0:v1" in outputs[0] and "nb/1:v1" in outputs[0]
    assert outputs[1].split() == ["True", "True", "mymodel", "Cell"], outputs[1]


def _edit(repo: Path, ref: str, change: Any) -> None:
    folder = modulelens.Repo(repo).version_path(*modulelens.Repo(repo).resolve(ref))
    meta = json.loads((folder / "capture.json").read_text())
    change(meta)
    (folder / "capture.json").write_text(json.dumps(meta, indent=1))


def test_copies_and_edits_of_your_captures_still_need_trust(project: dict[str, Path]) -> None:
    base, repo = project["base"] / "refusals", project["repo"]
    base.mkdir()
    copied = shutil.copytree(repo, base / "copied")
    modulelens.Repo(base / "pulled").pull(repo, NET)
    modulelens.Repo(repo).push(LOCAL, base / "pushed")
    edited = shutil.copytree(repo, base / "edited-src")
    other_key = os.urandom(32)
    for ref in (NET, LOCAL):  # signed for this very repo, but with another user's key
        _edit(edited, ref, lambda m, e=edited: m.update(
            {PROVENANCE_FIELD: seal(field_lines(m), repo_identity(Path(e)), other_key)}))
    # a copy signed as if the user had saved it there (the control below loads), then edited
    tagged = shutil.copytree(repo, base / "tagged")
    key = bytes.fromhex((project["config"] / "modulelens" / "key").read_text())
    for ref in (NET, LOCAL):
        _edit(tagged, ref, lambda m: m.update({PROVENANCE_FIELD: seal(field_lines(m), repo_identity(tagged), key)}))
    _edit(tagged, NET, lambda m: m["tags"].append("harmless"))
    forged = shutil.copytree(repo, base / "forged")  # a provenance made up for the original directory
    _edit(forged, LOCAL, lambda m: m.update({PROVENANCE_FIELD: seal(field_lines(m), repo_identity(repo), b"k" * 32)}))
    empty_config = base / "no-key"
    items = [
        {"label": "copied folder, module", "repo": copied, "ref": NET},
        {"label": "copied folder, script class", "repo": copied, "ref": LOCAL},
        {"label": "pulled", "repo": base / "pulled", "ref": NET},
        {"label": "pushed", "repo": base / "pushed", "ref": LOCAL},
        {"label": "another key, module", "repo": edited, "ref": NET},
        {"label": "another key, script class", "repo": edited, "ref": LOCAL},
        {"label": "edited metadata", "repo": tagged, "ref": NET},
        {"label": "forged provenance", "repo": forged, "ref": LOCAL},
        {"label": "control: signed for its folder, not edited", "repo": tagged, "ref": LOCAL},
        {"label": "no key on this machine", "repo": repo, "ref": NET, "config": empty_config},
    ]
    results = _load([sys.executable, "-c", LOADER], project["folder"], _env(project["config"]), items)
    reasons = {"copied folder, module": "signed for another repo", "copied folder, script class": "signed for another repo",
               "pulled": "signed for another repo", "pushed": "signed for another repo",
               "another key, module": "signed with another key", "another key, script class": "signed with another key",
               "edited metadata": "signature does not match", "forged provenance": "signed with another key",
               "no key on this machine": "no signing key"}
    for label, reason in reasons.items():
        outcome = results[label]
        assert outcome.get("error") == "UntrustedCodeError", (label, outcome)
        assert reason in outcome["message"] and "modulelens trust" in outcome["message"], (label, outcome)
    assert results["control: signed for its folder, not edited"]["passed"] is True, results
    assert not empty_config.exists()  # loading never creates a key


def test_pythonpath_naming_the_folder_is_honoured(project: dict[str, Path]) -> None:
    """A capture that is not your own (a copied repo) whose module is in the current folder loads
    when PYTHONPATH names that folder, under ``python -c`` and IPython (``''`` first on sys.path);
    its script class still needs trust: PYTHONPATH says where modules are, not that stored source may run."""
    copied = shutil.copytree(project["repo"], project["base"] / "pythonpath-copy")
    items = _own_items(copied)
    env = _env(project["config"], PYTHONPATH=str(project["folder"]))
    for command in ([sys.executable, "-c", LOADER],
                    [str(Path(sys.executable).parent / "ipython"), "--no-banner", "-c", LOADER]):
        results = _load(command, project["folder"], env, items)
        assert results["module in the folder"] == {"passed": True, "module": "mymodel"}, results
        assert results["class of the training script"]["error"] == "UntrustedCodeError", results
    # without PYTHONPATH the same copy is refused
    results = _load([sys.executable, "-c", LOADER], project["folder"], _env(project["config"]), items[:1])
    assert "in the current directory" in results["module in the folder"]["message"], results


# ------------------------------------------------------------------------------ in process


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config"


def _linear_capture(repo: modulelens.Repo) -> tuple[str, Path]:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(3, 3))
    with modulelens.capture(model, ["0"], repo=repo, name="lin") as cap:
        model(torch.randn(2, 3))
    ref = cap.saved[0].ref
    return ref, repo.version_path(*repo.resolve(ref)) / "capture.json"


def test_the_key_is_private_and_made_once(config: Path) -> None:
    keys: list[bytes] = []
    threads = [threading.Thread(target=lambda: keys.append(user_key(create=True))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(keys) == 8 and len(set(keys)) == 1 and len(keys[0]) == 32  # racing creators agree on one key
    assert key_file() == config / "modulelens" / "key"
    assert stat.S_IMODE(os.stat(key_file()).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(key_file().parent).st_mode) == 0o700
    assert [p.name for p in key_file().parent.iterdir()] == ["key"]  # no staging file left behind


def test_a_saved_capture_is_your_own_until_edited(config: Path, repo: modulelens.Repo) -> None:
    ref, path = _linear_capture(repo)
    name, version = repo.resolve(ref)
    meta = json.loads(path.read_text())
    assert set(meta[PROVENANCE_FIELD]) == {"scheme", "key", "repo", "mac"} and list(meta)[-1] == PROVENANCE_FIELD
    assert own_capture(repo.root, name, version, meta) == Provenance(True)
    path.write_text(json.dumps(meta, indent=4, ensure_ascii=False))  # reformatting is not editing
    assert own_capture(repo.root, name, version, repo.read_metadata(name, version)).own
    for field in [k for k in meta if k != PROVENANCE_FIELD]:  # any change to any field: not yours any more
        changed = json.loads(json.dumps(meta))
        changed[field] = {"changed": True} if not isinstance(changed[field], dict) else {**changed[field], "x": 1}
        verdict = own_capture(repo.root, name, version, changed)
        assert not verdict.own and "does not match" in verdict.why, field
    assert "not where it is now" in own_capture(repo.root, name, version + 1, meta).why  # moved to another version
    assert "no provenance" in own_capture(repo.root, name, version, {**meta, PROVENANCE_FIELD: None}).why
    good = meta[PROVENANCE_FIELD]
    for odd in ([good], {**good, "mac": "é" * 64}, {**good, "mac": 7}, {**good, "key": ["x"]}, {**good, "scheme": None},
                {**good, "repo": {"a": 1}, "mac": "0" * 64}):
        verdict = own_capture(repo.root, name, version, {**meta, PROVENANCE_FIELD: odd})
        assert not verdict.own and verdict.why, odd  # a hostile field is a refusal, never a traceback


def test_the_stored_lines_verify_as_they_are_and_hide_nothing(config: Path, repo: modulelens.Repo) -> None:
    """A reader that has the file's bytes checks its own lines (no second encoding: the UI's first
    view of a 50,000-call capture); a line skipped as the provenance field may hold nothing else."""
    ref, path = _linear_capture(repo)
    name, version = repo.resolve(ref)
    text = path.read_bytes()
    meta = json.loads(text)
    assert stored_field_lines(text) == field_lines(meta)
    assert own_capture(repo.root, name, version, meta, text=text) == Provenance(True)
    lines = text.decode().split("\n")
    # a field hidden behind the provenance key on its line: the parsed capture has it, the stored
    # lines would not cover it; the lines are refused and the parsed fields do not verify
    smuggled = [line + ', "module": {"class": "evil:Module"}' if line.startswith('"provenance"') else line
                for line in lines]
    hidden = "\n".join(smuggled).encode()
    assert json.loads(hidden)["module"] == {"class": "evil:Module"} and stored_field_lines(hidden) is None
    verdict = own_capture(repo.root, name, version, json.loads(hidden), text=hidden)
    assert not verdict.own and "does not match" in verdict.why
    edited = text.replace(b'"training":true', b'"training":false', 1)  # one value changed on its line
    assert edited != text and stored_field_lines(edited) is not None
    assert not own_capture(repo.root, name, version, json.loads(edited), text=edited).own
    reformatted = json.dumps(meta, indent=4).encode()  # reformatting is still not editing
    assert stored_field_lines(reformatted) is None
    assert own_capture(repo.root, name, version, json.loads(reformatted), text=reformatted).own


def test_without_a_usable_key_nothing_is_signed(config: Path, repo: modulelens.Repo) -> None:
    key = user_key(create=True)
    os.chmod(key_file(), 0o644)  # readable by others: anyone could sign as you
    with pytest.raises(SigningKeyError, match="must be yours and private"):
        user_key()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from modulelens.format import provenance

        provenance._warned.clear()
        _ref, path = _linear_capture(repo)
        _linear_capture(repo)
    messages = [str(w.message) for w in caught if issubclass(w.category, CaptureWarning) and "signing key" in str(w.message)]
    assert len(messages) == 1 and "not marked as yours" in messages[0]  # warned once
    assert PROVENANCE_FIELD not in json.loads(path.read_text())
    os.chmod(key_file(), 0o600)
    assert user_key() == key


def test_own_stored_source_runs_only_with_its_signed_hash() -> None:
    """The signature covers the stored source's hash; a text that does not match it (a blob
    changed after the save) does not run, even for a capture of your own."""
    from modulelens.format.sources import source_hash

    text = "import torch\nclass Mine(torch.nn.Module):\n    pass\n"
    evil = "import torch\nclass Mine(torch.nn.Module):\n    raise SystemExit('ran')\n"
    sources = {"gone_module": {"file": "/nowhere/gone_module.py", "hash": source_hash(text), "text_id": "t0",
                               "classes": {"Mine": {"hash": None}}}}
    mine = ClassResolver(sources, "x:v1", read_text=lambda _tid: text, provenance=lambda: Provenance(True))
    assert mine.resolve("gone_module:Mine", "module").__name__ == "Mine"
    tampered = ClassResolver(sources, "x:v1", read_text=lambda _tid: evil, provenance=lambda: Provenance(True))
    with pytest.raises(UntrustedCodeError, match="hash differs"):
        tampered.resolve("gone_module:Mine", "module")
    foreign = ClassResolver(sources, "x:v1", read_text=lambda _tid: text, provenance=lambda: Provenance(False, "why"))
    with pytest.raises(UntrustedCodeError, match="not one you saved into this repo: why"):
        foreign.resolve("gone_module:Mine", "module")
