"""The fidelity census (issue 22): its fast seeded sample in every test run, and the rules that keep
its verdicts true.

``test_quick_census_sample`` runs ``python -m census --quick`` as a user would (a subprocess: per
family a probing process without modulelens, a capturing process, a fresh replaying process) and
asserts that every sampled target either replays bit-exact in the fresh process or fails in a way
census/known.py documents, never with a wrong value, and that enough targets actually ran. The
whole census runs in ``.ci/run``. The other tests pin the two rules the table's trustworthiness
rests on: a replay that found a different value is never accepted, whatever census/known.py says,
and "could not build" is decided where modulelens is not involved, so it cannot hide a modulelens
failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import modulelens

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from census import known  # noqa: E402
from census import outcomes as oc  # noqa: E402
from census.__main__ import FAMILIES  # noqa: E402
from census.outcomes import Outcome  # noqa: E402
from census.targets import Target  # noqa: E402
from census.worker import capture_target, probe_target  # noqa: E402

pytest.importorskip("transformers")


# about 3 minutes alone on 2 cores (issue 34's eleven families add 2 CPU minutes: 22 targets, and three processes
# each importing its library); far more when the machine is shared (15 minutes measured at a load average of 12)
@pytest.mark.timeout(1800)
def test_quick_census_sample(tmp_path: Path) -> None:
    out = tmp_path / "quick.json"
    result = subprocess.run([sys.executable, "-m", "census", "--quick", "--out", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=1800, check=False)
    assert out.exists(), result.stderr[-3000:]
    data = json.loads(out.read_text())
    outcomes = [Outcome(**o) for o in data["outcomes"]]
    assert {o.family for o in outcomes} == set(FAMILIES)
    not_accepted = [f"{o.family} {o.label or o.target}: {o.category}: {o.message[:300]}"
                    for o in outcomes if not known.accepted(o)]
    assert not_accepted == []
    assert result.returncode == 0, result.stderr[-3000:]
    # enough really ran: captures replayed bit-exact in a fresh process, in every family but the ones
    # whose whole sample is a documented defect
    exact = [o for o in outcomes if o.passed]
    assert len(exact) >= 40, len(exact)
    assert len({o.family for o in exact}) >= 5
    assert {o.mode for o in exact} == {"train", "eval"}


# -- a wrong value is never accepted --------------------------------------------------------------

# A defect entry as census/known.py writes them. The tests install their own (the real entries come
# and go as defects are fixed; a whole census reports an entry that matches nothing as stale).
_DOCUMENTED = known.Known("peft", "PromptTuning", oc.REPLAY_FAIL, "a defect someone is fixing", known.DEFECT,
                          "Cannot copy out of meta tensor")


@pytest.fixture
def documented(monkeypatch: pytest.MonkeyPatch) -> known.Known:
    monkeypatch.setattr(known, "KNOWN", [*known.KNOWN, _DOCUMENTED])
    return _DOCUMENTED


def _fail(message: str, differing: int | None, target: str = "PromptTuning") -> Outcome:
    return Outcome("peft", target, oc.REPLAY_FAIL, f"{target}:model@eval", message=message, differing=differing)


def test_a_replay_that_raised_is_accepted_only_where_documented(documented: known.Known) -> None:
    raised = _fail("replay ...: FAIL\n  call 0: FAIL  max abs err 0  RuntimeError: Cannot copy out of meta tensor", 0)
    assert not known.wrong_value(raised)
    assert known.match(raised) is documented and known.accepted(raised)
    elsewhere = _fail(raised.message, 0, target="LoRA")  # the same failure where no entry documents it
    assert not known.accepted(elsewhere)


def test_a_defect_entry_that_matches_nothing_is_stale(documented: known.Known) -> None:
    raised = _fail("call 0: FAIL  max abs err 0  RuntimeError: Cannot copy out of meta tensor", 0)
    assert known.stale([raised], ["peft"]) == []
    fixed = Outcome("peft", "PromptTuning", oc.BIT_EXACT, "PromptTuning:model@eval")  # the defect was fixed
    assert known.stale([fixed], ["peft"]) == [documented]
    assert known.stale([fixed], ["torch_nn"]) == []  # only the families that ran are judged


def _committed_census() -> tuple[list[Outcome], list[str]]:
    data = json.loads((ROOT / "census" / "results" / "full.json").read_text())
    return [Outcome(**o) for o in data["outcomes"]], data["families"]


def test_no_defect_entry_is_stale_against_the_committed_whole_census() -> None:
    """census/known.py and census/results/full.json (the run docs/fidelity.md shows) agree: no
    defect entry outlived its fix (the whole census in CI exits 1 on a stale entry)."""
    outcomes, families = _committed_census()
    assert known.stale(outcomes, families) == []


def test_every_failure_of_the_committed_whole_census_is_documented_and_never_a_wrong_value() -> None:
    outcomes, _ = _committed_census()
    assert [f"{o.family} {o.label or o.target}: {o.category}" for o in outcomes if not known.accepted(o)] == []


@pytest.mark.parametrize("differing, message", [
    (1, "call 0: FAIL  max abs err 0  RuntimeError: Cannot copy out of meta tensor"),  # a value differs: the count
    (0, "call 0: FAIL  max abs err 0.25  Cannot copy out of meta tensor"),  # the report's text as second witness
    (0, "call 1: FAIL  max abs err nan  Cannot copy out of meta tensor"),
    (None, "call 0: FAIL  max abs err 0  Cannot copy out of meta tensor"),  # no count (an old result)
])
def test_a_wrong_value_is_never_accepted_even_when_its_message_matches_an_entry(documented: known.Known,
                                                                                differing: int | None,
                                                                                message: str) -> None:
    wrong = _fail(message, differing)
    assert known.match(wrong) is documented  # the documented defect's text is there...
    assert known.wrong_value(wrong) and not known.accepted(wrong)  # ...and still it is never accepted


def test_within_tolerance_is_a_wrong_value() -> None:
    close = Outcome("torch_nn", "Linear", oc.TOLERANCE, "Linear:model@eval", message="mode tolerance")
    assert known.wrong_value(close) and not known.accepted(close)


@pytest.mark.parametrize("category", [oc.DROPPED, oc.JOB_BROKE, oc.CAPTURE_TIMEOUT, oc.CAPTURE_CRASH,
                                      oc.UNVERIFIED, oc.REPLAY_CRASH,
                                      "load: class not importable"])
def test_a_failure_after_the_probe_is_never_a_census_limitation(category: str) -> None:
    # every family has limitation entries for the categories before capture; none reaches these
    failure = Outcome("transformers", "llama", category, "llama:model@eval", message="whatever")
    assert not known.accepted(failure)


def test_nothing_to_compare_is_listed_not_counted_and_not_a_failure() -> None:
    # a module whose outputs under the census's inputs are None, empty or only NaN: the replay matched
    # and no value could be wrong, so it is neither bit-exact nor a failure of the rebuild
    vacuous = Outcome("torch_nn", "Dropout", oc.NOTHING_TO_COMPARE, "Dropout:model@eval",
                      message="the recorded output is None: nothing to compare")
    assert not vacuous.passed and known.accepted(vacuous) and not known.wrong_value(vacuous)


# -- "could not build" cannot hide a modulelens failure -------------------------------------------

def test_the_probe_process_never_imports_modulelens(tmp_path: Path) -> None:
    out = tmp_path / "probe.jsonl"
    subprocess.run([sys.executable, "-m", "census.worker", "probe", "torch_nn", str(out), "--only", "Linear"],
                   cwd=ROOT, check=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["ran"]["target"] for r in records if "ran" in r] == ["Linear"]
    # the worker exits non-zero when modulelens got imported; check the import graph too
    check = "import census.worker, census.families.torch_nn, sys; assert 'modulelens' not in sys.modules"
    subprocess.run([sys.executable, "-c", check], cwd=ROOT, check=True, timeout=300)


@pytest.fixture
def untracked() -> Iterator[None]:
    """Constructor tracking off, as in a census worker (tests/conftest.py turns it on for the session)."""
    from modulelens.tracing.init_tracking import is_tracking, stop_tracking

    was_on = is_tracking()
    stop_tracking()
    yield
    if was_on:
        modulelens.track_init()


def _breaks_under_tracking() -> nn.Module:
    model = nn.Linear(3, 2)
    if modulelens.get_init_record(model) is not None:  # built under modulelens.track_init()
        raise RuntimeError("this model does not build while modulelens tracks construction")
    return model


def test_a_target_that_builds_only_without_modulelens_broke_under_capture(tmp_path: Path, untracked: None) -> None:
    target = Target("Breaks", _breaks_under_tracking, lambda _m: lambda m: m(torch.ones(1, 3)),
                    submodules=lambda _m: {"model": ""})
    plan = probe_target("torch_nn", target)
    assert "ran" in plan, plan  # without modulelens it builds and runs
    outcomes = capture_target("torch_nn", target, plan["ran"], str(tmp_path / "repo"))
    assert {o.category for o in outcomes} == {oc.JOB_BROKE}
    assert {o.label for o in outcomes} == {"Breaks:model@train", "Breaks:model@eval"}
    assert "does not build while modulelens tracks" in outcomes[0].message
    assert not any(known.accepted(o) for o in outcomes)


def test_a_mode_that_fails_without_modulelens_is_could_not_run(tmp_path: Path, untracked: None) -> None:
    def job(model: nn.Module) -> None:
        if model.training:
            raise ValueError("this job has no train mode")
        model(torch.ones(1, 3))

    target = Target("EvalOnly", lambda: nn.Linear(3, 2), lambda _m: job, submodules=lambda _m: {"model": ""})
    plan = probe_target("torch_nn", target)["ran"]
    assert sorted(plan["called"]) == ["eval"] and "no train mode" in plan["failed"]["train"]
    outcomes = capture_target("torch_nn", target, plan, str(tmp_path / "repo"))
    assert sorted((o.mode, o.category) for o in outcomes) == [("eval", "saved"), ("train", oc.RUN)]


class _BindsItsUpdate(nn.Module):
    """Binds ``update`` to the instance in ``__init__``, as torchmetrics' ``Metric`` does."""

    def __init__(self) -> None:
        super().__init__()
        self.total = torch.zeros(())
        inner = self.update
        self.update = lambda x: inner(x)

    def update(self, x: torch.Tensor) -> None:
        self.total += x.sum()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_the_probe_sees_a_method_bound_to_the_instance(untracked: None) -> None:
    """The probe wrapped methods on the class only; a method bound in ``__init__`` never went
    through it, so torchmetrics' ``:update`` and ``:compute`` targets were said never to run and
    left out of the census without a word."""
    target = Target("Binds", _BindsItsUpdate, lambda _m: lambda m: m.update(torch.ones(2)),
                    submodules=lambda _m: {"update": ":update"})
    plan = probe_target("methods", target)
    assert plan["ran"]["called"] == {"train": ["update"], "eval": ["update"]}, plan
