"""pytest plugin: golden tests against stored captures.

Registered through the ``pytest11`` entry point (or ``-p modulelens_pytest``)::

    import pytest
    from modulelens.testing import assert_matches

    @pytest.mark.modulelens("ranker/mlp:golden")
    def test_mlp(modulelens_capture):
        assert_matches(modulelens_capture.module, modulelens_capture)

The repo comes from ``--modulelens-repo``, else the ``modulelens_repo`` ini option (relative to the
ini file), else ``$MODULELENS_REPO`` / the user repo. The marker also takes ``device=``, ``dtype=``
and ``repo=``. ``--modulelens-skip-missing`` skips tests whose capture is not in the repo instead of
failing them. Nothing heavy (torch) is imported until a test asks for the fixture: this module
lives outside the ``modulelens`` package because importing the package imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

MARKER = "modulelens"


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--modulelens-repo``, ``--modulelens-skip-missing`` and the ``modulelens_repo`` ini option."""
    group = parser.getgroup("modulelens", "golden tests against modulelens captures")
    group.addoption("--modulelens-repo", dest="modulelens_repo", default=None, metavar="DIR",
                    help="modulelens repo holding the captures (default: ini modulelens_repo, "
                         "$MODULELENS_REPO, ~/.cache/modulelens/repo)")
    group.addoption("--modulelens-skip-missing", dest="modulelens_skip_missing", action="store_true", default=False,
                    help="skip tests whose capture is not in the repo instead of failing them")
    parser.addini("modulelens_repo", "modulelens repo holding the captures (relative to the ini file)", default=None)


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``modulelens`` marker."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(ref, *, device=None, dtype=None, repo=None): load capture ref (NAME[:vN|:alias]) "
        "for the modulelens_capture fixture",
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    """Name the repo in the session header when one is configured."""
    repo = _configured_repo(config)
    return f"modulelens repo: {repo}" if repo else None


def _configured_repo(config: pytest.Config) -> str | None:
    option = config.getoption("modulelens_repo", default=None)
    if option:
        return str(option)
    ini = config.getini("modulelens_repo")
    if ini:
        base = config.inipath.parent if config.inipath else config.rootpath
        return str((base / str(ini)).resolve()) if not Path(str(ini)).is_absolute() else str(ini)
    return None


@pytest.fixture
def modulelens_capture(request: pytest.FixtureRequest) -> Any:
    """The :class:`modulelens.Capture` named by the test's ``@pytest.mark.modulelens(ref)`` marker.

    Example::

        @pytest.mark.modulelens("ranker/mlp:golden", device="cpu")
        def test_mlp(modulelens_capture):
            assert_matches(modulelens_capture.module, modulelens_capture)
    """
    marker = request.node.get_closest_marker(MARKER)
    if marker is None or not marker.args:
        pytest.fail("the modulelens_capture fixture needs @pytest.mark.modulelens('name[:version]')", pytrace=False)
    from modulelens.errors import CaptureNotFoundError, ModulelensError
    from modulelens.format.tensors import dtype_from_name
    from modulelens.restore.loader import load

    ref = str(marker.args[0])
    repo = marker.kwargs.get("repo") or _configured_repo(request.config)
    dtype = marker.kwargs.get("dtype")
    if isinstance(dtype, str):
        dtype = dtype_from_name(dtype.removeprefix("torch."))
    try:
        return load(ref, repo=repo, device=marker.kwargs.get("device"), dtype=dtype)
    except CaptureNotFoundError as error:
        problem, missing = f"modulelens: {error}", True
    except ModulelensError as error:
        problem, missing = f"modulelens: cannot load {ref}: {error}", False
    if missing and request.config.getoption("modulelens_skip_missing", default=False):
        pytest.skip(problem)
    pytest.fail(problem, pytrace=False)
