"""TorchRL and TensorDict: every module class of ``torchrl.modules`` and ``tensordict.nn``
(reinforcement-learning networks, policies and value operators, TensorDict modules).

Constructor arguments come from the signature by name (``TYPICAL``: observations of width 4,
2-dimensional actions, 8 hidden units, two agents; ``FACTORIES``: a small MLP as the wrapped
network, a bounded action spec, TensorDict operators for the wrappers), the libraries' defaults
otherwise. Inputs: the first of ``_candidates`` a module accepts: a ``TensorDict`` of a batch of 2
observations (TensorDict modules read and write keys), a batch of observations, pixels, a
sequence, per-agent observations. Captured: the module and, by rule, its first repeated block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.construct import Inputs, construct, exported, first_accepted
from census.targets import CannotBuildError, Job, Sample, Target

OBS, ACT, HIDDEN, AGENTS, B = 4, 2, 8, 2, 2


def _mlp(width_in: int = OBS, width_out: int = ACT) -> nn.Module:
    return nn.Sequential(nn.Linear(width_in, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, width_out))


def _spec() -> Any:
    from torchrl.data import Bounded

    return Bounded(-1.0, 1.0, shape=(ACT,))


def _operator(out_key: str = "action", width_out: int = ACT) -> nn.Module:
    from tensordict.nn import TensorDictModule

    return TensorDictModule(_mlp(OBS, width_out), in_keys=["observation"], out_keys=[out_key])


TYPICAL: dict[str, Any] = {
    "in_features": OBS, "out_features": ACT, "num_features": OBS, "action_dim": ACT, "state_dim": OBS,
    "input_size": OBS, "hidden_size": HIDDEN, "n_agents": AGENTS, "n_agent_inputs": OBS, "n_agent_outputs": ACT,
    "in_keys": ["observation"], "out_keys": ["action"], "p": 0.1, "seed": 0, "c": 1.0, "num_copies": 2,
    "input_dim": OBS, "output_dim": ACT, "max_action": 1.0, "obs_dim": OBS, "chunk_size": 2, "bias": 1.0,
    "mixing_embed_dim": 4, "state_shape": (OBS,), "device": "cpu", "support": torch.linspace(-1, 1, 5),
    "action_space": "one-hot", "group_map": {"agents": ["agent_0", "agent_1"]},
}
FACTORIES: dict[str, Callable[[], Any]] = {
    "module": _mlp, "spec": _spec, "action_spec": _spec, "operator": _mlp,
    "policy": _operator, "policy_operator": _operator, "actor": _operator, "td_module": _operator,
    "value_operator": lambda: _operator("state_value", 1), "common_operator": lambda: _operator("hidden", OBS),
}
# optional arguments without which a class refuses to build (MLP: an output width; the multi-agent nets: whether
# they are centralized; the recurrent modules: their sizes and keys; Q-value actors: an action space)
SIZES: dict[str, Any] = {"out_features": ACT, "centralized": False, "share_params": False, "input_size": OBS,
                         "hidden_size": HIDDEN, "in_key": "observation", "out_key": "hidden", "action_space": "one-hot"}
# per class: what its wrapped module must be (a TensorDict module writing the key the class reads)
GIVEN: dict[str, dict[str, Callable[[], Any]]] = {
    "modules.ProbabilisticActor": {"module": lambda: _operator("param"), "in_keys": lambda: ["param"]},
    "modules.QValueActor": {"in_keys": lambda: ["observation"]},
    "modules.VmapModule": {"module": _operator}, "modules.DreamerV3SeededPolicy": {"module": _operator},
    "nn.EnsembleModule": {"module": _operator},
}
NOT_TARGETS = {
    "CEMPlanner": "plans by rolling out an environment (needs an env)", "MPPIPlanner": "needs an environment",
    "MPCPlannerBase": "a base class", "TensorDictModuleBase": "a base class", "TensorClassModuleBase": "a base class",
    "MultiAgentNetBase": "a base class", "VLAWrapperBase": "a base class",
    "LMHeadActorValueOperator": "wraps a pretrained language model head", "TinyVLA": "a vision-language-action "
    "model over a pretrained backbone", "LeRobotPolicyWrapper": "wraps a LeRobot policy (another library)",
    "DecisionTransformer": "builds a transformers GPT-2 (the transformers family covers it)",
}


def _classes() -> dict[str, type[nn.Module]]:
    return exported(["torchrl.modules", "tensordict.nn"])


def _build(key: str, cls: type[nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        name = key.rsplit(".", 1)[-1]
        if name in NOT_TARGETS:
            raise CannotBuildError(f"not a target: {NOT_TARGETS[name]}")
        given = {argument: make() for argument, make in GIVEN.get(key, {}).items()}
        return construct(cls, TYPICAL, FACTORIES, given, SIZES, "census/families/torchrl.py TYPICAL")
    return build


def _candidates() -> list[Inputs]:
    from tensordict import TensorDict

    def g() -> torch.Generator:
        return torch.Generator().manual_seed(20)

    def observations() -> TensorDict:
        return TensorDict({"observation": torch.randn(B, OBS, generator=g())}, batch_size=[B])

    return [lambda: (observations(),), lambda: (torch.randn(B, OBS, generator=g()),),
            lambda: (torch.rand(B, 3, 32, 32, generator=g()),), lambda: (torch.randn(B, 5, OBS, generator=g()),),
            lambda: (torch.randn(B, AGENTS, OBS, generator=g()),), lambda: (torch.randn(B, OBS, generator=g()),
                                                                          torch.randn(B, ACT, generator=g())),
            lambda: (torch.randn(B, 2 * ACT, generator=g()),), lambda: (torch.randn(B, ACT, generator=g()),)]


def _job(model: nn.Module) -> Job:
    return first_accepted(model, _candidates())


def targets(sample: Sample) -> list[Target]:
    classes = _classes()
    keys = sample.pick(list(classes), str, quick_count=2)
    return [Target(key, _build(key, classes[key]), _job) for key in keys]
