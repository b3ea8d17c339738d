"""Every layer of ``torch_geometric.nn`` with a default constructor path.

The classes are the ``nn.Module`` subclasses listed in ``__all__`` of ``torch_geometric.nn``'s
sub-packages (``SUBPACKAGES``: convolutions, norms, aggregations, pooling, dense layers, models,
attention, KGE, encodings). Required constructor arguments come from ``TYPICAL`` by name, module-
valued ones from ``FACTORIES`` (census/construct.py); inputs are the first of ``_candidates``
(graph-shaped: node features ``x`` of 6 nodes x 4 channels, a 10-edge ``edge_index``, edge
attributes or weights, a batch vector, positions; dense batches; KGE triples) the layer accepts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.construct import Inputs, arguments, first_accepted
from census.targets import Job, Sample, Target

SUBPACKAGES = ["conv", "norm", "aggr", "pool", "dense", "models", "attention", "kge", "encoding"]
N, C, E = 6, 4, 10  # nodes, channels, edges
TYPICAL: dict[str, Any] = {
    "in_channels": C, "out_channels": 6, "hidden_channels": 8, "num_layers": 2, "channels": C, "heads": 2, "K": 2,
    "num_nodes": N, "num_relations": 2, "kernel_size": 2, "dim": 3, "num_edge_types": 2, "num_node_types": 2,
    "in_dim": C, "out_dim": 6, "hidden_dim": 8, "num_heads": 2, "edge_dim": C, "ratio": 0.5, "k": 2, "num_bases": 2,
    "out_features": 6, "in_features": C, "num_clusters": 2, "max_num_elements": 4, "num_features": C,
    "input_dim": C, "output_dim": 6, "embedding_dim": C, "num_embeddings": N, "num_layers_per_block": 1,
    "num_stacks": 1, "num_blocks": 1, "hidden_dim_multiplier": 2, "num_classes": 3, "walk_length": 2,
    "context_size": 2, "edge_index": torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]]),
    "aggr": "add", "size": 2, "gamma": 1.0, "alpha": 0.1, "num_gaussians": 4, "cutoff": 5.0,
    "metadata": (["a"], [("a", "to", "a")]), "num_timesteps": 1, "channel_list": [C, 8, 6], "in_edge_channels": C,
    "num_types": 2, "num_rels": 2, "processing_steps": 2, "depth": 2, "groups": 2, "mode": "cat", "patch_size": 2,
    "space_dimensions": 3, "filter_size": 4, "dim_emb": C, "int_emb_size": C, "hidden_node_channels": C,
    "aggregators": ["mean", "max"], "aggrs": ["mean", "max"], "first_aggr": "mean", "num_correction_layers": 1,
    "num_bilinear": 2, "raw_msg_dim": C, "num_groups": 2,
}
FACTORIES: dict[str, Callable[[], Any]] = {
    "nn": lambda: nn.Sequential(nn.Linear(C, 8), nn.ReLU(), nn.Linear(8, 6)),
    "local_nn": lambda: nn.Sequential(nn.Linear(C + 3, 6)),
    "global_nn": lambda: nn.Sequential(nn.Linear(6, 6)),
    "gate_nn": lambda: nn.Linear(C, 1),
    "conv": lambda: _gcn(),
    "encoder": lambda: _gcn(),
    "model": lambda: nn.Linear(C, 6),
}


def _gcn() -> nn.Module:
    from torch_geometric.nn import GCNConv

    return GCNConv(C, C)


def _classes() -> list[type[nn.Module]]:
    import torch_geometric.nn as pyg

    found: dict[str, type[nn.Module]] = {}
    for sub in SUBPACKAGES:
        module = getattr(pyg, sub, None)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name, None)
            if inspect.isclass(obj) and issubclass(obj, nn.Module) and not inspect.isabstract(obj):
                found.setdefault(f"{sub}.{name}", obj)
    return [found[k] for k in sorted(found)]


def _build(cls: type[nn.Module]) -> Callable[[], nn.Module]:
    return lambda: cls(**arguments(cls, TYPICAL, FACTORIES, {}, "census/families/torch_geometric.py TYPICAL"))


def _candidates() -> list[Inputs]:
    def make(*parts: str) -> Inputs:
        def inputs() -> tuple[Any, ...]:
            g = torch.Generator().manual_seed(9)
            values = {
                "x": lambda: torch.randn(N, C, generator=g),
                "edge_index": lambda: torch.randint(0, N, (2, E), generator=g),
                "edge_attr": lambda: torch.randn(E, C, generator=g),
                "edge_weight": lambda: torch.rand(E, generator=g),
                "batch": lambda: torch.tensor([0, 0, 0, 1, 1, 1]),
                "pos": lambda: torch.randn(N, 3, generator=g),
                "dense_x": lambda: torch.randn(2, N, C, generator=g),
                "adj": lambda: (torch.rand(2, N, N, generator=g) > 0.5).float(),
                "head": lambda: torch.randint(0, N, (4,), generator=g),
                "rel": lambda: torch.randint(0, 2, (4,), generator=g),
                "tail": lambda: torch.randint(0, N, (4,), generator=g),
                "edge_type": lambda: torch.randint(0, 2, (E,), generator=g),
                "node_type": lambda: torch.randint(0, 2, (N,), generator=g),
                "t": lambda: torch.rand(N, generator=g),
            }
            return tuple(values[p]() for p in parts)
        return inputs

    shapes = [("x", "edge_index"), ("x", "edge_index", "edge_attr"), ("x", "edge_index", "edge_weight"),
              ("x", "edge_index", "edge_type"), ("x", "pos", "edge_index"), ("x",), ("x", "batch"),
              ("x", "edge_index", "batch"), ("dense_x", "adj"), ("head", "rel", "tail"), ("t",),
              ("x", "node_type", "edge_index", "edge_type")]
    return [make(*s) for s in shapes]


def _job(model: nn.Module) -> Job:
    return first_accepted(model, _candidates())


def targets(sample: Sample) -> list[Target]:
    classes = sample.pick(_classes(), lambda c: c.__name__, quick_count=4)
    return [Target(cls.__name__, _build(cls), _job, submodules=lambda _m: {"model": ""}) for cls in classes]
