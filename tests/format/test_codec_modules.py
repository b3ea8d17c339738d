"""A codec the user registered in a module of their own (not in the module of the class it
serves) reaches the processes that load captures without their script: ``modulelens replay``, the
MCP server, the UI. Named in ``$MODULELENS_CODECS`` or by an installed package's entry point
(group ``modulelens.codecs``); before, the command line could not load such a capture at all
(found with gymnasium spaces and a user's codecs for them)."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
from child_process import PYTHON, subprocess_env

LIBRARY = '''
import torch

class Space:
    """A library's value no codec knows: its module registers none."""
    def __init__(self, size):
        self.size = size

class Policy(torch.nn.Module):
    def __init__(self, space):
        super().__init__()
        self.space = space
        self.lin = torch.nn.Linear(space.size, 2)

    def forward(self, x):
        return self.lin(x)
'''

CODECS = '''
import modulelens
from spacelib import Space

modulelens.register_codec(Space, lambda s: {"size": s.size}, lambda cls, d: cls(d["size"]), name="spacelib.Space",
                          subclasses=False)
'''

CAPTURE = '''
import sys, torch, modulelens
import my_codecs  # the user's script imports its codecs
from spacelib import Policy, Space
modulelens.track_init()
policy = Policy(Space(3))
with modulelens.capture(policy, [""], repo=sys.argv[1], name="policy"):
    policy(torch.randn(2, 3))
'''


@pytest.fixture
def captured(tmp_path: Path) -> tuple[Path, Path]:
    code = tmp_path / "code"
    code.mkdir()
    (code / "spacelib.py").write_text(LIBRARY)
    (code / "my_codecs.py").write_text(CODECS)
    repo = tmp_path / "repo"
    done = subprocess.run([PYTHON, "-c", CAPTURE, str(repo)], capture_output=True, text=True, timeout=300,
                          env=subprocess_env(PYTHONPATH=str(code)))
    assert done.returncode == 0, done.stderr
    return code, repo


def _replay(repo: Path, code: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "modulelens", "replay", "policy", "--repo", str(repo)], capture_output=True,
                          text=True, timeout=300, env=subprocess_env(PYTHONPATH=str(code), **env))


def test_the_command_line_imports_the_codec_modules_named_in_the_environment(captured: tuple[Path, Path]) -> None:
    code, repo = captured
    refused = _replay(repo, code)
    assert refused.returncode != 0
    assert "no codec 'spacelib.Space' is registered" in refused.stderr and "MODULELENS_CODECS" in refused.stderr
    replayed = _replay(repo, code, MODULELENS_CODECS="my_codecs")
    assert replayed.returncode == 0, replayed.stderr
    assert "PASS" in replayed.stdout


def test_a_codec_module_that_fails_to_import_is_named_in_the_error(captured: tuple[Path, Path]) -> None:
    code, repo = captured
    failed = _replay(repo, code, MODULELENS_CODECS="no_such_codecs")
    assert failed.returncode != 0
    assert "imported for codecs: no_such_codecs ($MODULELENS_CODECS) failed to import: ModuleNotFoundError" in \
        failed.stderr, failed.stderr


def test_an_installed_package_names_its_codecs_by_entry_point(captured: tuple[Path, Path]) -> None:
    code, repo = captured
    info = code / "my_codecs_package-1.0.dist-info"  # what installing a package with the entry point leaves
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-codecs-package\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent("""
        [modulelens.codecs]
        spaces = my_codecs
    """))
    replayed = _replay(repo, code)
    assert replayed.returncode == 0, replayed.stderr
    assert "PASS" in replayed.stdout
