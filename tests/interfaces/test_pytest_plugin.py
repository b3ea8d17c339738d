"""The pytest plugin: @pytest.mark.modulelens + the modulelens_capture fixture, run with pytester."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import tools_models as tm
import torch

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent.parent / "support"

GOLDEN_TESTS = '''
import pytest
import tools_models as tm
from modulelens.testing import assert_matches

@pytest.mark.modulelens("ranker/inner:golden")
def test_current_code_matches(modulelens_capture):
    assert modulelens_capture.ref == "ranker/inner:v1"
    assert_matches(modulelens_capture.module, modulelens_capture)

@pytest.mark.modulelens("ranker/inner:golden")
def test_fused_rewrite(modulelens_capture):
    assert_matches(tm.PackedMLP.from_original(modulelens_capture.module), modulelens_capture)

@pytest.mark.modulelens("ranker/inner:golden")
def test_buggy_rewrite(modulelens_capture):
    buggy = tm.SubtlyWrongMLP(8, 16)
    buggy.load_state_dict(modulelens_capture.state_dict())
    assert_matches(buggy, modulelens_capture)
'''


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import modulelens

    root = tmp_path_factory.mktemp("plugin-repo")
    torch.manual_seed(0)
    ref = tm.capture(lambda: tm.MLP(8, 16), [(torch.randn(5, 8),)], root, "ranker")
    modulelens.Repo(root).set_alias(ref, "golden")
    return root


def _plugin_args() -> list[str]:
    """``-p`` only when the entry point is not installed (registering it twice is an error)."""
    installed = any(ep.name == "modulelens" for ep in importlib.metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", "modulelens_pytest"]


@pytest.fixture
def tester(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.syspathinsert(HERE)
    return pytester


def test_golden_tests_pass_and_fail(tester: pytest.Pytester, repo: Path) -> None:
    tester.makepyfile(test_golden=GOLDEN_TESTS)
    result = tester.runpytest(*_plugin_args(), "--modulelens-repo", str(repo), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    output = result.stdout.str()
    assert ("MatchError: SubtlyWrongMLP does not reproduce ranker/inner:v1 (1 of 1 calls failed, "
            "per-dtype tolerances)") in output
    assert "  call 0: output['logits']: " in output and "max abs error" in output
    assert "raise MatchError" not in output  # the helper's own frame is hidden from the traceback
    result.stdout.fnmatch_lines([f"modulelens repo: {repo}"])


def test_repo_from_ini_file(tester: pytest.Pytester, repo: Path) -> None:
    tester.makeini(f"[pytest]\nmodulelens_repo = {repo}\n")
    tester.makepyfile(test_golden=GOLDEN_TESTS)
    result = tester.runpytest(*_plugin_args(), "-k", "current_code", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, deselected=2)


def test_missing_capture_fails_or_skips(tester: pytest.Pytester, repo: Path) -> None:
    tester.makepyfile(test_missing='''
import pytest

@pytest.mark.modulelens("ranker/nothing:golden")
def test_missing(modulelens_capture):
    pass

def test_no_marker(modulelens_capture):
    pass
''')
    result = tester.runpytest(*_plugin_args(), "--modulelens-repo", str(repo), "-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*modulelens: no capture named 'ranker/nothing'*",
                                 "*needs @pytest.mark.modulelens*"])
    skipped = tester.runpytest(*_plugin_args(), "--modulelens-repo", str(repo), "--modulelens-skip-missing",
                               "-k", "not no_marker", "-p", "no:cacheprovider")
    skipped.assert_outcomes(skipped=1, deselected=1)


def test_marker_is_registered(tester: pytest.Pytester) -> None:
    result = tester.runpytest(*_plugin_args(), "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.modulelens(ref, *, device=None, dtype=None, repo=None)*"])
