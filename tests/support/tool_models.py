"""Modules made by tools and classes with their own ``__new__`` (issue 34, defects 2-3), each built
and run the way its users do: torch.fx, ``torch.export`` (``.module()`` and ``unflatten``),
TorchScript (scripted and traced, as the target and as a child), ``torch.nn.utils.prune``,
parametrizations, eager-mode QAT, torchao's ``quantize_``, accelerate's ``add_hook_to_module`` and
``cpu_offload``, ``torch.compile`` (inductor), tensordict's modules, a torchrl actor and
neuraloperator's FNO, and blocks built with a closure argument.

``python tool_models.py REPO SCENARIO...`` captures the scenarios into REPO and prints
``{"refs": {label: ref}, "warnings": {label: [capture warnings]}}`` (a fresh process: torchao's
folder is on its path only there; tests/restore/test_tool_modules.py replays them in another).
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

try:
    from accelerate.hooks import ModelHook
except ImportError:  # the accelerate scenarios then fail to build, naming it
    ModelHook = object


class MLP(nn.Module):
    def __init__(self, width: int = 8, hidden: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ConvBlock(nn.Module):
    """Conv, BatchNorm (its train/eval branches) and dropout: what traced and compiled code changes."""

    def __init__(self, channels: int = 6) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.norm = nn.BatchNorm2d(channels)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(channels, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(torch.relu(self.norm(self.conv(x)))).mean((2, 3)))


class Holder(nn.Module):
    """A model holding a block a tool made (a TorchScript child)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.block(x))


class Shift(ModelHook):  # type: ignore[misc, valid-type]
    """An accelerate hook as users write one: it changes the module's output."""

    def __init__(self, shift: float) -> None:
        self.shift = shift

    def post_forward(self, module: nn.Module, output: torch.Tensor) -> torch.Tensor:
        return output + self.shift


def gain_layer(gain: float) -> Callable[[int], nn.Module]:
    """An activation factory made inside a function (a closure), as timm's NFNet passes ``act_layer``."""
    def create(width: int) -> nn.Module:
        return Gain(width, gain)
    return create


class Gain(nn.Module):
    def __init__(self, width: int, gain: float) -> None:
        super().__init__()
        self.gain = gain
        self.scale = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * self.scale * self.gain


class GatedBlock(nn.Module):
    """A block built with a closure argument: no recorded argument stores it, its attributes do."""

    def __init__(self, width: int, act_layer: Callable[[int], nn.Module]) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = act_layer(width)
        self.alpha = 0.5
        self.register_buffer("offset", torch.full((width,), 0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.alpha * self.act(self.fc(x)) + self.offset


def mlp_input() -> torch.Tensor:
    return torch.randn(4, 8)


def conv_input() -> torch.Tensor:
    return torch.randn(2, 3, 6, 6)


@dataclass
class Scenario:
    name: str
    build: Callable[[], nn.Module]
    targets: dict[str, str]  # label -> target pattern ("" is the model)
    drive: Callable[[nn.Module], Any]


def _train_steps(make_input: Callable[[], torch.Tensor]) -> Callable[[nn.Module], None]:
    def drive(model: nn.Module) -> None:
        model.train()
        for _ in range(2):
            model(make_input()).sum().backward()
    return drive


def _eval_then_train(make_input: Callable[[], torch.Tensor]) -> Callable[[nn.Module], None]:
    def drive(model: nn.Module) -> None:
        with torch.no_grad():
            model.eval()
            model(make_input())
            model.train()
            model(make_input())
    return drive


def _export() -> nn.Module:
    module = torch.export.export(MLP(), (mlp_input(),)).module()
    return module


def _run_exported(model: nn.Module) -> None:  # an exported module refuses train()/eval(): run as it is
    with torch.no_grad():
        for _ in range(2):
            model(mlp_input())


def _unflatten() -> nn.Module:
    return torch.export.unflatten(torch.export.export(MLP(), (mlp_input(),)))


def _pruned() -> nn.Module:
    from torch.nn.utils import prune

    model = MLP()
    prune.l1_unstructured(model.fc1, "weight", amount=0.4)
    prune.random_structured(model.fc2, "weight", amount=0.25, dim=0)
    prune.l1_unstructured(model.fc2, "weight", amount=0.2)  # pruned twice: a PruningContainer
    return model


def _parametrized() -> nn.Module:
    model = MLP()
    nn.utils.parametrizations.orthogonal(model.fc1)
    nn.utils.parametrizations.spectral_norm(model.fc2)
    return model


def _qat() -> nn.Module:
    from torch.ao import quantization as tq

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        model = tq.QuantWrapper(MLP())
        model.qconfig = tq.get_default_qat_qconfig("x86")
        model.train()
        tq.prepare_qat(model, inplace=True)
    return model


def _torchao() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        model = MLP()
        quantize_(model, Int8WeightOnlyConfig(version=1))
    return model


def _run_no_grad(make_input: Callable[[], torch.Tensor]) -> Callable[[nn.Module], None]:
    def drive(model: nn.Module) -> None:
        with torch.no_grad():
            for _ in range(2):
                model(make_input())
    return drive


def _accelerate_hook() -> nn.Module:
    from accelerate.hooks import add_hook_to_module

    model = MLP()
    add_hook_to_module(model.fc2, Shift(1.32))
    return model


def _forward_replaced() -> nn.Module:
    model = MLP()
    original = model.fc2.forward
    model.fc2.forward = lambda x: original(x) + 1.32  # a monkeypatch no record can rebuild
    return model


def _cpu_offload() -> nn.Module:
    from accelerate import cpu_offload

    return cpu_offload(MLP(), execution_device=torch.device("cpu"))


def _tensordict_sequential() -> nn.Module:
    from tensordict.nn import TensorDictModule, TensorDictSequential

    return TensorDictSequential(TensorDictModule(MLP(), in_keys=["x"], out_keys=["h"]),
                                TensorDictModule(nn.Linear(8, 3), in_keys=["h"], out_keys=["y"]))


def _torchrl_actor() -> nn.Module:
    from tensordict.nn import NormalParamExtractor, TensorDictModule
    from torchrl.modules import MLP as RLMLP
    from torchrl.modules import ProbabilisticActor, TanhNormal

    net = nn.Sequential(RLMLP(in_features=8, out_features=4, num_cells=[16]), NormalParamExtractor())
    return ProbabilisticActor(TensorDictModule(net, in_keys=["x"], out_keys=["loc", "scale"]),
                              in_keys=["loc", "scale"], distribution_class=TanhNormal, return_log_prob=True)


def _run_tensordict(model: nn.Module) -> None:
    from tensordict import TensorDict

    for _ in range(2):
        model(TensorDict({"x": mlp_input()}, batch_size=[4]))


def _fno() -> nn.Module:
    from neuralop.models import FNO

    return FNO(n_modes=(4, 4), hidden_channels=8, in_channels=1, out_channels=1, n_layers=2)


SCENARIOS = {s.name: s for s in [
    Scenario("fx", lambda: torch.fx.symbolic_trace(MLP()), {"fx": ""}, _train_steps(mlp_input)),
    Scenario("export", _export, {"export": ""}, _run_exported),
    Scenario("unflatten", _unflatten, {"unflatten": ""}, _run_exported),
    Scenario("script", lambda: torch.jit.script(ConvBlock()), {"script": ""}, _eval_then_train(conv_input)),
    Scenario("script_child", lambda: Holder(torch.jit.script(MLP())), {"script_child": "", "script_child.block": "block"},
             _train_steps(mlp_input)),
    Scenario("trace", lambda: torch.jit.trace(ConvBlock().eval(), conv_input()), {"trace": ""},
             _eval_then_train(conv_input)),
    Scenario("prune", _pruned, {"prune": "", "prune.fc2": "fc2"}, _train_steps(mlp_input)),
    Scenario("parametrize", _parametrized, {"parametrize": ""}, _train_steps(mlp_input)),
    Scenario("qat", _qat, {"qat": ""}, _train_steps(mlp_input)),
    Scenario("torchao", _torchao, {"torchao": "", "torchao.fc1": "fc1"}, _run_no_grad(mlp_input)),
    Scenario("accelerate_hook", _accelerate_hook, {"accelerate_hook": "", "accelerate_hook.fc2": "fc2"},
             _train_steps(mlp_input)),
    Scenario("forward_replaced", _forward_replaced, {"forward_replaced": ""}, _train_steps(mlp_input)),
    Scenario("cpu_offload", _cpu_offload, {"cpu_offload": "", "cpu_offload.fc1": "fc1"}, _run_no_grad(mlp_input)),
    Scenario("compile", lambda: torch.compile(ConvBlock()), {"compile": ""}, _eval_then_train(conv_input)),
    Scenario("tensordict", _tensordict_sequential, {"tensordict": ""}, _run_tensordict),
    Scenario("torchrl_actor", _torchrl_actor, {"torchrl_actor": ""}, _run_tensordict),
    Scenario("fno", _fno, {"fno": ""}, _run_no_grad(lambda: torch.randn(2, 1, 8, 8))),
    Scenario("closure", lambda: nn.Sequential(*[GatedBlock(8, gain_layer(2.0)) for _ in range(2)]),
             {"closure": "", "closure.block": "1"}, _train_steps(mlp_input)),
]}


def capture(repo: str, names: list[str]) -> dict[str, Any]:
    import modulelens

    refs: dict[str, str] = {}
    caught: dict[str, list[str]] = {}
    modulelens.track_init()
    for name in names:
        scenario = SCENARIOS[name]
        torch.manual_seed(0)
        model = scenario.build()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with modulelens.capture(model, targets=list(scenario.targets.values()), repo=repo, name=f"tools/{name}",
                                    record=modulelens.Recording(max_calls=2)) as cap:
                scenario.drive(model)
        caught[name] = [str(w.message) for w in seen if issubclass(w.category, modulelens.CaptureWarning)]
        saved = {info.name.removeprefix(f"tools/{name}").lstrip("/"): info.ref for info in cap.saved}
        for label, pattern in scenario.targets.items():
            if pattern in saved:
                refs[label] = saved[pattern]
    return {"refs": refs, "warnings": caught}


if __name__ == "__main__":
    import tool_models  # the classes by their importable path, not __main__'s

    print(json.dumps(tool_models.capture(sys.argv[1], sys.argv[2:])))
