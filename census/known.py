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
_ISSUE34 = "issue 34 defect"

KNOWN: list[Known] = [
    # modulelens defects the whole census of 2026-12-01 found after the issue 22 fixes (the defects listed
    # here before, diffusers BaseOutput, torchrec KeyedTensor, peft adapters and prompt/prefix tuning, Lazy*
    # modules, NLLLoss2d, are fixed and replay bit-exact).
    Known("timm", "dm_nfnet_f0", "load", f"{_NEW}: timm's NFNet stages are built "
          "with act_layer=act_with_gamma(...), a function made inside another (a closure), which has no import "
          "path; the stage block cannot be rebuilt from its recorded arguments (the whole model can)", DEFECT,
          "cannot be referenced by import path"),
    # issue 34's library families (2026-12-06): open defects of issue 34's items 1-5 (a rebuild under the meta
    # device, classes with their own __new__, tool-made modules, values without a codec) and two more found here;
    # each entry goes stale, and the whole census exits 1, once its fix lands
    *(Known(family, target, oc.REPLAY_FAIL, f"{_ISSUE34} 1: a tensor the constructor makes (not a parameter or "
            "buffer) stays on the meta device after the rebuild", DEFECT, "Cannot copy out of meta tensor")
      for family, target in (("kornia", "augmentation.RandomMotionBlur*"), ("kornia", "feature.ScaleSpaceDetector"))),
    *(Known("e3nn", target, oc.LOAD, f"{_ISSUE34} 1: e3nn's constructors compute (Clebsch-Gordan tables, "
            "lru_cache'd; .item() on sizes) under the meta device the rebuild runs them in", DEFECT, expect)
      for target, expect in (("o3.ElementwiseTensorProduct", "Tensor.item() cannot be called on meta tensors"),
                             ("o3.ReducedTensorProducts", "Tensor.item() cannot be called on meta tensors"),
                             ("o3.FullTensorProduct*", "is not on the expected device meta"),
                             ("o3.TensorSquare", "is not on the expected device meta"))),
    Known("e3nn", "o3.Legendre", oc.LOAD, f"{_ISSUE34} 3: e3nn's Legendre is a torch.fx GraphModule (generated "
          "class, fx's own __new__): no construction record", DEFECT, "GraphModuleImpl: the module was built before"),
    *(Known("neuralop", target, oc.LOAD, f"{_ISSUE34} 2: neuralop's BaseModel has its own __new__ (it records the "
            "init arguments), so the model gets no construction record", DEFECT,
            "the module was built before modulelens.track_init() was on") for target in ("FNO", "TFNO", "UQNO", "GINO")),
    Known("torchrl", "*", oc.LOAD, f"{_ISSUE34} 2: tensordict's TensorDictModuleBase (every TensorDict module: "
          "torchrl's actors, value operators, Q-value and MCTS modules, TensorDictSequential) has its own __new__, "
          "so the module gets no construction record", DEFECT, "the module was built before modulelens.track_init() was on"),
    Known("torchrl", "modules.MultiAgent*", oc.LOAD, f"{_NEW}: torchrl's multi-agent nets stack their agents' "
          "parameters into a TensorDictParams after construction, and a TensorDict has no codec, so that piece "
          "cannot be rebuilt", DEFECT, "cannot store a value of type tensordict._td.TensorDict"),
    Known("neuralop", "layers.SpectralConv*", oc.REPLAY_FAIL, f"{_NEW}: restore/rebuild.py's "
          "assign_state(live=True) copies each recorded parameter into owner.get_parameter(leaf), which reads it "
          "with getattr; tltorch's ComplexDenseTensor (the weights of neuralop's legacy SpectralConv) has a "
          "'tensor' property returning a complex view of its 'tensor' parameter, so get_parameter refuses it "
          "(owner._parameters[leaf] is the parameter)", DEFECT, "`tensor` is not an nn.Parameter"),
    *(Known("sentence_transformers", target, oc.REPLAY_FAIL, f"{_ISSUE34} 4: transformers' BatchEncoding (what a "
            "tokenizer returns, and what encode() and predict() pass to the model) has no codec", DEFECT,
            "(transformers.tokenization_utils_base.BatchEncoding), which was not recorded")
      for target in ("SentenceTransformer", "CrossEncoder")),
    *(Known(family, target, oc.LOAD, f"{_NEW}: a constructor argument of the "
            f"library's own type has no codec ({kind}), so the module cannot be rebuilt from its recorded "
            "arguments", DEFECT, f"cannot store a value of type {kind}")
      for family, target, kind in (
          ("kornia", "color.ApplyColorMap", "kornia.color.colormap.ColorMap"),
          ("sentence_transformers", "models.WordEmbeddings",
           "sentence_transformers.sentence_transformer.modules.tokenizer.whitespace.WhitespaceTokenizer"))),
    # the census's own limits: targets its mechanical rules cannot build or feed (each listed with its reason)
    *(Known(family, "*", category, "the census's construction rules do not cover this target (see its message)")
      for family in ("transformers", "timm", "torch_geometric", "torch_nn", "peft", "diffusers", "kornia", "monai",
                     "e3nn", "torchdiffeq", "neuralop", "normflows", "vector_quantize", "x_transformers",
                     "sentence_transformers", "torchrl", "torchaudio")
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
