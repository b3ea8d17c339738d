"""The test tiers (docs/architecture.md "Test tiers"): the markers a test earns from what it uses,
the guard that fails a fast-tier test which starts a process, and `--tier` on a real pytest run.

The functions below are the "tests" being classified: each stands for a way a test may use (or not
use) something costly. They are never called here, only read, as the classifier reads a suite; the
tests name them by string (``_classified``), since a test that refers to one would itself reach what
it reaches and leave the fast tier.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tiers
import torch
from child_process import PYTHON, SUPPORT_DIR, subprocess_env
from typer.testing import CliRunner

import modulelens
from modulelens.interfaces.cli import app
from modulelens.kernels.verify import verify_kernel

# -- what the classified functions use ---------------------------------------------------------------


def _start_a_child() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def _through_a_helper() -> None:
    _start_a_child()


class _Server:
    def start(self) -> None:
        subprocess.Popen([sys.executable, "-m", "http.server"])


def _through_a_class() -> None:
    _Server()


def _in_process(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    with modulelens.capture(model, targets="Linear", repo=tmp_path, name="x"):  # records the commit (git): cheap
        model(torch.ones(1, 2))
    modulelens.load("x", repo=tmp_path).replay()


def _through_the_library() -> None:
    verify_kernel("km/act", Path("candidate.py"))  # starts its reference and candidate workers


def _a_cli_command_in_process() -> None:
    CliRunner().invoke(app, ["kernel", "verify", "km/act", "--candidate", "c.py"])


def _a_cheap_cli_command_in_process() -> None:
    CliRunner().invoke(app, ["ls", "--json"])


def _a_magic(ip: object) -> None:
    ip.run_cell("%ml_export toy/head --output problem")  # type: ignore[attr-defined]


def _a_cheap_magic(ip: object) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.instance().run_line_magic("ml_ls", "")


def _launches_ranks() -> None:
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "job.py"], check=True)


def _the_census_as_a_process() -> None:
    subprocess.run([sys.executable, "-m", "census", "--quick"], check=True)


def _the_word_census_in_process() -> Path:
    return Path("census") / "results"  # names the folder, starts nothing


def _imported_inside() -> None:
    from subprocess import check_output as run_it

    run_it(["true"])


def _a_lambda_starts_it() -> object:
    return lambda: subprocess.run(["true"], check=False)


# -- the classifier ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def classifier() -> tiers.Classifier:
    return tiers.Classifier()


def _classified(classifier: tiers.Classifier, *names: str) -> dict[str, str]:
    return classifier.markers_of([globals()[f"_{name}"] for name in names])


@pytest.mark.parametrize("name, markers", [
    ("start_a_child", {"subprocess"}),
    ("through_a_helper", {"subprocess"}),
    ("through_a_class", {"subprocess"}),
    ("imported_inside", {"subprocess"}),
    ("a_lambda_starts_it", {"subprocess"}),
    ("in_process", set()),
    ("through_the_library", {"subprocess"}),
    ("a_cli_command_in_process", {"subprocess"}),
    ("a_cheap_cli_command_in_process", set()),
    ("a_magic", set()),  # a shell the rules cannot see is driven: no IPython reached, so no magic followed
    ("a_cheap_magic", set()),
    ("launches_ranks", {"subprocess", "distributed"}),
    ("the_census_as_a_process", {"subprocess", "census"}),
    ("the_word_census_in_process", set()),
])
def test_markers_follow_what_the_code_reaches(classifier: tiers.Classifier, name: str, markers: set[str]) -> None:
    assert set(_classified(classifier, name)) == markers


def test_a_magic_is_followed_once_ipython_is_reached(classifier: tiers.Classifier) -> None:
    earned = _classified(classifier, "a_magic", "a_cheap_magic")  # the second reaches IPython
    assert "subprocess" in earned and "`%ml_export`" in earned["subprocess"], earned


def test_each_marker_names_its_evidence(classifier: tiers.Classifier) -> None:
    assert _classified(classifier, "through_a_helper") == {"subprocess": "reaches subprocess.run"}
    assert _classified(classifier, "a_cli_command_in_process")["subprocess"].endswith("(through `modulelens kernel verify`)")
    # (the launcher's name is not spelled here: this test would be a distributed one)
    assert _classified(classifier, "launches_ranks")["distributed"].startswith("uses the string 'torch.")


# -- the guard --------------------------------------------------------------------------------------


def test_the_watch_sees_every_way_of_starting_a_process_but_cheap_tools() -> None:
    import multiprocessing

    watch = tiers.ProcessWatch()
    watch.install()
    watch.start()
    try:
        subprocess.run(["git", "--version"], capture_output=True, check=True)  # what every capture runs: allowed
        assert watch.started == []
        subprocess.run([PYTHON, "-c", "pass"], check=True)
        for method in ("spawn", "fork"):  # spawn starts no audit event: multiprocessing's own start is watched
            process = multiprocessing.get_context(method).Process(target=print)
            process.start()
            process.join()
    finally:
        watch.stop()
    assert watch.started[0] == f"{PYTHON} -c pass"
    # the spawned child (after multiprocessing's resource tracker, on the first spawn of a process), then the fork
    assert any("spawn_main" in started for started in watch.started[1:-1]) and watch.started[-1] == "os.fork()", watch.started


# -- a real pytest run of a suite of its own -----------------------------------------------------------

SUITE = '''
    import importlib
    import subprocess
    import sys

    import pytest


    def _child():
        subprocess.run([sys.executable, "-c", "pass"], check=True)


    def test_in_process():
        assert 1 + 1 == 2


    def test_through_a_helper():
        _child()


    def test_hidden_from_the_rules():
        getattr(importlib.import_module("sub" + "process"), "run")([sys.executable, "-c", "pass"], check=True)


    @pytest.mark.subprocess
    def test_hidden_but_marked():
        getattr(importlib.import_module("sub" + "process"), "run")([sys.executable, "-c", "pass"], check=True)
'''

CONFTEST = f'''
    import sys
    sys.path.insert(0, {str(SUPPORT_DIR)!r})
    import tiers
    from tiers import (pytest_addoption, pytest_collection_modifyitems, pytest_report_collectionfinish,
                       pytest_runtest_makereport, pytest_runtest_protocol, pytest_sessionfinish,
                       pytest_terminal_summary, pytest_testnodedown)


    def pytest_configure(config):
        tiers.configure(config)
'''


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args], cwd=folder,
                          capture_output=True, text=True, env=subprocess_env(), timeout=300, check=False)


def test_a_pytest_run_selects_its_tier_and_fails_what_the_rules_missed(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(textwrap.dedent(SUITE))
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")

    fast = _pytest(tmp_path, "--tier", "fast")
    assert "PASSED test_suite.py::test_in_process" in fast.stdout, fast.stdout
    assert "test_through_a_helper" not in fast.stdout.split("short test summary")[-1]  # deselected
    assert "FAILED test_suite.py::test_hidden_from_the_rules" in fast.stdout
    assert "is in the fast tier but started a process" in fast.stdout and "@pytest.mark.subprocess" in fast.stdout
    assert "2 deselected" in fast.stdout and "tier: fast, 2 tests" in fast.stdout
    assert fast.returncode == 1

    every = _pytest(tmp_path, "--tier", "all", "--tier-why")
    for name in ("test_in_process", "test_through_a_helper", "test_hidden_but_marked"):
        assert f"PASSED test_suite.py::{name}" in every.stdout, every.stdout
    assert "FAILED test_suite.py::test_hidden_from_the_rules" in every.stdout  # in every tier
    assert "test_suite.py::test_through_a_helper: subprocess: reaches subprocess.run" in every.stdout
    assert "test_suite.py::test_hidden_but_marked: subprocess: marked in its file" in every.stdout

    marked = _pytest(tmp_path, "--tier", "all", "-m", "subprocess")  # the markers select like any other
    assert "2 passed, 2 deselected" in marked.stdout, marked.stdout

    on_workers = _pytest(tmp_path, "--tier", "fast", "-n", "2")
    assert "tier: fast, 2 tests" in on_workers.stdout, on_workers.stdout  # the workers' summary, printed at the end
    assert "1 failed, 1 passed" in on_workers.stdout
