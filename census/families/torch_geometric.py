"""Every layer of ``torch_geometric.nn`` with a default constructor path.

The classes are the ``nn.Module`` subclasses listed in ``__all__`` of ``torch_geometric.nn``'s
sub-packages (``SUBPACKAGES``: convolutions, norms, aggregations, pooling, dense layers, models,
attention, KGE, encodings).

**Construction** (``_variants``): constructor arguments come from the signature, by name:
required arguments from ``TYPICAL`` (values) or ``FACTORIES`` (modules and callables, several
widths each: an ``nn`` that maps node features, pairs of them (``EdgeConv``), or edge features to
a weight matrix (``NNConv``)); then the same with the optional arguments that default to ``None``
and have a typical value (``edge_dim``: the edge-feature path of GAT-like layers; the sizes of
``MLP``). Each variant is tried in turn with the inputs below (without capture); the first that
runs is the target.

**Inputs** (``_candidates``): by the names ``forward`` requires (``INPUTS``: node features ``x``
of 6 nodes x 4 channels, a 10-edge ``edge_index``, edge features/weights/types, positions,
normals, atom numbers ``z``, a batch vector, dense batches with an adjacency, heterogeneous
``x_dict``/``edge_index_dict`` over two node types, KGE triples, ...), first with the edge
features/weights the layer takes, then without; the dense (batch, nodes, channels) ``x`` of
attention layers; then positional shapes as a last resort.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.construct import Inputs, first_accepted
from census.targets import CannotBuildError, Job, Sample, Target

SUBPACKAGES = ["conv", "norm", "aggr", "pool", "dense", "models", "attention", "kge", "encoding"]
N, C, E, OUT = 6, 4, 10, 8  # nodes, channels, edges, output channels
NODE_TYPES = ["a", "b"]
EDGE_TYPES = [("a", "to", "b"), ("b", "to", "a")]
TYPICAL: dict[str, Any] = {
    "in_channels": C, "out_channels": OUT, "hidden_channels": 8, "num_layers": 2, "channels": C, "heads": 2, "K": 2,
    "num_nodes": N, "num_relations": 2, "kernel_size": 2, "dim": 3, "num_edge_types": 2, "num_node_types": 2,
    "in_dim": C, "out_dim": OUT, "hidden_dim": 8, "num_heads": 2, "edge_dim": C, "ratio": 0.5, "k": 2, "num_bases": 2,
    "out_features": OUT, "in_features": C, "num_clusters": 2, "max_num_elements": 4, "num_features": C,
    "input_dim": C, "output_dim": OUT, "embedding_dim": C, "num_embeddings": N, "num_layers_per_block": 1,
    "num_stacks": 1, "num_blocks": 1, "hidden_dim_multiplier": 2, "num_classes": 3, "walk_length": 2,
    "context_size": 2, "edge_index": torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]]),
    "aggr": "add", "size": 2, "gamma": 1.0, "alpha": 0.1, "num_gaussians": 4, "cutoff": 5.0,
    "metadata": (NODE_TYPES, EDGE_TYPES), "num_timesteps": 1, "channel_list": [C, 8, OUT], "in_edge_channels": C,
    "num_types": 2, "num_rels": 2, "processing_steps": 2, "depth": 2, "groups": 2, "mode": "cat", "patch_size": 2,
    "space_dimensions": 3, "filter_size": 4, "dim_emb": C, "int_emb_size": C, "hidden_node_channels": C,
    "aggregators": ["mean", "max"], "aggrs": ["mean", "max"], "first_aggr": "mean", "num_correction_layers": 1,
    "num_bilinear": 2, "raw_msg_dim": C, "num_groups": 2, "scaler": "identity", "scalers": ["identity", "amplification"],
    "deg": torch.tensor([0, 2, 3, 1]), "q": 0.5, "propagate_dimensions": 2, "edge_type_emb_dim": 2,
    "edge_attr_emb_dim": 2, "num_spherical": 2, "num_radial": 2, "basis_emb_size": 4, "out_emb_channels": 4,
    "hidden_edge_channels": 4, "dim_pe_in": 4, "dim_in": C, "dim_emb_pe": 2, "memory_dim": 4, "time_dim": 2,
    "seq_len": 2, "correction_layers": 1, "correction_alpha": 0.5, "smoothing_layers": 1, "smoothing_alpha": 0.5,
    "types": NODE_TYPES, "metapath": [("a", "to", "b"), ("b", "to", "a")], "num_node_features": C,
    "num_edge_features": C, "num_tasks": 2, "num_hops": 2, "in_channels_dict": {t: C for t in NODE_TYPES},
    "num_smoothing_layers": 1, "dim_pe_out": 2,
    "edge_index_dict": {t: torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]]) for t in EDGE_TYPES},
}
# keyword arguments a class passes on through **kwargs to the layer it builds (PNA: to PNAConv)
PASSED_ON: dict[str, tuple[str, ...]] = {"PNA": ("aggregators", "scalers", "deg"), "MLPAggregation": ("num_layers",)}
NOT_TARGETS = {"KGEModel": "the base class of the KGE models (TransE, ComplEx, DistMult, RotatE are targets): its "
                           "forward is not implemented"}


def mean_summary(z: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """DeepGraphInfomax's summary: the mean node embedding (a named function, importable on reload)."""
    return z.mean(dim=0)


def permute_corruption(x: torch.Tensor, edge_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGraphInfomax's corruption: shuffled node features."""
    return x.flip(0), edge_index


def _mlp(width_in: int, width_out: int = OUT) -> nn.Module:
    return nn.Sequential(nn.Linear(width_in, 8), nn.ReLU(), nn.Linear(8, width_out))


def _gcn() -> nn.Module:
    from torch_geometric.nn import GCNConv

    return GCNConv(C, C)


def _hetero_convs() -> dict[tuple[str, str, str], nn.Module]:
    from torch_geometric.nn import SAGEConv

    return {edge_type: SAGEConv((C, C), OUT) for edge_type in EDGE_TYPES}


def _tgn_modules() -> dict[str, Any]:
    from torch_geometric.nn.models.tgn import IdentityMessage, LastAggregator

    return {"message_module": IdentityMessage(C, 4, 2), "aggregator_module": LastAggregator()}


# module-valued and callable arguments: alternatives, tried in order by the variants
FACTORIES: dict[str, list[Callable[[], Any]]] = {
    "nn": [lambda: _mlp(C), lambda: _mlp(2 * C), lambda: _mlp(C, C * OUT), lambda: _mlp(C, C)],
    "local_nn": [lambda: _mlp(C + 3), lambda: _mlp(C + 3, C)],
    "global_nn": [lambda: _mlp(OUT), lambda: _mlp(C, C)],
    "gate_nn": [lambda: nn.Linear(C, 1)],
    "mlp_h": [lambda: _mlp(C, 3)], "mlp_f": [lambda: _mlp(C + 3, C)], "mlp_g": [lambda: _mlp(C, C)],
    "conv": [_gcn], "encoder": [_gcn], "model": [lambda: nn.Linear(C, OUT)],
    "discriminator": [lambda: nn.Linear(C, 1)],
    "summary": [lambda: mean_summary], "corruption": [lambda: permute_corruption],
    "convs": [_hetero_convs],
    "message_module": [lambda: _tgn_modules()["message_module"]],
    "aggregator_module": [lambda: _tgn_modules()["aggregator_module"]],
}
# optional constructor arguments passed in the second variant (they default to None and change the layer)
OPTIONAL = ("edge_dim", "in_channels", "hidden_channels", "out_channels", "num_layers", "num_groups", "types",
            "channel_list", "conv")


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


def _variants(cls: type[nn.Module]) -> list[dict[str, Any]]:
    """Constructor keyword sets to try, in order (see the module docstring)."""
    parameters = {name: p for name, p in inspect.signature(cls.__init__).parameters.items()
                  if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    required = [name for name, p in parameters.items() if p.default is inspect.Parameter.empty]
    missing = [name for name in required if name not in TYPICAL and name not in FACTORIES]
    if missing:
        raise CannotBuildError(f"no typical value for required argument {missing[0]!r} "
                               "(census/families/torch_geometric.py TYPICAL, FACTORIES)")
    optional = [name for name in OPTIONAL if name in parameters and parameters[name].default is None]
    passed_on = [name for name in PASSED_ON.get(cls.__name__, ())]
    variants = []
    for extra in ([], optional) if optional else ([],):
        names = [*required, *extra, *passed_on]
        modules = [name for name in names if name in FACTORIES]
        for index in range(max((len(FACTORIES[name]) for name in modules), default=1)):
            kwargs = {name: _fit(TYPICAL[name], parameters.get(name)) for name in names if name not in FACTORIES}
            kwargs.update({name: FACTORIES[name][min(index, len(FACTORIES[name]) - 1)] for name in modules})
            variants.append(kwargs)
    return variants


def _fit(value: Any, parameter: inspect.Parameter | None) -> Any:
    """A typical int for an argument annotated as a list of ints (EquilibriumAggregation's layers) is a list."""
    annotation = str(parameter.annotation) if parameter is not None else ""
    if isinstance(value, int) and annotation.lower().startswith(("list", "typing.list")):
        return [value]
    return value


def _build(cls: type[nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        if cls.__name__ in NOT_TARGETS:
            raise CannotBuildError(f"not a target: {NOT_TARGETS[cls.__name__]}")
        errors, built = [], None
        for variant in _variants(cls):
            kwargs = {name: (value() if name in FACTORIES else value) for name, value in variant.items()}
            try:
                model = cls(**kwargs)
            except Exception as error:
                errors.append(f"{sorted(variant)}: {type(error).__name__}: {str(error)[:200]}")
                continue
            built = built or model
            try:
                first_accepted(model.eval(), _candidates(model))
            except Exception:
                continue
            return model
        if built is not None:  # constructs, but no input runs it: the job says why (could not build inputs)
            return built
        raise CannotBuildError("no constructor variant constructs: " + " | ".join(errors[:2]))
    return build


def _index(g: torch.Generator, high: int, size: int) -> torch.Tensor:
    return torch.randint(0, high, (size,), generator=g)


def _edge_index(g: torch.Generator) -> torch.Tensor:
    return torch.stack([_index(g, N, E), _index(g, N, E)])


# forward arguments by name
INPUTS: dict[str, Callable[[torch.Generator], Any]] = {
    "x": lambda g: torch.randn(N, C, generator=g),
    "x_0": lambda g: torch.randn(N, C, generator=g),
    "z": lambda g: _index(g, 9, N) + 1,
    "edge_index": _edge_index,
    "pos_edge_index": _edge_index,
    "neg_edge_index": _edge_index,
    "hyperedge_index": lambda g: torch.stack([_index(g, N, E), _index(g, 3, E)]),
    "edge_attr": lambda g: torch.randn(E, C, generator=g),
    "edge_weight": lambda g: torch.rand(E, generator=g),
    "edge_type": lambda g: _index(g, 2, E),
    "node_type": lambda g: _index(g, 2, N),
    "type_vec": lambda g: _index(g, 2, N),
    "batch": lambda g: torch.tensor([0, 0, 0, 1, 1, 1]),
    "index": lambda g: torch.tensor([0, 0, 0, 1, 1, 1]),
    "pos": lambda g: torch.randn(N, 3, generator=g),
    "normal": lambda g: torch.nn.functional.normalize(torch.randn(N, 3, generator=g), dim=-1),
    "adj": lambda g: (torch.rand(2, N, N, generator=g) > 0.5).float(),
    "head_index": lambda g: _index(g, N, 4),
    "rel_type": lambda g: _index(g, 2, 4),
    "tail_index": lambda g: _index(g, N, 4),
    "t": lambda g: torch.rand(N, generator=g),
    "msg": lambda g: torch.randn(N, C, generator=g),
    "xs": lambda g: [torch.randn(N, C, generator=g) for _ in range(2)],
    "x_dict": lambda g: {t: torch.randn(N, C, generator=g) for t in NODE_TYPES},
    "xs_dict": lambda g: {t: [torch.randn(N, C, generator=g) for _ in range(2)] for t in NODE_TYPES},
    "edge_index_dict": lambda g: {t: _edge_index(g) for t in EDGE_TYPES},
    "y": lambda g: _index(g, 3, N),
    "y_soft": lambda g: torch.softmax(torch.randn(N, 3, generator=g), -1),
    "mask": lambda g: torch.tensor([True, False, True, False, True, False]),
    "pos_enc": lambda g: torch.randn(N, 4, generator=g),
    "n_id": lambda g: torch.arange(N),
}
OPTIONAL_INPUTS = ("edge_attr", "edge_weight", "edge_type", "batch")


def _forward_parameters(model: nn.Module) -> tuple[list[str], list[str]]:
    parameters = {name: p for name, p in inspect.signature(model.forward).parameters.items()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    required = [name for name, p in parameters.items() if p.default is inspect.Parameter.empty]
    return required, [name for name in parameters if name not in required]


# other node-feature and edge-feature shapes, tried after the plain ones
X_SHAPES: dict[str, Callable[[torch.Generator], torch.Tensor]] = {
    "dense": lambda g: torch.randn(2, N, C, generator=g),  # dense layers, graph transformers: (batch, nodes, channels)
    "per layer": lambda g: torch.randn(N, 2, C, generator=g),  # DNAConv: every earlier layer's features
    "labels": lambda g: _index(g, 3, N),  # WLConv: node colours
    "output width": lambda g: torch.randn(N, OUT, generator=g),  # MaskLabel adds label embeddings of the output width
}


def _by_name(names: list[str], x: str = "", edge_width: int = C) -> Inputs:
    def inputs() -> dict[str, Any]:
        g = torch.Generator().manual_seed(9)
        values = {name: INPUTS[name](g) for name in names}
        if x and "x" in values:
            values["x"] = X_SHAPES[x](g)
        if "edge_attr" in values and edge_width != C:  # GMMConv, SplineConv: pseudo-coordinates of `dim` columns
            values["edge_attr"] = torch.rand(E, edge_width, generator=g)
        return values
    return inputs


def _positional(*parts: str) -> Inputs:
    def inputs() -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(9)
        return tuple(torch.randn(2, N, C, generator=g) if p == "dense_x" else INPUTS[p](g) for p in parts)
    return inputs


def _candidates(model: nn.Module) -> list[Inputs]:
    required, optional = _forward_parameters(model)
    candidates: list[Inputs] = []
    if all(name in INPUTS for name in required):
        extra = [name for name in OPTIONAL_INPUTS if name in optional]
        x = "dense" if "adj" in required else ""
        for names in ([*required, *extra], required) if extra else (required,):
            candidates.append(_by_name(names, x))
        if "edge_attr" in extra:
            candidates.append(_by_name([*required, *extra], x, edge_width=int(TYPICAL["dim"])))
        if "x" in required and not x:
            candidates += [_by_name(required, shape) for shape in X_SHAPES]
    shapes = [("x", "edge_index"), ("x", "edge_index", "edge_attr"), ("x", "edge_index", "edge_weight"),
              ("x", "edge_index", "edge_type"), ("x", "pos", "edge_index"), ("x",), ("x", "batch"),
              ("x", "edge_index", "batch"), ("dense_x", "adj"), ("head_index", "rel_type", "tail_index"), ("t",),
              ("x", "node_type", "edge_index", "edge_type")]
    return candidates + [_positional(*s) for s in shapes]


def _job(model: nn.Module) -> Job:
    return first_accepted(model, _candidates(model))


def targets(sample: Sample) -> list[Target]:
    classes = sample.pick(_classes(), lambda c: c.__name__, quick_count=4)
    return [Target(cls.__name__, _build(cls), _job, submodules=lambda _m: {"model": ""}) for cls in classes]
