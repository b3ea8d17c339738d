"""Modules made by tools (issue 34): torch.fx, ``torch.export`` (``.module()`` and ``unflatten``),
TorchScript (``script`` and ``trace``, as the target and as a child), ``torch.nn.utils.prune``,
parametrizations (``weight_norm``, ``spectral_norm``, ``orthogonal``), eager-mode quantization
(QAT and post-training, prepared and converted), torchao's ``quantize_``, accelerate's hooks and
``cpu_offload``, ``torch.compile``, and classes with their own ``__new__`` (tensordict's modules,
torchrl's actors, neuraloperator's FNO), each applied to several base modules the way its users
apply it. The base modules are this file's own (importable as ``census.families.tools:...``).

torchao lives in ``.venv/torchtune-site`` (scripts/_setup_env.sh keeps it apart from transformers),
which this family's processes put on their path.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn

from census.targets import CannotBuildError, Job, Sample, Target

EXTRA_PATH = {"capture": [".venv/torchtune-site"], "replay": [".venv/torchtune-site"]}


class MLP(nn.Module):
    def __init__(self, width: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ConvNet(nn.Module):
    def __init__(self, channels: int = 8, classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.norm = nn.BatchNorm2d(channels)
        self.act = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.act(self.norm(self.conv(x)))).flatten(1))


class Encoder(nn.Module):
    """A small attention block written with plain layers (fx and TorchScript trace it as it is)."""

    def __init__(self, width: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.mlp = MLP(width, 2 * width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attention = torch.softmax(q @ k.transpose(-1, -2) / (width // self.heads) ** 0.5, dim=-1)
        x = x + self.drop(self.out((attention @ v).transpose(1, 2).reshape(batch, length, width)))
        return x + self.mlp(x)


class Recurrent(nn.Module):
    def __init__(self, width: int = 8, hidden: int = 12) -> None:
        super().__init__()
        self.lstm = nn.LSTM(width, hidden, batch_first=True)
        self.head = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output, _state = self.lstm(x)
        return self.head(output[:, -1])


class Holder(nn.Module):
    """A model holding a block a tool made (a TorchScript child)."""

    def __init__(self, block: nn.Module, width: int) -> None:
        super().__init__()
        self.block = block
        self.scale = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x) * self.scale[: x.shape[-1]] if x.shape[-1] == self.scale.shape[0] else self.block(x)


def _input(base: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return {"mlp": lambda: torch.randn(4, 16, generator=g), "cnn": lambda: torch.randn(2, 3, 8, 8, generator=g),
            "encoder": lambda: torch.randn(2, 5, 16, generator=g),
            "recurrent": lambda: torch.randn(2, 6, 8, generator=g)}[base]()


BASES: dict[str, Callable[[], nn.Module]] = {"mlp": MLP, "cnn": ConvNet, "encoder": Encoder, "recurrent": Recurrent}
WIDTH = {"mlp": 16, "cnn": 4, "encoder": 16, "recurrent": 8}  # the last size of each base's output


def _linears(model: nn.Module, kinds: tuple[type, ...] = (nn.Linear,)) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, kinds)]


# ------------------------------------------------------------------------------------------ tools

def _fx(base: str) -> nn.Module:
    return torch.fx.symbolic_trace(BASES[base]())


def _export(base: str) -> nn.Module:
    module = torch.export.export(BASES[base](), (_input(base),)).module()
    # The census runs every target in train and then eval mode; an exported module refuses both
    # (``train``/``eval`` replaced on the instance: its graph fixed the mode at export). Without the
    # refusals it runs the same graph in both modes, as its users run it in either.
    for name in ("train", "eval"):
        vars(module).pop(name, None)
    return module


def _unflatten(base: str) -> nn.Module:
    return torch.export.unflatten(torch.export.export(BASES[base](), (_input(base),)))


def _script(base: str) -> nn.Module:
    return torch.jit.script(BASES[base]())


def _trace(base: str) -> nn.Module:
    return torch.jit.trace(BASES[base]().eval(), _input(base))


def _script_child(base: str) -> nn.Module:
    return Holder(torch.jit.script(BASES[base]()), WIDTH[base])


def _trace_child(base: str) -> nn.Module:
    return Holder(torch.jit.trace(BASES[base]().eval(), _input(base)), WIDTH[base])


def _prune(base: str) -> nn.Module:
    from torch.nn.utils import prune

    model = BASES[base]()
    for layer in _linears(model, (nn.Linear, nn.Conv2d)):
        prune.l1_unstructured(layer, "weight", amount=0.3)
    if _linears(model):
        prune.random_structured(_linears(model)[0], "weight", amount=0.25, dim=0)  # a PruningContainer
    return model


def _parametrized(kind: str) -> Callable[[str], nn.Module]:
    def build(base: str) -> nn.Module:
        from torch.nn.utils import parametrizations

        model = BASES[base]()
        apply = {"weight_norm": parametrizations.weight_norm, "spectral_norm": parametrizations.spectral_norm,
                 "orthogonal": parametrizations.orthogonal}[kind]
        for layer in _linears(model):
            apply(layer)
        return model
    return build


def _quantized(stage: str) -> Callable[[str], nn.Module]:
    """Eager-mode quantization as its tutorial runs it: a QuantWrapper, a qconfig for the x86
    backend, prepare (QAT: prepare_qat in train mode) and, for ``converted``, a calibration pass
    then convert."""
    def build(base: str) -> nn.Module:
        from torch.ao import quantization as tq

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
            model = tq.QuantWrapper(BASES[base]())
            qat = stage.startswith("qat")
            model.qconfig = tq.get_default_qat_qconfig("x86") if qat else tq.get_default_qconfig("x86")
            if qat:
                model.train()
                tq.prepare_qat(model, inplace=True)
            else:
                model.eval()
                tq.prepare(model, inplace=True)
            if stage.endswith("converted"):
                with torch.no_grad():
                    model(_input(base))  # calibration
                model.eval()
                tq.convert(model, inplace=True)
        return model
    return build


def _torchao(config: str) -> Callable[[str], nn.Module]:
    def build(base: str) -> nn.Module:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from torchao import quantization as q
        except Exception as error:
            raise CannotBuildError(f"torchao does not import: {type(error).__name__}: {error}") from error
        model = BASES[base]()
        configs = {"int8_weight_only": lambda: q.Int8WeightOnlyConfig(version=1),
                   "int8_weight_only_v2": lambda: q.Int8WeightOnlyConfig(version=2),
                   "int8_dynamic": lambda: q.Int8DynamicActivationInt8WeightConfig()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q.quantize_(model, configs[config]())
        return model
    return build


try:
    from accelerate.hooks import ModelHook
except ImportError:  # the accelerate targets then report that they cannot be built
    ModelHook = object


class ScaleHook(ModelHook):  # type: ignore[misc, valid-type]
    """An accelerate ``ModelHook`` scaling a module's output (as users write their own hooks)."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def post_forward(self, module: nn.Module, output: torch.Tensor) -> torch.Tensor:
        return output * self.factor


def _accelerate_hook(base: str) -> nn.Module:
    from accelerate.hooks import add_hook_to_module

    model = BASES[base]()
    add_hook_to_module(_linears(model)[-1], ScaleHook(0.5))
    return model


def _cpu_offload(base: str) -> nn.Module:
    from accelerate import cpu_offload

    return cpu_offload(BASES[base](), execution_device=torch.device("cpu"))


def _compiled(base: str) -> nn.Module:
    return torch.compile(BASES[base]())


TOOLS: dict[str, tuple[Callable[[str], nn.Module], list[str]]] = {
    "fx": (_fx, ["mlp", "cnn", "encoder"]),
    "export": (_export, ["mlp", "cnn", "encoder"]),
    "unflatten": (_unflatten, ["mlp", "cnn"]),
    "script": (_script, ["mlp", "cnn", "recurrent"]),
    "script_child": (_script_child, ["mlp", "encoder"]),
    "trace": (_trace, ["mlp", "cnn", "encoder"]),
    "trace_child": (_trace_child, ["mlp", "recurrent"]),
    "prune": (_prune, ["mlp", "cnn"]),
    "weight_norm": (_parametrized("weight_norm"), ["mlp", "encoder"]),
    "spectral_norm": (_parametrized("spectral_norm"), ["mlp", "encoder"]),
    "orthogonal": (_parametrized("orthogonal"), ["mlp"]),
    "qat_prepared": (_quantized("qat_prepared"), ["mlp", "cnn"]),
    "qat_converted": (_quantized("qat_converted"), ["mlp", "cnn"]),
    "ptq_prepared": (_quantized("ptq_prepared"), ["mlp", "cnn"]),
    "ptq_converted": (_quantized("ptq_converted"), ["mlp", "cnn"]),
    "torchao_int8_weight_only": (_torchao("int8_weight_only"), ["mlp", "encoder"]),
    "torchao_int8_weight_only_v2": (_torchao("int8_weight_only_v2"), ["mlp", "encoder"]),
    "torchao_int8_dynamic": (_torchao("int8_dynamic"), ["mlp"]),
    "accelerate_hook": (_accelerate_hook, ["mlp", "encoder"]),
    "cpu_offload": (_cpu_offload, ["mlp", "cnn", "encoder"]),
    "compile": (_compiled, ["mlp", "cnn"]),
}


# --------------------------------------------------------------------- classes with their own __new__

def _tensordict_module() -> nn.Module:
    from tensordict.nn import TensorDictModule

    return TensorDictModule(MLP(), in_keys=["x"], out_keys=["y"])


def _tensordict_sequential() -> nn.Module:
    from tensordict.nn import TensorDictModule, TensorDictSequential

    return TensorDictSequential(TensorDictModule(MLP(), in_keys=["x"], out_keys=["h"]),
                                TensorDictModule(nn.Linear(16, 4), in_keys=["h"], out_keys=["y"]))


def _torchrl_actor() -> nn.Module:
    from tensordict.nn import NormalParamExtractor, TensorDictModule
    from torchrl.modules import MLP as RLMLP
    from torchrl.modules import ProbabilisticActor, TanhNormal

    net = nn.Sequential(RLMLP(in_features=16, out_features=8, num_cells=[32]), NormalParamExtractor())
    return ProbabilisticActor(TensorDictModule(net, in_keys=["x"], out_keys=["loc", "scale"]),
                              in_keys=["loc", "scale"], distribution_class=TanhNormal, return_log_prob=True)


def _fno() -> nn.Module:
    from neuralop.models import FNO

    return FNO(n_modes=(4, 4), hidden_channels=8, in_channels=1, out_channels=1, n_layers=2)


def _tensordict_job(model: nn.Module) -> Job:
    from tensordict import TensorDict

    data = TensorDict({"x": torch.randn(4, 16, generator=torch.Generator().manual_seed(5))}, batch_size=[4])
    return lambda m: m(data.clone())


def _fno_job(model: nn.Module) -> Job:
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(5))
    return lambda m: m(x)


OWN_NEW: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], Job]]] = {
    "own_new:tensordict_module": (_tensordict_module, _tensordict_job),
    "own_new:tensordict_sequential": (_tensordict_sequential, _tensordict_job),
    "own_new:torchrl_actor": (_torchrl_actor, _tensordict_job),
    "own_new:neuraloperator_fno": (_fno, _fno_job),
}


def _tool_target(tool: str, base: str) -> Target:
    build, _bases = TOOLS[tool]

    def job(_model: nn.Module) -> Job:
        x = _input(base)
        return lambda m: m(x)

    def submodules(model: nn.Module) -> dict[str, str]:
        return {"model": "", "block": "block"} if tool.endswith("_child") else {"model": ""}

    return Target(f"{tool}:{base}", lambda: build(base), job, submodules=submodules)


# left out of the quick sample of every test run: inductor compiles for tens of CPU seconds
SLOW = ("compile:",)


def targets(sample: Sample) -> list[Target]:
    names = [f"{tool}:{base}" for tool, (_build, bases) in TOOLS.items() for base in bases] + list(OWN_NEW)
    if sample.quick and not sample.only:
        names = [n for n in names if not n.startswith(SLOW)]
    chosen = sample.pick(names, str, quick_count=6)
    found = []
    for name in chosen:
        if name in OWN_NEW:
            build, job = OWN_NEW[name]
            found.append(Target(name, build, job, submodules=lambda _m: {"model": ""}))
        else:
            tool, _, base = name.partition(":")
            found.append(_tool_target(tool, base))
    return found

