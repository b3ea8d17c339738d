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
    # The census's earlier modulelens defects are fixed and replay bit-exact: diffusers BaseOutput, torchrec
    # KeyedTensor, peft adapters and prompt/prefix tuning, Lazy* modules, NLLLoss2d (issue 22), and issue 34's
    # items 1-3 as the library families found them (fixed on branch fid-build, each family rerun): a rebuild under
    # the meta device (kornia's RandomMotionBlur and ScaleSpaceDetector, e3nn's tensor products), classes with
    # their own __new__ (neuralop's BaseModel, tensordict's TensorDictModuleBase: every torchrl module), tool-made
    # modules (e3nn's Legendre, a GraphModule), a closure argument (timm dm_nfnet_f0's stage block) and
    # assign_state(live=True) reading parameters with getattr (neuralop's SpectralConv); then transformers'
    # BatchEncoding (sentence-transformers' encode and predict), a weight mapped off a 64-byte boundary (the
    # CrossEncoder's head: a 1-ULP wrong value), library objects as constructor arguments (sentence-transformers'
    # WhitespaceTokenizer, kornia's ColorMap, the TensorDict of torchrl's MultiAgentMLP and EnsembleModule). Still open:
    Known("torchrl", "modules.MultiAgentConvNet", f"{oc.LOAD}: state dict does not match", f"{_NEW}: torchrl's "
          "multi-agent nets keep a template net (`_empty_net`) whose parameters they move into a TensorDictParams and "
          "remove from the template; for the convolutional net the rebuilt template still has its own (its "
          "constructor ran again, and the recorded state holds none for it), so the load's state check refuses it",
          DEFECT, "missing: ['_empty_net."),
    # the census's own limits: targets its mechanical rules cannot build or feed (each listed with its reason)
    *(Known(family, "*", category, "the census's construction rules do not cover this target (see its message)")
      for family in ("transformers", "timm", "torch_geometric", "torch_nn", "peft", "diffusers", "kornia", "monai",
                     "e3nn", "torchdiffeq", "neuralop", "normflows", "vector_quantize", "x_transformers",
                     "sentence_transformers", "torchrl", "torchaudio", "tools")
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
    if outcome.category == oc.NOTHING_TO_COMPARE:
        # the replay matched, but the module's outputs under the census's inputs hold no value that
        # could be wrong (None, empty, only NaN): listed in the table, never counted bit-exact, and
        # not a failure of the rebuild either
        return True
    entry = match(outcome)
    if entry is None or wrong_value(outcome):
        return False
    return entry.kind == DEFECT or outcome.category in oc.NOT_RUN


def stale(outcomes: list[oc.Outcome], families: list[str]) -> list[Known]:
    """DEFECT entries of the given families that no outcome matches any more."""
    used = {match(o) for o in outcomes}
    return [k for k in KNOWN if k.kind == DEFECT and k.family in families and k not in used]
