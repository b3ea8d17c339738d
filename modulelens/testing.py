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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from modulelens.errors import MatchError

if TYPE_CHECKING:
    import os

    import torch

    from modulelens.repo import Repo
    from modulelens.restore.loader import Capture
    from modulelens.tools.verify import VerifyReport

__all__ = ["MatchError", "assert_matches"]

_MAX_LINES = 20


def assert_matches(
    module: torch.nn.Module | type[torch.nn.Module],
    capture: Capture | str,
    rtol: float | None = None,
    atol: float | None = None,
    *,
    calls: Sequence[int] | None = None,
    repo: Repo | str | os.PathLike[str] | None = None,
    ulps: float | Mapping[str, float] | None = None,
    oracle: bool | None = None,
) -> VerifyReport:
    """Run ``module`` on every recorded call of ``capture`` and raise :class:`MatchError` unless
    every output leaf matches within tolerance and no input was modified.

    When all selected calls saw the same weights, ``module`` runs as it is (its own weights). When
    the weights changed between them (a capture taken during training), no single set of weights
    can reproduce every call, so each call gets a module with that call's recorded weights, the
    way ``modulelens verify`` does it (``module`` itself is left untouched):

    * a module whose parameters have the recorded names and shapes runs as a copy with each call's
      recorded state loaded;
    * otherwise, when its class has ``from_original(original)`` (a rewrite with its own parameter
      layout, ``FusedMLP.from_original(cap.module)``), it is built again with ``from_original``
      from the original module in each call's recorded state.

    Args:
        module: the implementation to check: an instance, or a class (built like ``verify`` builds
            it: ``from_original(module)``, else the recorded constructor arguments).
        capture: a loaded :class:`~modulelens.Capture`, or a ref loaded from ``repo`` (default: the
            user repo).
        rtol, atol: override the per-dtype tolerances.
        calls: positions in ``capture.calls`` to check (default: all).
        repo: where to load a ref from.
        ulps: floating outputs within this many ULPs of the recorded ones, elementwise, instead of
            ``rtol``/``atol``: one number, or ``{"bfloat16": 2}`` per dtype.
        oracle: judge floating outputs against a float64 run of the original: the module's error
            within 3x (16-bit floats) or 4x (float32) the recording's own (docs/tools.md, "Verdicts in
            ULPs"); a correct bfloat16/float16 rewrite passes where fixed tolerances fail it. Default:
            on for float16/bfloat16/float8 outputs when no ``rtol``/``atol``/``ulps`` is given.

    Returns:
        The :class:`~modulelens.tools.verify.VerifyReport` when it passes.

    Raises:
        MatchError: an output is off, an input was modified, or the module cannot be given the
            recorded weights; the message counts the calls checked and names each failure. Also
            when nothing could be compared by value (``cannot verify ...``: no recorded calls,
            outputs stored shape-only, ``None`` or only NaN): a golden test that checks nothing fails.

    The module must live on the capture's device (``modulelens.load(..., device=...)``). The failure
    message names the call, the output leaf and how far off it is::

        MatchError: FusedMLP does not reproduce ranker/mlp:v3 (1 of 2 calls failed, per-dtype tolerances)
          call 7: output[1]: 12/64 elements differ (rtol=1.3e-06, atol=1e-05); max abs error 0.0031, ...

    Example::

        cap = modulelens.load("ranker/mlp:golden")
        assert_matches(MyMLP.from_original(cap.module), cap, rtol=1e-4)
        assert_matches(FusedBlock.from_original(cap.module), cap, oracle=True)   # a bf16 capture
    """
    __tracebackhide__ = True  # pytest: show the test's line, not this helper's
    from modulelens.restore.loader import Capture, load
    from modulelens.tools.verify import verify

    if not isinstance(capture, Capture):
        capture = load(str(capture), repo=repo)
    selected = list(range(len(capture.calls))) if calls is None else list(calls)
    states = sorted({capture.calls[i].state_index for i in selected})
    per_state = len(states) > 1  # the weights changed between calls: the module's own can match one state only
    candidate, how = (module, None) if not per_state else _per_state_candidate(module, capture, states[0])
    # a class is built by verify (from_original, or the constructor and the recorded state); an
    # instance keeps its own weights unless each call needs its recorded ones
    report = verify(capture, candidate, rtol=rtol, atol=atol, calls=selected,
                    load_state=None if isinstance(candidate, type) else per_state, timing=None, store=False,
                    ulps=ulps, oracle=oracle)
    if how is not None:
        report.notes.append(f"the weights changed between the recorded calls ({len(states)} states): each call ran "
                            f"on {how} with that call's recorded weights")
    if report.passed:
        return report
    name = module.__name__ if isinstance(module, type) else type(module).__name__
    tolerance = "per-dtype tolerances" if rtol is None and atol is None else f"rtol={rtol}, atol={atol}"
    if ulps is not None:
        from modulelens.restore.compare import check_ulps, describe_ulps

        tolerance = f"within {describe_ulps(check_ulps(ulps) or 0.0)}"
    judged = report.calls[0].leaves if report.calls else []
    if any(leaf.rule == "oracle" for leaf in judged):
        tolerance = "the float64 oracle rule" + (f", else {tolerance}" if tolerance != "per-dtype tolerances" else "")
    if report.status == "UNVERIFIED":  # nothing failed, and nothing real was compared: never a pass
        reasons = report.unverified
        if len(reasons) > _MAX_LINES:
            reasons = [*reasons[:_MAX_LINES], f"... and {len(reasons) - _MAX_LINES} more"]
        raise MatchError("\n".join([f"cannot verify {name} against {capture.ref}: nothing recorded could be "
                                     f"compared by value ({tolerance})", *(f"  {line}" for line in reasons)]))
    failed = sum(not c.passed for c in report.calls)
    checked = len(report.calls)
    counts = f"{failed} of {checked} calls failed" if checked == len(selected) else (
        f"{failed} of {checked} checked calls failed, {len(selected) - checked} of {len(selected)} not checked")
    header = f"{name} does not reproduce {capture.ref} ({counts}, {tolerance})"
    lines = report.failures or ["no recorded calls were compared"]
    if per_state and report.state_mismatch is not None:
        by_state = {s: [i for i in selected if capture.calls[i].state_index == s] for s in states}
        lines = [f"the weights changed between the recorded calls ({len(states)} states), so each call needs its "
                 f"recorded weights, but they cannot be loaded into {name} ({report.error}) and it has no "
                 f"from_original(original) to build it from each state; add one, or compare one state at a time "
                 f"with calls=... (calls by state: {by_state})"]
    if len(lines) > _MAX_LINES:
        lines = [*lines[:_MAX_LINES], f"... and {len(lines) - _MAX_LINES} more"]
    raise MatchError("\n".join([header, *(f"  {line}" for line in lines)]))


def _per_state_candidate(module: torch.nn.Module | type[torch.nn.Module], capture: Capture,
                         first_state: int) -> tuple[torch.nn.Module | type[torch.nn.Module], str]:
    """What ``verify`` gets when the weights changed between calls, and how each call's module is made.

    A class goes as it is (``verify`` builds it per state). An instance whose state dict takes the
    recorded one goes as a copy (the recorded state is loaded per call); one that does not, but
    whose class has ``from_original``, is replaced by its class, so that ``verify`` builds it again
    from the original in each recorded state (what ``modulelens verify --candidate`` does).
    """
    from modulelens.tools.verify import load_state_strict

    if isinstance(module, type):
        return module, f"{module.__name__} built for each state"
    copy_ = copy.deepcopy(module)
    if load_state_strict(copy_, capture.fresh_state_dict(first_state)) is None:
        return copy_, "a copy of the module"
    if callable(getattr(type(module), "from_original", None)):
        return type(module), f"{type(module).__name__}.from_original(the original module)"
    return copy_, "a copy of the module"
