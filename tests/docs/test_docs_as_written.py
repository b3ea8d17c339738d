"""Every shell command and Python snippet of README.md, docs/*.md and examples/*/README.md, run as
written, in order, from the folder the docs name (issue 23).

The blocks are found by parsing the markdown fences, so a new block is tested without anyone adding
it: ``bash``/``sh`` blocks run as one bash script (``set -e``: a command that fails fails the test),
``console`` blocks run their ``$`` lines, ``python`` blocks run as a script in that folder (a block
of ``%`` magics in IPython, a block of ``test_`` functions under pytest). A block that does not say
where it runs, runs from the repository's root; a ``<!-- docs-test: ... -->`` comment before blocks
sets, for the blocks after it in that file:

* ``cwd DIR`` - the folder (the visible text next to it says the same to the reader);
* ``env NAME=PATH`` - an environment variable, a path relative to the checkout;
* ``after DOC`` - the blocks of DOC run first (the captures a page's examples use).

Each file runs in a fresh copy of ``examples/`` (its tracked files: what a user's earlier run left
there is not copied) with its own, empty embedded repo (``MODULELENS_REPO``) and cache; then every
file runs again, one after another in the order of :data:`DOCS`, in one checkout and one repo, as a
user who follows them all: each walkthrough also works on a repo that holds the earlier ones'
captures and in a folder holding their outputs. ``s3://team-bucket/...`` is a real S3 server
(SeaweedFS on loopback, tests/support/seaweed.py) through the usual ``AWS_*`` settings, as the README
says.

What does not run here is in :data:`SKIPPED` (a command: the rest of its block runs) with the reason;
what fails for a reason another branch fixes is in :data:`XFAIL` (strict: it must fail until then).
Anything not listed runs.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "examples/ranker/README.md", "examples/distributed/README.md",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
RUNNABLE = {"bash": "shell", "sh": "shell", "shell": "shell", "console": "console", "python": "python"}

# (doc, text of a command or block) -> why it does not run in CI. A shell command listed here is
# replaced by a note and the rest of its block runs; a Python block is skipped whole.
SKIPPED: dict[tuple[str, str], str] = {
    ("README.md", "bash scripts/test"): "the test suite itself, inside the test suite: CI runs it (--all) as its own step",
    ("README.md", "claude mcp add"): "needs Claude Code's `claude` command, which CI does not have",
    ("docs/agents.md", "claude mcp"): "needs Claude Code's `claude` command, which CI does not have",
    ("docs/distributed.md", "fully_shard(...) / parallelize_module(...)"):
        "an outline of three ways to shard a model, not a program; examples/distributed runs them (below)",
    ("docs/distributed.md", 'modulelens.load("run7/blocks.2.ff")'):
        "loads the capture the outline above would make; examples/distributed's replay.py does it for real",
    ("docs/fidelity.md", "modulelens run -t 'vae:encode' -t 'vae:decode' -- python sample.py"):
        "an outline: a Stable Diffusion pipeline's sampling script, not one of the examples "
        "(census/families/methods.py captures diffusers' AutoencoderKL through encode and decode)",
    ("docs/fidelity.md", 'with modulelens.capture(pipe.vae, targets=[":encode", ":decode"], name="sd-vae") as cap:'):
        "the same outline from Python (`pipe` is a Stable Diffusion pipeline the page does not build)",
}
# Commands that serve until Ctrl+C: each runs as written until it prints its address, which must
# answer, and is then stopped (tests/docs/serve_once.py).
SERVERS = ("modulelens ui",)
# (doc, text of a block) -> why it fails today; strict: the test fails once it passes (flip it then)
XFAIL: dict[tuple[str, str], str] = {}

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
_DIRECTIVE = re.compile(r"<!-- docs-test: (.*?) -->")


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    text: str
    cwd: str = "."
    env: dict[str, str] = field(default_factory=dict)
    after: str | None = None

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def kind(self) -> str:
        kind = RUNNABLE[self.lang]
        if kind == "python" and re.search(r"^%", self.text, re.M):
            return "ipython"
        if kind == "python" and re.search(r"^def test_", self.text, re.M):
            return "pytest"
        return kind

    def mark(self, table: dict[tuple[str, str], str]) -> str | None:
        return next((why for (doc, text), why in table.items() if doc == self.doc and text in self.text), None)


def collect(doc: str) -> list[Block]:
    """The runnable blocks of ``doc``, each with the folder and settings its directives give."""
    text = (ROOT / doc).read_text()
    settings: dict[str, object] = {"cwd": ".", "env": {}, "after": None}
    events = sorted([(m.start(), "directive", m) for m in _DIRECTIVE.finditer(text)]
                    + [(m.start(), "fence", m) for m in _FENCE.finditer(text)], key=lambda e: e[0])
    blocks = []
    for start, what, match in events:
        if what == "directive":
            for part in match.group(1).split(";"):
                key, _, value = part.strip().partition(" ")
                if key == "env":
                    name, _, path = value.partition("=")
                    settings["env"] = {**settings["env"], name: path}  # type: ignore[dict-item]
                else:
                    settings[key] = value.strip()
        elif match.group(1) in RUNNABLE:
            blocks.append(Block(doc, text[:start].count("\n") + 1, match.group(1), match.group(2),
                                cwd=str(settings["cwd"]), env=dict(settings["env"]),  # type: ignore[arg-type]
                                after=settings["after"]))  # type: ignore[arg-type]
    return blocks


ALL = [block for doc in DOCS for block in collect(doc)]


# ------------------------------------------------------------------------------------- sessions


@dataclass
class Session:
    """One doc's run: a copy of examples/ (and links to the rest of the checkout), its repo, its env."""

    root: Path
    env: dict[str, str]


def _checkout(root: Path) -> None:
    """A checkout to run commands in: examples/ copied (commands write there), the rest linked.

    Only the examples' tracked files are copied: a user who followed the docs in this checkout left
    problem folders, plots and agent files in ``examples/ranker``, and a copy of those would make the
    docs' commands meet them (``problems/top_mlp is not empty``)."""
    root.mkdir(parents=True)
    for relative in _tracked_examples():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, root / relative)
    for name in (".venv", "scripts", "pyproject.toml", "modulelens", "README.md", "docs", "tests"):
        if (ROOT / name).exists():
            (root / name).symlink_to(ROOT / name)


def _tracked_examples() -> list[str]:
    """The files of examples/ under version control (every file but caches outside a git checkout)."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "examples"], capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout:
        return [name for name in listed.stdout.split("\0") if name and (ROOT / name).is_file()]
    return [str(path.relative_to(ROOT)) for path in (ROOT / "examples").rglob("*")
            if path.is_file() and "__pycache__" not in path.parts]


def _base_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODULELENS_", "AWS_", "PYTHONPATH"))}
    bin_dir = str(Path(sys.executable).parent)
    env.update(MODULELENS_REPO=str(root / "repo"), MODULELENS_CACHE=str(root / "cache"), OMP_NUM_THREADS="1",
               PATH=os.pathsep.join([bin_dir, env.get("PATH", "")]), COLUMNS="120", WANDB_MODE="offline",
               PYTHONFAULTHANDLER="1")  # a block that dies of a signal shows its Python stacks
    return env


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A real S3 server for ``s3://team-bucket/...`` (started on first use)."""
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from seaweed import SeaweedServer

    server = SeaweedServer(tmp_path_factory.mktemp("weed")).start()
    yield server.env
    server.stop()


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Session]:
    return {}


def _session(block: Block, sessions: dict[str, Session], tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> Session:
    if block.doc not in sessions:
        root = tmp_path_factory.mktemp("docs") / "checkout"
        _checkout(root)
        session = Session(root, _base_env(root))
        sessions[block.doc] = session
        if block.after:  # the page's examples use the captures another doc's blocks make
            shutil.copytree(_prepared(block.after, sessions, tmp_path_factory, request) / "repo", root / "repo")
    return sessions[block.doc]


def _prepared(doc: str, sessions: dict[str, Session], tmp_path_factory: pytest.TempPathFactory,
              request: pytest.FixtureRequest) -> Path:
    """A checkout where ``doc``'s blocks ran (once per test session: each page gets a copy of its repo)."""
    key = f"after:{doc}"
    if key not in sessions:
        root = tmp_path_factory.mktemp("docs-setup") / "checkout"
        _checkout(root)
        sessions[key] = Session(root, _base_env(root))
        for setup in collect(doc):
            _run(setup, sessions[key], request)
    return sessions[key].root


# ------------------------------------------------------------------------------------- running


def _shell_script(block: Block) -> str:
    lines = block.text.splitlines()
    if block.kind == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    script = []
    for line in "\n".join(lines).replace("\\\n", " ").splitlines():
        why = next((why for (doc, text), why in SKIPPED.items() if doc == block.doc and text in line), None)
        if why:
            line = f": {shlex.quote('not run in CI: ' + why)}"
        elif line.lstrip().startswith(SERVERS):  # serves until Ctrl+C: started, its page opened once, stopped
            line = shlex.join([sys.executable, str(Path(__file__).with_name("serve_once.py")),
                               *shlex.split(line, comments=True)])
        script.append(line)
    return "set -eo pipefail\n" + "\n".join(script) + "\n"


def _run(block: Block, session: Session, request: pytest.FixtureRequest) -> subprocess.CompletedProcess[str]:
    cwd = session.root / block.cwd
    env = dict(session.env)
    env.update({name: str(session.root / path) for name, path in block.env.items()})
    if "s3://" in block.text:
        env.update(request.getfixturevalue("s3"))
    work = session.root.parent
    if block.kind in ("shell", "console"):
        command = ["bash", "-c", _shell_script(block)]
    elif block.kind == "python":
        script = cwd / f"_docs_block_{block.line}.py"  # a script in the folder, as a user would save it
        script.write_text(block.text)
        command = [sys.executable, script.name]
    elif block.kind == "pytest":
        (cwd / f"test_docs_block_{block.line}.py").write_text(block.text)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"test_docs_block_{block.line}.py"]
    else:  # IPython: the cell as a notebook would run it
        cell = work / f"cell_{block.line}.ipy"
        cell.write_text(block.text)
        runner = work / "run_cell.py"
        runner.write_text(textwrap.dedent("""
            import sys
            from IPython.core.interactiveshell import InteractiveShell
            result = InteractiveShell.instance().run_cell(open(sys.argv[1]).read())
            sys.exit(0 if result.success else 1)
        """))
        command = [sys.executable, str(runner), str(cell)]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=1200,
                          stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    failed = done.returncode != 0 or (block.kind == "ipython" and re.search(r"Traceback|^error:|UsageError", output, re.M))
    assert not failed, f"{block.id} ({block.kind}, from {block.cwd}) exited {done.returncode}:\n{output[-6000:]}"
    own = own_warnings(output, session.root)
    assert not own, f"{block.id} ({block.kind}, from {block.cwd}) printed warnings of the project's own:\n" + "\n".join(own)
    return done


#: a Python warning as the interpreter prints it: ``path:line: Category: message``
_PY_WARNING = re.compile(r"^(?P<where>.+?):\d+: (?P<category>\w*Warning): ", re.M)
_OWN_CATEGORIES = ("ModulelensWarning", "CaptureWarning", "SourceChangedWarning")


def own_warnings(output: str, checkout: Path) -> list[str]:
    """The lines of ``output`` that are warnings of the project's own: a modulelens warning class,
    a Python warning raised from modulelens's or the examples' code (or runpy's, which the examples'
    package layout would cause), and the CLI's own ``warning:`` lines. Third-party libraries'
    warnings are theirs to fix and are not counted."""
    ours = (str(ROOT / "modulelens"), str(checkout / "examples"), str(ROOT / "examples"), "<frozen runpy>")
    found = []
    for line in output.splitlines():
        match = _PY_WARNING.match(line)
        if match and (match["category"] in _OWN_CATEGORIES or match["where"].startswith(ours)):
            found.append(line)
        elif line.startswith(("warning: ", "modulelens: warning")):
            found.append(line)
    return found


def _params() -> list[object]:
    params = []
    for block in ALL:
        marks = []
        skipped = block.mark(SKIPPED)
        if skipped and ((block.kind != "shell" and block.kind != "console") or all(
                line.startswith(": 'not run") for line in _shell_script(block).splitlines()[1:] if line.strip())):
            marks.append(pytest.mark.skip(reason=skipped))
        xfail = block.mark(XFAIL)
        if xfail:
            marks.append(pytest.mark.xfail(strict=True, reason=xfail))
        params.append(pytest.param(block, id=block.id, marks=marks))
    return params


@pytest.mark.parametrize("block", _params())
def test_block_runs_as_written(block: Block, sessions: dict[str, Session],
                               tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> None:
    _run(block, _session(block, sessions, tmp_path_factory, request), request)


# every doc's blocks once more: ~10 minutes on 2 busy cores, up to twice that while other suites share them
@pytest.mark.timeout(2400)
def test_walkthroughs_in_sequence_on_one_repo(tmp_path_factory: pytest.TempPathFactory,
                                              request: pytest.FixtureRequest) -> None:
    """Every doc's blocks, one doc after another in one checkout and one repo: each walkthrough runs
    as written on a repo that already holds the earlier walkthroughs' captures, in folders holding
    their outputs (a later doc needs no ``after``: the docs before it ran here)."""
    root = tmp_path_factory.mktemp("docs-in-sequence") / "checkout"
    _checkout(root)
    session = Session(root, _base_env(root))
    ran = 0
    for block in ALL:
        skipped = block.mark(SKIPPED)
        if block.mark(XFAIL) or (skipped and block.kind not in ("shell", "console")):
            continue
        _run(block, session, request)
        ran += 1
    assert ran >= 25


def test_every_fenced_block_is_seen() -> None:
    """The parser finds the blocks a reader sees (a fence it missed would go untested silently)."""
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        fences = [line for line in text.splitlines() if line.startswith("```")]
        assert len(fences) % 2 == 0, doc
        opened = [line[3:].strip() for line in fences[::2]]
        assert len([lang for lang in opened if lang in RUNNABLE]) == len(collect(doc)), doc
    assert len(ALL) >= 25


def test_no_block_shares_state_between_runs_on_one_machine() -> None:
    """Two runs of these docs on one machine (two CI jobs, a user's terminal beside the tests) stay
    apart: no block writes under a fixed ``/tmp`` path (a repo there outlived every run and held
    captures from all of them) or takes torchrun's fixed default port (``--standalone`` picks a free
    one)."""
    for block in ALL:
        if block.kind not in ("shell", "console"):
            continue
        assert "/tmp/" not in block.text, block.id
        for line in block.text.replace("\\\n", " ").splitlines():
            if "torch.distributed.run" in line or line.lstrip().startswith("torchrun"):
                assert "--standalone" in line and "--master-port" not in line, block.id


def test_own_warnings_are_told_from_third_party_ones(tmp_path: Path) -> None:
    output = "\n".join([
        f"{ROOT}/modulelens/repo/remote.py:140: ModulelensWarning: s3://b/c is unreachable; using the local cache",
        f"{tmp_path}/examples/ranker/ranker/training.py:36: UserWarning: Converting a tensor with requires_grad=True",
        "<frozen runpy>:128: RuntimeWarning: 'ranker.train' found in sys.modules after import of package 'ranker'",
        "warning: 'lin' matched no module; closest: 1.lin (Linear)",
        "/venv/lib/python3.11/site-packages/transformers/modeling_utils.py:9: FutureWarning: `x` is deprecated",
        "trained 20 steps, last loss 0.6714",
    ])
    assert own_warnings(output, tmp_path) == output.splitlines()[:4]
