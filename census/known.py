"""Failures the census expects, each with the reason it is documented under.

Every entry still counts as a failure in the table, the JSON and docs/fidelity.md: an entry here
never turns a failure into a pass. Two kinds:

* ``LIMITATION``: the census cannot make the target run (a layer that needs arguments or inputs
  the mechanical rules do not make, an optional native dependency missing). Only for the
  categories before capture (``outcomes.NOT_RUN``).
* ``DEFECT``: a modulelens defect with an open issue item, and the text its error must contain
  (``expect``). The quick test (tests/test_census.py) and ``.ci/run``'s whole census accept a
  target failing exactly this way, so the test suite does not go red on a defect someone is
  fixing; a target failing any other way, or a wrong value (a replay FAIL with a nonzero
  difference), is never accepted. An entry that no longer matches any failure of a whole census
  is reported as stale (the defect is fixed: remove the entry), and the census exits 1.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from census import outcomes as oc

LIMITATION, DEFECT = "limitation", "defect"


@dataclass(frozen=True)
class Known:
    family: str
    target: str  # glob over target names
    category: str  # prefix of the outcome's category
    reason: str
    kind: str = LIMITATION
    expect: str = ""  # text the failure's message must contain (DEFECT entries)


_NEW = "found by the census, not filed yet"

KNOWN: list[Known] = [
    # No modulelens defect is open: the census's earlier ones (diffusers BaseOutput, torchrec KeyedTensor, peft
    # adapters and prompt/prefix tuning, Lazy* modules, NLLLoss2d; timm dm_nfnet_f0's stage block, whose
    # act_layer is a closure, now rebuilt from its recorded attributes, issue 34) replay bit-exact.
    # the census's own limits: targets its mechanical rules cannot build or feed (each listed with its reason)
    *(Known(family, "*", category, "the census's construction rules do not cover this target (see its message)")
      for family in ("transformers", "timm", "torch_geometric", "torch_nn", "peft", "diffusers", "tools")
      for category in oc.NOT_RUN),
    Known("torchrec", "EmbeddingBagCollection", oc.BUILD, "needs native fbgemm, which does not load with torch 2.13"),
]


def match(outcome: oc.Outcome) -> Known | None:
    if outcome.passed:
        return None
    for entry in KNOWN:
        if (entry.family == outcome.family and fnmatch.fnmatchcase(outcome.target, entry.target)
                and outcome.category.startswith(entry.category) and entry.expect in outcome.message):
            return entry
    return None


def annotate(outcomes: list[oc.Outcome]) -> list[oc.Outcome]:
    for outcome in outcomes:
        entry = match(outcome)
        outcome.known = f"{entry.kind}: {entry.reason}" if entry else None
    return outcomes


def wrong_value(outcome: oc.Outcome) -> bool:
    """A replay that compared values and found a difference, as opposed to a replay call that raised.

    Decided on the replay worker's count of compared leaves that did not match (``differing``:
    tensors, plain values, output structure, gradients), and on the report's text as a second
    witness (any nonzero ``max abs err``). A replay FAIL without the count (an old result) counts as
    a wrong value; so does a PASS only within tolerance (the values differ)."""
    if outcome.category == oc.TOLERANCE:
        return True
    if outcome.category != oc.REPLAY_FAIL:
        return False
    errors = [float(x) for x in re.findall(r"max abs err ([0-9.eE+-]+|inf|nan)", outcome.message)]
    return outcome.differing is None or outcome.differing > 0 or any(e != 0 for e in errors)


def accepted(outcome: oc.Outcome) -> bool:
    """A failure the tests let through: documented here, and never a wrong value."""
    if outcome.passed or outcome.category == oc.PROBED:
        return True
    entry = match(outcome)
    if entry is None or wrong_value(outcome):
        return False
    return entry.kind == DEFECT or outcome.category in oc.NOT_RUN


def stale(outcomes: list[oc.Outcome], families: list[str]) -> list[Known]:
    """DEFECT entries of the given families that no outcome matches any more."""
    used = {match(o) for o in outcomes}
    return [k for k in KNOWN if k.kind == DEFECT and k.family in families and k not in used]
