"""torchmetrics' metric states after a call (docs/fidelity.md, "Buffers a call changes"): a
metric's ``update`` returns ``None``, so its replay could only say UNVERIFIED ("nothing to
compare"), and a rewrite that broke the accumulation passed every ``forward`` whose batch value
was right. The states a call changes are recorded after it and compared, as changed buffers are."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from child_process import replay_in_fresh_process

import modulelens

torchmetrics = pytest.importorskip("torchmetrics")
from torchmetrics.regression import MeanSquaredError, SpearmanCorrCoef  # noqa: E402


def _built(cls: type[torch.nn.Module]) -> torch.nn.Module:
    tracking = modulelens.track_init()
    try:
        return cls()
    finally:
        tracking.stop()


class ForgetsTheCount(MeanSquaredError):  # noqa: N818  (a metric, not an exception)
    """A rewrite of ``update`` whose sum is right and whose count is never kept."""

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        self.sum_squared_error += torch.sum((preds - target) ** 2)


class CountsInCompute(MeanSquaredError):  # noqa: N818
    """A rewrite of ``compute`` that changes a running state the recorded ``compute`` left alone."""

    def compute(self) -> torch.Tensor:
        self.total += 1
        return super().compute()


def _metric_job(metric: torch.nn.Module, steps: int = 3) -> None:
    """As a training loop uses a metric: ``update`` per batch, the running value, and a batch value
    from ``metric(preds, target)`` (which runs ``update`` inside it, from reset states)."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        metric.update(torch.randn(8, generator=generator), torch.randn(8, generator=generator))
        metric.compute()
        metric(torch.randn(4, generator=generator), torch.randn(4, generator=generator))


def test_update_is_verified_by_the_states_it_leaves(tmp_path: Path) -> None:
    metric = _built(MeanSquaredError)
    with modulelens.capture(metric, [":update", ":compute"], repo=tmp_path, name="mse",
                            record=modulelens.Recording(max_calls=4)) as cap:
        _metric_job(metric)
    assert {v.name: v.calls for v in cap.saved} == {"mse.update": 4, "mse.compute": 4}  # (forward runs both)
    update = modulelens.load("mse.update", repo=tmp_path)
    assert update.metadata["capture"]["metric_states_after"] is True
    first = update.calls[0].buffers_after
    assert sorted(first) == ["sum_squared_error", "total"] and int(first["total"]) == 8
    # the second update is the one inside forward: it starts from reset states, as the first does
    assert update.calls[1].state_index == update.calls[0].state_index and int(update.calls[1].buffers_after["total"]) == 4
    report = update.replay()
    assert report.status == "PASS", report  # was UNVERIFIED: "the recorded output is None"
    for call in report.calls:
        assert {leaf.path for leaf in call.leaves} >= {"metric_states['sum_squared_error'](after the call)",
                                                      "metric_states['total'](after the call)"}
    # compute changes nothing: nothing recorded after it, and a rewrite that changes a state fails
    compute = modulelens.load("mse.compute", repo=tmp_path)
    assert all(not call.buffers_after for call in compute.calls)
    meddling = modulelens.verify(compute, CountsInCompute, timing=None, store=False)
    assert meddling.status == "FAIL"
    assert any("metric_states['total'](after the call, which left it unchanged)" in line
               for line in meddling.failures), meddling.failures
    fresh = replay_in_fresh_process(tmp_path, {"update": "mse.update", "compute": "mse.compute"})
    assert {label: r["status"] for label, r in fresh.items()} == {"update": "PASS", "compute": "PASS"}, fresh


def test_a_rewrite_that_forgets_a_running_state_fails_naming_it(tmp_path: Path) -> None:
    metric = _built(MeanSquaredError)
    with modulelens.capture(metric, [":update"], repo=tmp_path, name="mse",
                            record=modulelens.Recording(max_calls=2)) as cap:
        _metric_job(metric, steps=1)
    update = modulelens.load(cap.saved[0].ref, repo=tmp_path)
    assert modulelens.verify(update, MeanSquaredError, timing=None, store=False).passed
    forgetful = modulelens.verify(update, ForgetsTheCount, timing=None, store=False)
    assert forgetful.status == "FAIL"
    assert any("metric_states['total'](after the call)" in line for line in forgetful.failures), forgetful.failures
    assert not any("sum_squared_error" in line for line in forgetful.failures), forgetful.failures
    # with the module's current weights, only a call that starts from its recorded states is judged by them
    current = update.replay(module=ForgetsTheCount())
    assert [call.status for call in current.calls] == ["fail", "unverified"], str(current)


def test_a_list_state_is_recorded_after_each_update(tmp_path: Path) -> None:
    """``cat`` states (lists of batches, as rank correlations keep) grow by one tensor per update."""
    metric = _built(SpearmanCorrCoef)
    generator = torch.Generator().manual_seed(1)
    with modulelens.capture(metric, [":update"], repo=tmp_path, name="rho",
                            record=modulelens.Recording(max_calls=3)) as cap:
        for _ in range(3):
            metric.update(torch.randn(6, generator=generator), torch.randn(6, generator=generator))
    update = modulelens.load(cap.saved[0].ref, repo=tmp_path)
    assert [len(call.buffers_after["preds"]) for call in update.calls] == [1, 2, 3]
    assert update.replay().status == "PASS"


def test_calls_that_share_a_state_after_a_reset_replay_from_it(tmp_path: Path) -> None:
    """A reset metric's calls share its first state. Metric states were not part of what tells a
    replay to reload a state, so the second call ran on the sums the replayed first one left:
    invisible in its batch value (computed from reset states), a FAIL of its states after it."""
    metric = _built(MeanSquaredError)
    generator = torch.Generator().manual_seed(2)
    with modulelens.capture(metric, [""], repo=tmp_path, name="mse",
                            record=modulelens.Recording(max_calls=2)) as cap:
        for _ in range(2):
            metric(torch.randn(5, generator=generator), torch.randn(5, generator=generator))
            metric.reset()
    loaded = modulelens.load(cap.saved[0].ref, repo=tmp_path)
    assert loaded.calls[0].state_index == loaded.calls[1].state_index
    report = loaded.replay()
    assert report.status == "PASS", report
    assert all("metric_states['total'](after the call)" in {leaf.path for leaf in call.leaves} for call in report.calls)
