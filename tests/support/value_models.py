"""Values and modules that captures did not keep (issue 22, defect 3, and failures the census found),
each built and run as its library's users do, at the library's defaults:

* sparse tensors (COO coalesced or not, CSR, CSC, BSR, BSC) into ``torch.sparse`` ops, and out;
* nested tensors (jagged and strided) through ``nn.Linear`` and attention;
* ``torch.func.grad``, ``jacrev`` over ``functional_call`` and ``vmap`` around a model;
* torch_geometric graphs: a ``Batch.from_data_list`` mini-batch into GCN/SAGE layers, a
  ``HeteroData`` into ``HeteroConv``;
* diffusers: the conditional UNet, the VAE (its posterior sampled with a generator, its ``encode``
  returning a ``DiagonalGaussianDistribution``), the DiT and SD3 transformers (SD3's attention
  takes a processor object);
* every ``torch.nn`` lazy module, captured before and after its first call;
* ``nn.NLLLoss2d`` (a class marked ``@deprecated``);
* peft prompt and prefix tuning on a tiny Llama.

``python value_models.py REPO SCENARIO...`` captures the scenarios into REPO and prints
``{"refs": {label: ref}, "warnings": {scenario: [capture warnings]}}`` (a fresh process).
"""

from __future__ import annotations

import fnmatch
import json
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# ------------------------------------------------------------------------------------- sparse


class SparseMix(nn.Module):
    """A graph layer written with torch.sparse: the adjacency (any sparse layout) times features,
    and the adjacency scaled and returned (a sparse output)."""

    def __init__(self, features: int = 3, out: int = 4) -> None:
        super().__init__()
        self.lin = nn.Linear(features, out)

    def forward(self, adjacency: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.lin(x)
        if adjacency.layout == torch.sparse_coo:
            mixed = torch.sparse.mm(adjacency, h)
        elif adjacency.layout == torch.sparse_bsc:  # no CPU kernel multiplies a BSC matrix
            mixed = adjacency.to_dense() @ h
        else:
            mixed = adjacency @ h
        return torch.relu(mixed), adjacency * 2.0


def _adjacency(layout: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    dense = torch.randn(6, 6, generator=g) * (torch.rand(6, 6, generator=g) > 0.6)
    if layout == "coo_uncoalesced":
        return torch.sparse_coo_tensor(torch.tensor([[0, 2, 0, 5], [1, 3, 1, 0]]), torch.tensor([1.0, 2.0, 3.0, 4.0]),
                                       (6, 6))
    if layout in ("bsr", "bsc"):
        return getattr(dense, f"to_sparse_{layout}")((2, 2))
    return dense.to_sparse() if layout == "coo" else getattr(dense, f"to_sparse_{layout}")()


SPARSE = ["coo", "coo_uncoalesced", "csr", "csc", "bsr", "bsc"]


class SparseModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mix = SparseMix()

    def forward(self, adjacency: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.mix(adjacency, x)[0].sum(-1)


def _drive_sparse(layout: str) -> Callable[[nn.Module], None]:
    def drive(model: nn.Module) -> None:
        for seed in (2, 3):
            model(_adjacency(layout), torch.randn(6, 3, generator=torch.Generator().manual_seed(seed)))
    return drive


# ------------------------------------------------------------------------------------- nested


class NestedBlock(nn.Module):
    """A gated per-token block over sequences of different lengths, as a nested tensor (CPU has no
    attention kernel for nested tensors)."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.norm(tokens) if tokens.layout == torch.jagged else tokens  # strided ones have no layer_norm
        return self.out(torch.relu(self.q(x)) * nn.functional.silu(self.k(x)) + self.v(x))


class NestedModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = NestedBlock()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.block(tokens)


def _drive_nested(layout: torch.layout) -> Callable[[nn.Module], None]:
    def drive(model: nn.Module) -> None:
        g = torch.Generator().manual_seed(4)
        for lengths in ((3, 5, 2), (4, 1)):
            model(torch.nested.nested_tensor([torch.randn(n, 8, generator=g) for n in lengths], layout=layout))
    return drive


# ------------------------------------------------------------------------------------- torch.func


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))


def _drive_grad(model: nn.Module) -> None:
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(5))
    torch.func.grad(lambda inputs: model(inputs).sum())(x)


def _drive_jacrev(model: nn.Module) -> None:
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(6))
    params = dict(model.named_parameters())
    torch.func.jacrev(lambda p: torch.func.functional_call(model, p, (x,)).sum())(params)


def _drive_vmap(model: nn.Module) -> None:
    torch.func.vmap(model)(torch.randn(5, 3, generator=torch.Generator().manual_seed(7)))


# ------------------------------------------------------------------------------------- torch_geometric


class GraphNet(nn.Module):
    """A graph classifier as torch_geometric's examples write it: a mini-batch in, a score per graph out."""

    def __init__(self, features: int = 4, hidden: int = 8, classes: int = 3) -> None:
        super().__init__()
        from torch_geometric.nn import GCNConv, SAGEConv

        self.conv1 = GCNConv(features, hidden)
        self.conv2 = SAGEConv(hidden, hidden)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(hidden, classes)

    def forward(self, data: Any) -> torch.Tensor:
        from torch_geometric.nn import global_mean_pool

        x = self.drop(self.conv1(data.x, data.edge_index).relu())
        x = self.conv2(x, data.edge_index).relu()
        return self.head(global_mean_pool(x, data.batch, size=data.num_graphs))


class HeteroNet(nn.Module):
    """A heterogeneous graph model with lazily sized layers (``-1``), fed a ``HeteroData``."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        from torch_geometric.nn import HeteroConv, SAGEConv

        self.conv = HeteroConv({("author", "writes", "paper"): SAGEConv((-1, -1), hidden),
                                ("paper", "rev_writes", "author"): SAGEConv((-1, -1), hidden)}, aggr="sum")
        self.head = nn.Linear(hidden, 2)

    def forward(self, data: Any) -> tuple[torch.Tensor, int]:
        out = self.conv(data.x_dict, data.edge_index_dict)
        return self.head(out["paper"]), data.num_nodes


def graphs(count: int, seed: int) -> list[Any]:
    from torch_geometric.data import Data

    g = torch.Generator().manual_seed(seed)
    found = []
    for i in range(count):
        nodes = 3 + i
        found.append(Data(x=torch.randn(nodes, 4, generator=g), edge_index=torch.randint(0, nodes, (2, 2 * nodes), generator=g),
                          y=torch.tensor([i % 3]), name=f"graph{i}"))
    return found


def hetero_graph(seed: int) -> Any:
    from torch_geometric.data import HeteroData

    g = torch.Generator().manual_seed(seed)
    data = HeteroData()
    data["paper"].x = torch.randn(4, 3, generator=g)
    data["author"].x = torch.randn(3, 5, generator=g)
    data["author", "writes", "paper"].edge_index = torch.tensor([[0, 1, 2, 2], [1, 0, 3, 2]])
    data["paper", "rev_writes", "author"].edge_index = torch.tensor([[1, 0, 3, 2], [0, 1, 2, 2]])
    data.year = 2020
    return data


def _drive_graphs(model: nn.Module) -> None:
    from torch_geometric.data import Batch

    model(Batch.from_data_list(graphs(3, seed=8))).sum().backward()
    model(Batch.from_data_list(graphs(2, seed=9)))


def _hetero() -> nn.Module:
    model = HeteroNet()
    with torch.no_grad():
        model(hetero_graph(10))  # its lazily sized layers infer their input sizes
    return model


def _drive_hetero(model: nn.Module) -> None:
    from torch_geometric.data import Batch

    model(hetero_graph(11))
    model(Batch.from_data_list([hetero_graph(12), hetero_graph(13)]))


# ------------------------------------------------------------------------------------- diffusers

UNET_CONDITION = dict(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16),
                      down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                      up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16, attention_head_dim=2,
                      norm_num_groups=4)
VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
           up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), latent_channels=4, norm_num_groups=4,
           sample_size=16)
DIT = dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, num_layers=2, sample_size=8,
           patch_size=2, num_embeds_ada_norm=10)
SD3 = dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
           joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=8, out_channels=4,
           pos_embed_max_size=16)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _diffusers(name: str, config: dict[str, Any]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import diffusers

        return getattr(diffusers, name)(**config)
    return build


def _drive_unet(model: nn.Module) -> None:
    for seed in (1, 2):
        model(sample=torch.randn(2, 4, 8, 8, generator=_gen(seed)), timestep=torch.tensor([10, 20]),
              encoder_hidden_states=torch.randn(2, 3, 16, generator=_gen(seed + 10)))


def _drive_vae(model: nn.Module) -> None:
    generator = torch.Generator().manual_seed(3)  # the posterior is sampled: the generator is an input
    for seed in (1, 2):
        model(torch.randn(2, 3, 16, 16, generator=_gen(seed)), sample_posterior=True, generator=generator)


class VaeEncode(nn.Module):
    """The VAE's ``encode`` as a training step calls it: an ``AutoencoderKLOutput`` holding a
    ``DiagonalGaussianDistribution`` comes out."""

    def __init__(self) -> None:
        super().__init__()
        import diffusers

        self.vae = diffusers.AutoencoderKL(**VAE)

    def forward(self, images: torch.Tensor) -> Any:
        return self.vae.encode(images)


class LatentSample(nn.Module):
    """Samples latents from the distribution the encoder returned, with the job's generator."""

    def forward(self, posterior: Any, generator: torch.Generator) -> torch.Tensor:
        return posterior.sample(generator) * 0.18215


class VaeStep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encode = VaeEncode()
        self.sample = LatentSample()

    def forward(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self.sample(self.encode(images).latent_dist, generator)


def _drive_vae_step(model: nn.Module) -> None:
    generator = torch.Generator().manual_seed(4)
    for seed in (1, 2):
        model(torch.randn(2, 3, 16, 16, generator=_gen(seed)), generator)


def _drive_dit(model: nn.Module) -> None:
    for seed in (1, 2):
        model(hidden_states=torch.randn(2, 4, 8, 8, generator=_gen(seed)), timestep=torch.tensor([1, 2]),
              class_labels=torch.tensor([0, 1]))


def _drive_sd3(model: nn.Module) -> None:
    for seed in (1, 2):
        model(hidden_states=torch.randn(2, 4, 8, 8, generator=_gen(seed)),
              encoder_hidden_states=torch.randn(2, 3, 16, generator=_gen(seed + 10)),
              pooled_projections=torch.randn(2, 8, generator=_gen(seed + 20)), timestep=torch.tensor([1, 2]))


# ------------------------------------------------------------------------------------- lazy modules

F = 4
LAZY: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "LazyLinear": (lambda: nn.LazyLinear(6), (2, F)),
    "LazyConv1d": (lambda: nn.LazyConv1d(6, 2), (2, F, 6)),
    "LazyConv2d": (lambda: nn.LazyConv2d(6, 2, padding=1), (2, F, 6, 6)),
    "LazyConv3d": (lambda: nn.LazyConv3d(6, 2), (2, F, 4, 4, 4)),
    "LazyConvTranspose1d": (lambda: nn.LazyConvTranspose1d(6, 2), (2, F, 6)),
    "LazyConvTranspose2d": (lambda: nn.LazyConvTranspose2d(6, 2, stride=2), (2, F, 6, 6)),
    "LazyConvTranspose3d": (lambda: nn.LazyConvTranspose3d(6, 2), (2, F, 4, 4, 4)),
    "LazyBatchNorm1d": (lambda: nn.LazyBatchNorm1d(), (2, F)),
    "LazyBatchNorm2d": (lambda: nn.LazyBatchNorm2d(), (2, F, 6, 6)),
    "LazyBatchNorm3d": (lambda: nn.LazyBatchNorm3d(), (2, F, 4, 4, 4)),
    "LazyInstanceNorm1d": (lambda: nn.LazyInstanceNorm1d(), (2, F, 6)),
    "LazyInstanceNorm2d": (lambda: nn.LazyInstanceNorm2d(), (2, F, 6, 6)),
    "LazyInstanceNorm3d": (lambda: nn.LazyInstanceNorm3d(), (2, F, 4, 4, 4)),
}


def _drive_shape(shape: tuple[int, ...]) -> Callable[[nn.Module], None]:
    def drive(model: nn.Module) -> None:
        for seed in (1, 2):
            model(torch.rand(*shape, generator=_gen(seed)))
    return drive


def _lazy_sequence() -> nn.Module:
    return nn.Sequential(nn.LazyLinear(6), nn.ReLU(), nn.LazyLinear(3))


def _drive_nll(model: nn.Module) -> None:
    for seed in (1, 2):
        model(torch.randn(2, 3, 4, 4, generator=_gen(seed)).log_softmax(1),
              torch.randint(0, 3, (2, 4, 4), generator=_gen(seed)))


# ------------------------------------------------------------------------------------- peft

LLAMA = dict(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _peft(kind: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import peft
        import transformers

        config = getattr(peft, f"{kind}Config")(task_type="CAUSAL_LM", num_virtual_tokens=4)
        return peft.get_peft_model(transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)), config)
    return build


def _drive_causal_lm(model: nn.Module) -> None:
    for seed in (1, 2):
        ids = torch.randint(3, 99, (2, 6), generator=_gen(seed))
        model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)


# ------------------------------------------------------------------------------------- scenarios


@dataclass
class Scenario:
    name: str
    build: Callable[[], nn.Module]
    targets: dict[str, str]  # label -> target pattern ("" is the model)
    drive: Callable[[nn.Module], Any]
    modes: tuple[str, ...] = ("train", "eval")  # each mode is its own capture: label.train, label.eval
    before_capture: Callable[[nn.Module], Any] | None = None
    labels: list[str] = field(default_factory=list)


def _scenarios() -> list[Scenario]:
    found = [Scenario(f"sparse.{layout}", SparseModel, {f"sparse.{layout}": "mix"}, _drive_sparse(layout), ("train",))
             for layout in SPARSE]
    found += [Scenario(f"nested.{name}", NestedModel, {f"nested.{name}": "block"}, _drive_nested(layout), ("eval",))
              for name, layout in (("jagged", torch.jagged), ("strided", torch.strided))]
    found += [Scenario("func.grad", _mlp, {"func.grad": "0", "func.grad.tanh": "1"}, _drive_grad, ("train",)),
              Scenario("func.jacrev", _mlp, {"func.jacrev": "2"}, _drive_jacrev, ("train",)),
              Scenario("func.vmap", _mlp, {"func.vmap": "0"}, _drive_vmap, ("eval",))]
    found += [Scenario("pyg.batch", GraphNet, {"pyg.batch": "", "pyg.batch.conv1": "conv1"}, _drive_graphs),
              Scenario("pyg.hetero", _hetero, {"pyg.hetero": ""}, _drive_hetero)]
    found += [
        Scenario("diffusers.unet_condition", _diffusers("UNet2DConditionModel", UNET_CONDITION),
                 {"diffusers.unet_condition": "", "diffusers.unet_condition.attn":
                  "down_blocks.0.attentions.0.transformer_blocks.0.attn2"}, _drive_unet),
        Scenario("diffusers.vae", _diffusers("AutoencoderKL", VAE), {"diffusers.vae": ""}, _drive_vae),
        Scenario("diffusers.vae_step", VaeStep, {"diffusers.vae_encode": "encode", "diffusers.vae_sample": "sample"},
                 _drive_vae_step),
        Scenario("diffusers.dit", _diffusers("DiTTransformer2DModel", DIT), {"diffusers.dit": ""}, _drive_dit),
        Scenario("diffusers.sd3", _diffusers("SD3Transformer2DModel", SD3),
                 {"diffusers.sd3": "", "diffusers.sd3.attn": "transformer_blocks.0.attn"}, _drive_sd3),
    ]
    for name, (build, shape) in LAZY.items():
        found.append(Scenario(f"lazy.{name}.before", build, {f"lazy.{name}.before": ""}, _drive_shape(shape), ("train",)))
        found.append(Scenario(f"lazy.{name}.after", build, {f"lazy.{name}.after": ""}, _drive_shape(shape), ("eval",),
                              before_capture=_drive_shape(shape)))
    found += [Scenario("lazy.Sequential", _lazy_sequence, {"lazy.Sequential": "", "lazy.Sequential.0": "0"},
                       _drive_shape((2, F)), ("train",)),
              Scenario("nllloss2d", lambda: nn.NLLLoss2d(), {"nllloss2d": ""}, _drive_nll)]
    found += [Scenario(f"peft.{kind}", _peft(kind), {f"peft.{kind}": ""}, _drive_causal_lm)
              for kind in ("PromptTuning", "PrefixTuning")]
    return found


SCENARIOS = {s.name: s for s in _scenarios()}


def labels(names: list[str]) -> list[str]:
    """Every label the scenarios ``names`` (globs) capture, ``label.mode`` for each mode."""
    return [f"{label}.{mode}" for s in SCENARIOS.values() if any(fnmatch.fnmatchcase(s.name, n) for n in names)
            for label in s.targets for mode in s.modes]


def capture(repo: str, names: list[str]) -> dict[str, Any]:
    import modulelens

    refs: dict[str, str] = {}
    caught: dict[str, list[str]] = {}
    with modulelens.track_init():
        chosen = [s for s in SCENARIOS.values() if any(fnmatch.fnmatchcase(s.name, n) for n in names)]
        for scenario in chosen:
            for mode in scenario.modes:
                torch.manual_seed(0)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)  # NLLLoss2d's own deprecation
                    model = scenario.build()
                model.train(mode == "train")
                if scenario.before_capture is not None:
                    with torch.no_grad():
                        scenario.before_capture(model)
                name = f"values/{scenario.name}/{mode}"
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always", modulelens.CaptureWarning)
                    with modulelens.capture(model, targets=list(scenario.targets.values()), repo=repo, name=name,
                                            record=modulelens.Recording(max_calls=2)) as cap:
                        scenario.drive(model)
                caught[f"{scenario.name}.{mode}"] = [str(w.message) for w in seen
                                                     if issubclass(w.category, modulelens.CaptureWarning)]
                saved = {info.name.removeprefix(name).lstrip("/"): info.ref for info in cap.saved}
                for label, pattern in scenario.targets.items():
                    found = [ref for qualified, ref in saved.items() if qualified == pattern]
                    if found:
                        refs[f"{label}.{mode}"] = found[0]
    return {"refs": refs, "warnings": caught}


if __name__ == "__main__":
    import value_models  # the classes by their importable path, not __main__'s

    print(json.dumps(value_models.capture(sys.argv[1], sys.argv[2:])))
