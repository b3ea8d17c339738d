"""Every constructible ``torch.nn`` module class.

The classes are every ``nn.Module`` subclass that ``torch.nn`` exports from ``torch.nn.modules``.
Constructor arguments come from the signature: each required argument takes its value from
``TYPICAL`` by name (a class whose required argument has no entry there is reported as not
built, with the argument's name); optional arguments keep their defaults. Inputs are found by
trying ``CANDIDATES`` in order (one, two or three small tensors; see ``_candidates``) and keeping
the first the module accepts; every size is 4 so shapes agree across classes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.construct import Inputs, arguments, first_accepted
from census.targets import CannotBuildError, Job, Sample, Target

F = 4  # every feature / channel / embedding size

# constructor arguments by name, for required arguments (and a few optional ones left None by default)
TYPICAL: dict[str, Any] = {
    "in_features": F, "out_features": 6, "in1_features": F, "in2_features": F, "in_channels": F, "out_channels": 6,
    "num_features": F, "normalized_shape": F, "num_groups": 2, "num_channels": F, "embed_dim": F, "num_heads": 2,
    "d_model": F, "nhead": 2, "input_size": F, "hidden_size": 6, "kernel_size": 2, "output_size": 2,
    "num_embeddings": 10, "embedding_dim": F, "dim": 1, "size": 4, "upscale_factor": 2, "downscale_factor": 2,
    "padding": 1, "n_classes": 12, "cutoffs": [4, 8], "groups": 2, "unflattened_size": (2, 2), "lambd": 0.5,
    "alpha": 1e-4, "beta": 0.75, "k": 1.0, "num_layers": 1, "value": 0.0, "shape": (F,), "min_val": -1.0, "max_val": 1.0,
    "threshold": 0.1, "scale_factor": 2, "norm_type": 2.0, "num_classes": 6,
}
# classes whose signature names no sizes (``*args``) or whose sizes are all optional and large by default
CLASS_ARGUMENTS: dict[str, dict[str, Any]] = {
    "RNN": {"input_size": F, "hidden_size": 6}, "LSTM": {"input_size": F, "hidden_size": 6},
    "GRU": {"input_size": F, "hidden_size": 6},
    "Transformer": {"d_model": F, "nhead": 2, "num_encoder_layers": 1, "num_decoder_layers": 1, "dim_feedforward": 8},
    "FractionalMaxPool2d": {"kernel_size": 2, "output_ratio": 0.5},
    "FractionalMaxPool3d": {"kernel_size": 2, "output_ratio": 0.5},
}
# module-valued required arguments (built from the same table)
MODULE_ARGUMENTS: dict[str, Callable[[], nn.Module]] = {
    "encoder_layer": lambda: nn.TransformerEncoderLayer(F, 2, 8),
    "decoder_layer": lambda: nn.TransformerDecoderLayer(F, 2, 8),
}
def _unpool_inputs(dims: int) -> Inputs:
    """MaxUnpool takes what MaxPool(kernel_size=2, return_indices=True) returned."""
    def make() -> tuple[torch.Tensor, ...]:
        x = torch.rand(2, F, *([4] * dims), generator=torch.Generator().manual_seed(6))
        pool = (nn.functional.max_pool1d, nn.functional.max_pool2d, nn.functional.max_pool3d)[dims - 1]
        return tuple(pool(x, 2, return_indices=True))
    return make


SPECIAL_INPUTS: dict[str, list[Inputs]] = {
    # Fold(output_size=2, kernel_size=2) takes (N, C*k*k, blocks) with one block
    "Fold": [lambda: (torch.rand(2, F, 1),)],
    # CTCLoss(log_probs (T, N, C), targets (N, S), input_lengths (N,), target_lengths (N,))
    "CTCLoss": [lambda: (torch.randn(5, 2, F, generator=torch.Generator().manual_seed(7)).log_softmax(2),
                         torch.randint(1, F, (2, 3), generator=torch.Generator().manual_seed(8)),
                         torch.tensor([5, 5]), torch.tensor([3, 2]))],
    "MaxUnpool1d": [_unpool_inputs(1)], "MaxUnpool2d": [_unpool_inputs(2)], "MaxUnpool3d": [_unpool_inputs(3)],
}
NOT_TARGETS = {
    "Module": "the base class (no forward)",
    "Container": "deprecated alias of Sequential",
    "Sequential": "a container of other modules (exercised by every model in the census)",
    "ModuleList": "a container without forward", "ModuleDict": "a container without forward",
    "ParameterList": "a container without forward", "ParameterDict": "a container without forward",
    "RNNBase": "a base class (RNN, LSTM, GRU are the targets)",
    "RNNCellBase": "a base class (RNNCell, LSTMCell, GRUCell are the targets)",
}


def _classes() -> list[type[nn.Module]]:
    found = []
    for name in sorted(dir(nn)):
        obj = getattr(nn, name)
        if inspect.isclass(obj) and issubclass(obj, nn.Module) and obj.__module__.startswith("torch.nn.modules"):
            found.append(obj)
    return found


def _arguments(cls: type[nn.Module]) -> dict[str, Any]:
    given = dict(CLASS_ARGUMENTS.get(cls.__name__, {}))
    parameters = inspect.signature(cls.__init__).parameters
    if parameters.get("scale_factor") is not None and parameters["scale_factor"].default is None:
        given.setdefault("scale_factor", TYPICAL["scale_factor"])  # Upsample*: size or scale_factor must be given
    return arguments(cls, TYPICAL, MODULE_ARGUMENTS, given, "census/families/torch_nn.py TYPICAL")


def _build(cls: type[nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        if cls.__name__ in NOT_TARGETS:
            raise CannotBuildError(f"not a target: {NOT_TARGETS[cls.__name__]}")
        return cls(**_arguments(cls))
    return build


def _candidates(name: str) -> list[Inputs]:
    g = torch.Generator().manual_seed(5)

    def rand(*shape: int) -> Callable[[], torch.Tensor]:
        return lambda: torch.rand(*shape, generator=g)

    def ids(high: int, *shape: int) -> Callable[[], torch.Tensor]:
        return lambda: torch.randint(0, high, shape, generator=g)

    def tensors(*makers: Callable[[], torch.Tensor]) -> Inputs:
        return lambda: tuple(make() for make in makers)

    singles = [rand(2, F), rand(2, 3, F), rand(2, F, 6), rand(2, F, 6, 6), rand(2, F, 6, 6, 6), ids(10, 2, 5), rand(F)]
    candidates = [*SPECIAL_INPUTS.get(name, ())]
    candidates += [tensors(s) for s in singles]
    candidates += [tensors(rand(2, F), rand(2, F)), tensors(rand(2, F), ids(F, 2)), tensors(rand(2, 3, F), rand(2, 3, F)),
                   tensors(rand(2, F, 6, 6), rand(2, F, 6, 6)), tensors(rand(2, F), ids(F, 2, F))]
    candidates += [tensors(rand(2, 3, F), rand(2, 3, F), rand(2, 3, F)), tensors(rand(2, F), rand(2, F), rand(2, F)),
                   tensors(rand(2), rand(2), rand(2)), tensors(rand(2, F), rand(2, F), rand(2))]
    return candidates


def _job(name: str) -> Callable[[nn.Module], Job]:
    return lambda model: first_accepted(model, _candidates(name))


def targets(sample: Sample) -> list[Target]:
    classes = sample.pick(_classes(), lambda c: c.__name__, quick_count=6)
    return [Target(cls.__name__, _build(cls), _job(cls.__name__), submodules=lambda _m: {"model": ""})
            for cls in classes]
