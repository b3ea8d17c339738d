"""Failures the census expects, each with the reason it is documented under.

Two kinds, both still counted as failures in the table and the JSON (an entry here never turns a
failure into a pass):

* ``LIMITATION``: the census cannot make the target run (a model that needs inputs the census does
  not synthesise, a config the shrink rule cannot make small). Only for the categories before
  capture (``outcomes.NOT_RUN``).
* ``DEFECT``: a modulelens defect with an open issue item; the entry names it. The quick test
  (tests/census/test_census.py) accepts a sampled target failing this way, so ``scripts/test``
  does not go red on a defect someone is fixing; the whole census lists it in docs/fidelity.md.
  A wrong value (``replay FAIL``), a dropped capture or a broken job is never accepted by the
  test, listed here or not.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from census import outcomes as oc

LIMITATION, DEFECT = "limitation", "defect"
NEVER_ACCEPTED = (oc.REPLAY_FAIL, oc.DROPPED, oc.JOB_BROKE)


@dataclass(frozen=True)
class Known:
    family: str
    target: str  # glob over target names
    category: str  # prefix of the outcome's category
    reason: str
    kind: str = LIMITATION


KNOWN: list[Known] = []


def match(outcome: oc.Outcome) -> Known | None:
    if outcome.passed:
        return None
    for entry in KNOWN:
        if (entry.family == outcome.family and fnmatch.fnmatchcase(outcome.target, entry.target)
                and outcome.category.startswith(entry.category)):
            return entry
    return None


def annotate(outcomes: list[oc.Outcome]) -> list[oc.Outcome]:
    for outcome in outcomes:
        entry = match(outcome)
        outcome.known = f"{entry.kind}: {entry.reason}" if entry else None
    return outcomes


def accepted(outcome: oc.Outcome) -> bool:
    """A failure the quick test lets through: documented, and neither a wrong value, a dropped
    capture nor a broken job."""
    if outcome.passed:
        return True
    entry = match(outcome)
    if entry is None or outcome.category.startswith(NEVER_ACCEPTED):
        return False
    return entry.kind == DEFECT or outcome.category in oc.NOT_RUN
