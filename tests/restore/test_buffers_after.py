"""Buffers a call changes (docs/fidelity.md, "Buffers a call changes"): running statistics, an EMA
written through ``.data``, a step counter. Outputs alone passed a rewrite that forgot them."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest
import tools_models as tm
import torch
from child_process import replay_in_fresh_process

import modulelens
from modulelens.errors import CorruptCaptureError
from modulelens.format.validate import validate_call
from modulelens.interfaces.html import replay_html


def _capture(module: torch.nn.Module, repo: Path, name: str, steps: int = 3, dim: int = 6) -> str:
    with modulelens.capture(module, targets=["."], repo=repo, name=name,
                            record=modulelens.Recording(max_calls=steps)) as cap:
        for _ in range(steps):
            module(torch.randn(10, dim))
    return cap.saved[0].ref


def _built(cls: type[torch.nn.Module], *args: object) -> torch.nn.Module:
    tracking = modulelens.track_init()
    try:
        return cls(*args)
    finally:
        tracking.stop()


def test_running_statistics_are_recorded_after_each_call_and_replay_compares_them(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = _built(tm.Normed, 6)
    ref = _capture(module, tmp_path, "bn")
    cap = modulelens.load(ref, repo=tmp_path)
    assert cap.metadata["capture"]["buffers_after"] is True
    for position, call in enumerate(cap.calls):
        after = call.buffers_after
        assert sorted(after) == ["bn.num_batches_tracked", "bn.running_mean", "bn.running_var"]
        assert int(after["bn.num_batches_tracked"]) == position + 1
        entry = cap.fresh_state_dict(call.state_index)
        assert not torch.equal(entry["bn.running_mean"], after["bn.running_mean"])  # the kernel's write was seen
        if position + 1 < len(cap.calls):  # the state of the next call starts where this one ended
            following = cap.fresh_state_dict(cap.calls[position + 1].state_index)
            assert torch.equal(following["bn.running_var"], after["bn.running_var"])
    report = cap.replay()
    assert report.passed, report
    assert any(leaf.path == "buffers['bn.running_mean'](after the call)" for leaf in report.calls[0].leaves)
    fresh = replay_in_fresh_process(tmp_path, {"bn": ref})
    assert fresh["bn"]["status"] == "PASS", fresh["bn"].get("report")


def test_a_rewrite_that_forgets_the_running_statistics_fails_by_name(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = _capture(_built(tm.Normed, 6), tmp_path, "bn")
    cap = modulelens.load(ref, repo=tmp_path)
    faithful = modulelens.verify(cap, tm.FunctionalNormed, timing=None, store=False)
    assert faithful.passed, faithful
    forgetful = modulelens.verify(cap, tm.NormedWithoutStatistics, timing=None, store=False)
    assert forgetful.status == "FAIL"
    # its outputs match (the batch's statistics); only the buffers tell
    assert all(leaf.passed for call in forgetful.calls for leaf in call.leaves if leaf.path.startswith("output"))
    assert any("buffers['bn.running_mean'](after the call)" in line for line in forgetful.failures), forgetful.failures
    assert not any("num_batches_tracked" in line for line in forgetful.failures)
    assert all(call.divergence is None for call in forgetful.calls)  # no op-trace hunt for a right output


def test_a_rewrite_that_updates_statistics_the_recorded_call_left_alone_fails(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = _built(tm.Normed, 6).eval()
    ref = _capture(module, tmp_path, "bn_eval")
    cap = modulelens.load(ref, repo=tmp_path)
    assert all(not call.buffers_after for call in cap.calls)
    assert "buffers_after" not in json.dumps(cap.metadata["calls"])  # nothing changed, nothing stored
    assert modulelens.verify(cap, tm.FunctionalNormed, timing=None, store=False).passed
    meddling = modulelens.verify(cap, tm.NormedUpdatingInEval, timing=None, store=False)
    assert meddling.status == "FAIL"
    assert any("buffers['bn.running_mean'](after the call, which left it unchanged)" in line
               for line in meddling.failures), meddling.failures


def test_an_average_written_through_data_is_recorded_and_checked(tmp_path: Path) -> None:
    """``.data.mul_()`` leaves the version counter alone: the fingerprint sees the change."""
    torch.manual_seed(0)
    ref = _capture(_built(tm.EmaCodebook, 4), tmp_path, "ema", dim=4)
    cap = modulelens.load(ref, repo=tmp_path)
    assert [sorted(call.buffers_after) for call in cap.calls] == [["average"]] * 3
    assert cap.replay().passed
    assert modulelens.verify(cap, tm.EmaCodebook, timing=None, store=False).passed
    frozen = modulelens.verify(cap, tm.EmaCodebookFrozen, timing=None, store=False)
    assert frozen.status == "FAIL" and any("buffers['average']" in line for line in frozen.failures)


def test_replay_with_a_rewrite_compares_buffers_where_it_starts_from_the_recorded_ones(tmp_path: Path) -> None:
    """``replay(module=...)`` runs each call from the module's own buffers: the first call, whose
    state the rewrite was loaded with, is judged on its buffers; the later ones (other recorded
    running statistics) cannot be (docs/fidelity.md)."""
    torch.manual_seed(0)
    ref = _capture(_built(tm.Normed, 6), tmp_path, "bn")
    cap = modulelens.load(ref, repo=tmp_path)
    rewrite = tm.NormedWithoutStatistics(6)
    rewrite.load_state_dict(cap.fresh_state_dict(cap.calls[0].state_index))
    report = cap.replay(module=rewrite, rtol=1e-4, atol=1e-5)  # (its own arithmetic: not bit-exact)
    assert [call.status for call in report.calls] == ["fail", "pass", "pass"], report
    assert "buffers['bn." in str(report).splitlines()[1] and "more leaves differ" in str(report)
    # the leaf furthest off is the one the call's line and the HTML report name (not the first)
    worst = report.calls[0].worst
    failing = [leaf for leaf in report.calls[0].all_leaves if not leaf.passed]
    assert worst is not None and len(failing) > 1
    assert worst.max_abs_error == max(leaf.max_abs_error for leaf in failing) > failing[0].max_abs_error, failing
    assert f"{worst.path}: " in str(report).splitlines()[1]
    shown = replay_html(report)
    assert html.escape(f"{worst.path}: {worst.message}; {len(failing) - 1} more leaves differ") in shown
    assert not any(leaf.path.startswith("buffers") for call in report.calls[1:] for leaf in call.leaves)
    faithful = tm.FunctionalNormed(6)
    faithful.load_state_dict(cap.fresh_state_dict(cap.calls[0].state_index))
    assert [call.status for call in cap.replay(module=faithful).calls] == ["pass"] * 3


def test_a_damaged_buffers_after_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = _capture(_built(tm.EmaCodebook, 4), tmp_path, "ema", steps=1, dim=4)
    meta = json.loads(json.dumps(modulelens.load(ref, repo=tmp_path).metadata))
    validate_call(meta, 0, "ema")  # as saved
    meta["calls"][0]["buffers_after"] = {"leaves": [], "spec": "nonsense"}
    with pytest.raises(CorruptCaptureError, match=r"calls\[0\]\.buffers_after"):
        validate_call(meta, 0, "ema")


def test_the_capture_page_shows_the_buffers_after_the_call(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from modulelens.interfaces.ui.repo_view import RepoView
    from modulelens.interfaces.ui.server import UiSettings, create_app

    torch.manual_seed(0)
    ref = _capture(_built(tm.Normed, 6), tmp_path, "bn", steps=1)
    web = TestClient(create_app(RepoView(modulelens.Repo(tmp_path), scan_jobs=False), UiSettings()),
                     base_url="http://127.0.0.1:8765")
    page = web.get(f"/capture/{ref}").text
    assert "buffers after the call (changed by it)" in page and "bn.running_mean" in page
