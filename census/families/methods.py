"""Method entry points: modules their users run through methods other than ``module(...)``.

Each target is a library's own module (or a user module written the way that library's users write
them), built from a small config and run the way its users run it: a VAE through ``encode`` and
``decode`` (diffusers), a normalizing flow through ``log_prob`` and ``sample`` (normflows), an SDE
through ``f`` and ``g`` (torchsde's ``sdeint``), a Gaussian process through gpytorch's own
``__call__``, sentence-transformers and rotary-embedding-torch through direct ``.forward(...)``
calls, BART's encoder and ``generate`` (the encoder runs
before the model's first forward), a user class that overrides ``__call__``. Captured: the targets
``PATTERN:METHOD`` (tracing/methods.py) named in ``submodules``; a target's capture is saved as
``<name>.<method>`` and replayed through the same method. (timm's rope ``get_embed`` is tested in
tests/tracing/test_method_targets.py: replaying timm needs the torchvision stand-in on the path,
which the other libraries here must not see.)
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.targets import Job, Sample, Target


def _gen(seed: int = 11) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------- diffusers


def _vae() -> nn.Module:
    import diffusers

    return diffusers.AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                                   up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16),
                                   latent_channels=4, norm_num_groups=4, sample_size=16)


def _vae_job(model: nn.Module) -> Job:
    def run(vae: nn.Module) -> None:
        posterior = vae.encode(torch.randn(1, 3, 16, 16, generator=_gen())).latent_dist
        vae.decode(posterior.sample(generator=_gen(3)))
    return run


# ---------------------------------------------------------------------------------------------- normflows


def _flow() -> nn.Module:
    import normflows as nf

    flows: list[nn.Module] = []
    for _ in range(2):
        net = nf.nets.MLP([1, 8, 2], init_zeros=True)  # half the features in, a scale and a shift out
        flows += [nf.flows.AffineCouplingBlock(net), nf.flows.Permute(2, mode="swap")]
    return nf.NormalizingFlow(nf.distributions.DiagGaussian(2), flows)


def _flow_job(model: nn.Module) -> Job:
    def run(flow: nn.Module) -> None:
        flow.log_prob(torch.randn(5, 2, generator=_gen()))
        flow.sample(4)
    return run


# ---------------------------------------------------------------------------------------------- torchsde


class NeuralSDE(nn.Module):
    """A neural SDE written as torchsde's users write one: drift ``f`` and diffusion ``g`` as methods,
    called by ``torchsde.sdeint`` (never through ``module(...)``)."""

    noise_type = "diagonal"
    sde_type = "ito"

    def __init__(self, size: int = 3, hidden: int = 8) -> None:
        super().__init__()
        self.drift = nn.Sequential(nn.Linear(size, hidden), nn.Tanh(), nn.Linear(hidden, size))
        self.diffusion = nn.Linear(size, size)

    def f(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.drift(y) * torch.cos(t)

    def g(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.diffusion(y))


def _sde_job(model: nn.Module) -> Job:
    def run(sde: nn.Module) -> None:
        import torchsde

        y0 = torch.randn(2, 3, generator=_gen())
        torchsde.sdeint(sde, y0, torch.linspace(0, 0.2, 3), method="euler", dt=0.1)
    return run


# ---------------------------------------------------------------------------------------------- gpytorch


def _gp() -> nn.Module:
    import gpytorch

    class_ = _gp_class()
    x = torch.linspace(0, 1, 12)
    return class_(x, torch.sin(6 * x), gpytorch.likelihoods.GaussianLikelihood())


def _gp_class() -> type:
    return ExactGPModel


try:  # the class is defined at import, where gpytorch is installed (the family lists it only then)
    import gpytorch as _gpytorch

    class ExactGPModel(_gpytorch.models.ExactGP):
        """gpytorch's regression example: a constant mean and a scaled RBF kernel."""

        def __init__(self, train_x: torch.Tensor, train_y: torch.Tensor, likelihood: Any) -> None:
            super().__init__(train_x, train_y, likelihood)
            self.mean_module = _gpytorch.means.ConstantMean()
            self.covar_module = _gpytorch.kernels.ScaleKernel(_gpytorch.kernels.RBFKernel())

        def forward(self, x: torch.Tensor) -> Any:
            return _gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))
except ImportError:  # pragma: no cover - the census environment has gpytorch
    pass


def _gp_job(model: nn.Module) -> Job:
    def run(gp: nn.Module) -> None:
        if gp.training:  # training: the prior at the training inputs (what the marginal likelihood takes)
            gp(*gp.train_inputs)  # type: ignore[attr-defined]
        else:  # evaluation: the posterior at new inputs
            gp(torch.linspace(0, 1, 5))
    return run


# ---------------------------------------------------------------------------------------------- sentence-transformers

_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(59)]]


def _sentence_model_dir() -> str:
    """A tiny BERT and its tokenizer saved where the rebuilt ``Transformer`` module finds them again
    (its constructor loads from a folder: the replay process reads the same one)."""
    import transformers

    folder = os.path.join(tempfile.gettempdir(), f"modulelens-census-sbert-{os.getuid()}")
    if not os.path.exists(os.path.join(folder, "config.json")):
        os.makedirs(folder, exist_ok=True)
        torch.manual_seed(0)
        config = transformers.BertConfig(vocab_size=len(_VOCAB), hidden_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)
        transformers.BertModel(config).save_pretrained(folder)
        with open(os.path.join(folder, "vocab.txt"), "w") as handle:
            handle.write("\n".join(_VOCAB))
        transformers.BertTokenizerFast(vocab_file=os.path.join(folder, "vocab.txt")).save_pretrained(folder)
    return folder


def _sentence() -> nn.Module:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    word = Transformer(_sentence_model_dir())
    return SentenceTransformer(modules=[word, Pooling(word.get_embedding_dimension())], device="cpu")


def _sentence_job(model: nn.Module) -> Job:
    def run(st: nn.Module) -> None:
        sentences = ["w1 w2 w3", "w4 w5"]
        st.encode(sentences)  # type: ignore[operator]
        st.forward(st.tokenize(sentences))  # type: ignore[operator]
    return run


# ---------------------------------------------------------------------------------------------- rotary embeddings


def _rotary() -> nn.Module:
    from rotary_embedding_torch import RotaryEmbedding

    return RotaryEmbedding(dim=8)


def _rotary_job(model: nn.Module) -> Job:
    def run(rotary: nn.Module) -> None:
        rotary.rotate_queries_or_keys(torch.randn(1, 2, 6, 16, generator=_gen()))  # type: ignore[operator]
        rotary.forward(torch.arange(6, dtype=torch.float32))
    return run


# ---------------------------------------------------------------------------------------------- torchmetrics

def _metric() -> nn.Module:
    from torchmetrics.regression import MeanSquaredError

    return MeanSquaredError()


def _metric_job(model: nn.Module) -> Job:
    """As a training loop uses a metric: ``update`` per batch, ``compute`` (the running value) and a
    batch value from ``metric(preds, target)``. ``update`` and ``compute`` are bound to the instance
    in ``Metric.__init__``, and ``compute`` reads the running sums, which are not buffers."""
    def run(metric: nn.Module) -> None:
        for step in range(3):
            metric.update(torch.randn(8, generator=_gen(step)), torch.randn(8, generator=_gen(step + 10)))  # type: ignore[operator]
            metric.compute()  # type: ignore[operator]
            metric(torch.randn(4, generator=_gen(step + 20)), torch.randn(4, generator=_gen(step + 30)))
    return run


def _running_mean() -> nn.Module:
    from torchmetrics.aggregation import RunningMean

    return RunningMean(window=3)


def _running_mean_job(model: nn.Module) -> Job:
    """Each call's value is the mean over a window of the calls before it (states kept by add_state)."""
    def run(metric: nn.Module) -> None:
        for step in range(4):
            metric(torch.randn(5, generator=_gen(step)))
    return run


# ---------------------------------------------------------------------------------------------- transformers


def _bart() -> nn.Module:
    import transformers

    config = transformers.BartConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=32)
    return transformers.BartForConditionalGeneration(config)


def _bart_job(model: nn.Module) -> Job:
    def run(bart: nn.Module) -> None:
        ids = torch.randint(3, 64, (1, 6), generator=_gen())
        bart.generate(ids, max_new_tokens=3, do_sample=False)  # type: ignore[operator]
    return run


# ---------------------------------------------------------------------------------------------- user classes


class Standardised(nn.Module):
    """A user module whose own ``__call__`` normalises its input before ``forward`` (as some
    wrappers do); ``module(x)`` then reaches forward hooks with other inputs than the caller's."""

    def __init__(self, features: int = 4) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 2)

    def __call__(self, x: torch.Tensor) -> Any:
        return super().__call__((x - x.mean()) / (x.std() + 1e-5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class TwoHeads(nn.Module):
    """A module called through ``.forward(...)`` directly and through a second entry point."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Dropout(0.1))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _user_job(model: nn.Module) -> Job:
    def run(module: nn.Module) -> None:
        x = torch.randn(3, 4, generator=_gen())
        if isinstance(module, TwoHeads):
            module.forward(x)
            module.embed(x)
        else:
            module(x)
    return run


# ---------------------------------------------------------------------------------------------- the family

# name -> (build, job, {label: target}); every target is a method entry point but BART's encoder,
# a submodule that generate() calls before the model's own first forward
TARGETS: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], Job], dict[str, str]]] = {
    "diffusers.AutoencoderKL": (_vae, _vae_job, {"encode": ":encode", "decode": ":decode"}),
    "normflows.NormalizingFlow": (_flow, _flow_job, {"log_prob": ":log_prob", "sample": ":sample"}),
    "torchsde.NeuralSDE": (NeuralSDE, _sde_job, {"f": ":f", "g": ":g"}),
    "gpytorch.ExactGP": (_gp, _gp_job, {"call": ":__call__"}),
    "sentence_transformers.SentenceTransformer": (_sentence, _sentence_job, {"forward": ":forward"}),
    "rotary_embedding_torch.RotaryEmbedding": (_rotary, _rotary_job, {"rotate": ":rotate_queries_or_keys",
                                                                      "forward": ":forward"}),
    "transformers.BartForConditionalGeneration": (_bart, _bart_job, {"encoder": "model.encoder",
                                                                      "generate": ":generate"}),
    "torchmetrics.MeanSquaredError": (_metric, _metric_job, {"update": ":update", "compute": ":compute", "forward": ""}),
    "torchmetrics.RunningMean": (_running_mean, _running_mean_job, {"forward": ""}),
    "user.Standardised": (Standardised, _user_job, {"call": ":__call__"}),
    "user.TwoHeads": (TwoHeads, _user_job, {"forward": ":forward", "embed": ":embed"}),
}


def _target(name: str) -> Target:
    build, job, labels = TARGETS[name]
    return Target(name, build, job, submodules=lambda _model, labels=labels: dict(labels))


def targets(sample: Sample) -> list[Target]:
    return [_target(name) for name in sample.pick(list(TARGETS), str, quick_count=3)]
