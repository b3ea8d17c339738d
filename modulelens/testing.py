"""Golden tests: assert that a module still reproduces a capture.

Example (with the pytest plugin, which loads the capture named by the marker)::

    import pytest
    from modulelens.testing import assert_matches

    @pytest.mark.modulelens("ranker/mlp:golden")
    def test_mlp_still_matches(modulelens_capture):
        assert_matches(modulelens_capture.module, modulelens_capture)      # today's code, recorded weights

    @pytest.mark.modulelens("ranker/mlp:golden")
    def test_fused_mlp(modulelens_capture):
        fused = FusedMLP.from_original(modulelens_capture.module)
        assert_matches(fused, modulelens_capture, rtol=1e-4, atol=1e-5)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from modulelens.errors import MatchError

if TYPE_CHECKING:
    import torch

    from modulelens.restore.loader import Capture
    from modulelens.tools.verify import VerifyReport

__all__ = ["MatchError", "assert_matches"]

_MAX_LINES = 20


def assert_matches(
    module: torch.nn.Module,
    capture: Capture | str,
    rtol: float | None = None,
    atol: float | None = None,
    *,
    calls: Sequence[int] | None = None,
    repo: Any = None,
) -> VerifyReport:
    """Run ``module`` on every recorded call of ``capture`` and raise :class:`MatchError` unless
    every output leaf matches within tolerance and no input was modified.

    When all selected calls saw the same weights, ``module`` runs as it is (its own weights). When
    the weights changed between them (training steps during capture), no single set of weights can
    reproduce every call: each call then runs on a copy of ``module`` with that call's recorded
    state loaded by parameter name (``module`` itself is left untouched), and the report says so.

    ``capture`` is a loaded :class:`~modulelens.Capture` or a ref (loaded from ``repo``, default the
    user repo). ``rtol``/``atol`` default to per-dtype tolerances. The module must live on the
    capture's device (``modulelens.load(..., device=...)``). Returns the report when it passes.

    The failure message names the call, the output leaf and how far off it is::

        MatchError: FusedMLP does not reproduce ranker/mlp:v3 (1 of 2 calls failed, per-dtype tolerances)
          call 7: output[1]: 12/64 elements differ (rtol=1.3e-06, atol=1e-05); max abs error 0.0031, ...

    Example::

        cap = modulelens.load("ranker/mlp:golden")
        assert_matches(MyMLP.from_original(cap.module), cap, rtol=1e-4)
    """
    __tracebackhide__ = True  # pytest: show the test's line, not this helper's
    from modulelens.restore.loader import Capture, load
    from modulelens.tools.verify import verify

    if not isinstance(capture, Capture):
        capture = load(str(capture), repo=repo)
    selected = list(range(len(capture.calls))) if calls is None else list(calls)
    states = sorted({capture.calls[i].state_index for i in selected})
    per_state = len(states) > 1  # the weights changed between calls: the module's own can match one state only
    candidate = copy.deepcopy(module) if per_state else module
    report = verify(capture, candidate, rtol=rtol, atol=atol, calls=selected, load_state=per_state, timing=None,
                    store=False)
    if per_state:
        report.notes.append(f"the weights changed between the recorded calls ({len(states)} states): each call ran "
                            "on a copy of the module with that call's recorded weights loaded")
    if report.passed:
        return report
    tolerance = "per-dtype tolerances" if rtol is None and atol is None else f"rtol={rtol}, atol={atol}"
    failed = sum(not c.passed for c in report.calls)
    header = (f"{type(module).__name__} does not reproduce {capture.ref} "
              f"({failed} of {len(report.calls)} calls failed, {tolerance})")
    lines = report.failures or ["no recorded calls were compared"]
    if per_state and report.state_mismatch is not None:
        by_state = {s: [i for i in selected if capture.calls[i].state_index == s] for s in states}
        lines = [f"the weights changed between the recorded calls ({len(states)} states), so each call needs its "
                 f"recorded weights, but they cannot be loaded into {type(module).__name__}: {report.error}; "
                 f"compare one state at a time with calls=... (calls by state: {by_state})"]
    if len(lines) > _MAX_LINES:
        lines = [*lines[:_MAX_LINES], f"... and {len(lines) - _MAX_LINES} more"]
    raise MatchError("\n".join([header, *(f"  {line}" for line in lines)]))
