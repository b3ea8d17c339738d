"""Small importable models and candidate implementations for the tools tests (profile, verify,
diff, pytest plugin). Captures record classes by import path, so they live in a module, not a test."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

import modulelens


class MLP(torch.nn.Module):
    """Returns a dict so that failures can name a leaf (output['logits'])."""

    def __init__(self, d_in: int, hidden: int, d_out: int = 4) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = torch.relu(self.fc1(x))
        return {"hidden": hidden, "logits": self.fc2(hidden)}


class Holder(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        return self.inner(*args)


class Tagger(torch.nn.Module):
    """Integer ids + float features: exercises synthetic integer inputs."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.proj(self.emb(ids).mean(1) + features)


def capture(module_factory: Any, inputs: list[tuple[Any, ...]], repo: Path, name: str) -> str:
    """Build ``module_factory()`` with constructor tracking, capture every call on ``inputs``; return the ref."""
    tracking = modulelens.track_init()
    try:
        model = Holder(module_factory())
    finally:
        tracking.stop()
    with modulelens.capture(model, targets=["inner"], repo=repo, name=name, record=modulelens.Recording(max_calls=len(inputs))) as cap:
        for args in inputs:
            model(*args)
    return cap.saved[0].ref


# ------------------------------------------------------------------------------------- candidates


class FusedMLP(torch.nn.Module):
    """A correct rewrite: same parameters, different code (addmm, clamp_min, F.linear)."""

    def __init__(self, d_in: int, hidden: int, d_out: int = 4) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = torch.addmm(self.fc1.bias, x, self.fc1.weight.t()).clamp_min(0)
        return {"hidden": hidden, "logits": F.linear(hidden, self.fc2.weight, self.fc2.bias)}


class PackedMLP(torch.nn.Module):
    """A rewrite with a different parameter layout, built from the original by ``from_original``."""

    def __init__(self, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> None:
        super().__init__()
        self.first = torch.nn.Parameter(torch.cat([w1, b1[:, None]], 1).clone())
        self.second = torch.nn.Parameter(torch.cat([w2, b2[:, None]], 1).clone())

    @classmethod
    def from_original(cls, mlp: MLP) -> PackedMLP:
        return cls(mlp.fc1.weight.detach(), mlp.fc1.bias.detach(), mlp.fc2.weight.detach(), mlp.fc2.bias.detach())

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = torch.relu(F.linear(x, self.first[:, :-1], self.first[:, -1]))
        return {"hidden": hidden, "logits": F.linear(hidden, self.second[:, :-1], self.second[:, -1])}


class SubtlyWrongMLP(FusedMLP):
    """Right hidden layer, logits off by a relative 1e-3: a plausible numerical bug."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        out = super().forward(x)
        return {"hidden": out["hidden"], "logits": out["logits"] * (1 + 1e-3)}


class MutatingMLP(FusedMLP):
    """Right outputs, but scales its input in place afterwards."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        out = super().forward(x)
        x.mul_(0.5)
        return out


class RenamedMLP(torch.nn.Module):
    """Right maths, different state-dict keys (``first``/``second`` instead of ``fc1``/``fc2``)."""

    def __init__(self, d_in: int, hidden: int, d_out: int = 4) -> None:
        super().__init__()
        self.first = torch.nn.Linear(d_in, hidden)
        self.second = torch.nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = torch.relu(self.first(x))
        return {"hidden": hidden, "logits": self.second(hidden)}


class Normed(torch.nn.Module):
    """Linear + BatchNorm with keyword inputs and a nested output: several recorded states when trained."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)
        self.bn = torch.nn.BatchNorm1d(dim)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        y = self.bn(self.lin(x)) * scale
        return y, {"mean": y.mean()}


class FunctionalNormed(Normed):
    """The same maths through torch.nn.functional, running statistics and their counter included."""

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        bn = self.bn
        if self.training and bn.num_batches_tracked is not None:
            bn.num_batches_tracked.add_(1)
        y = F.batch_norm(F.linear(x, self.lin.weight, self.lin.bias), bn.running_mean, bn.running_var, bn.weight,
                         bn.bias, self.training, bn.momentum, bn.eps) * scale
        return y, {"mean": y.mean()}


class NormedWithoutStatistics(Normed):
    """Right outputs in training mode (the batch's statistics), but the running statistics are
    never updated: outputs alone cannot tell."""

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        bn = self.bn
        if self.training and bn.num_batches_tracked is not None:
            bn.num_batches_tracked.add_(1)
        h = F.linear(x, self.lin.weight, self.lin.bias)
        mean, var = (h.mean(0), h.var(0, unbiased=False)) if self.training else (bn.running_mean, bn.running_var)
        y = (h - mean) / torch.sqrt(var + bn.eps) * bn.weight + bn.bias
        return y * scale, {"mean": (y * scale).mean()}


class NormedUpdatingInEval(FunctionalNormed):
    """Right outputs, but updates the running statistics in eval mode too (``training=True``
    statistics written, eval outputs computed from the old ones)."""

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        bn = self.bn
        y = F.batch_norm(F.linear(x, self.lin.weight, self.lin.bias), bn.running_mean.clone(), bn.running_var.clone(),
                         bn.weight, bn.bias, False, bn.momentum, bn.eps) * scale
        if not self.training:
            F.batch_norm(F.linear(x, self.lin.weight, self.lin.bias).detach(), bn.running_mean, bn.running_var,
                         training=True, momentum=bn.momentum)
        return y, {"mean": y.mean()}


class EmaCodebook(torch.nn.Module):
    """Keeps an exponential moving average of its inputs, written through ``.data`` as many EMA
    codebooks are (the version counter does not move)."""

    def __init__(self, dim: int, decay: float = 0.9) -> None:
        super().__init__()
        self.decay = decay
        self.proj = torch.nn.Linear(dim, dim)
        self.register_buffer("average", torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.proj(x) - self.average
        if self.training:
            self.average.data.mul_(self.decay).add_(x.detach().mean(0), alpha=1 - self.decay)
        return out


class EmaCodebookFrozen(EmaCodebook):
    """The EMA codebook's output, its average never updated."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) - self.average


def capture_training(repo: Path, name: str, steps: int = 3) -> str:
    """Capture ``steps`` training calls of a :class:`Normed` with an optimizer step between them."""
    tracking = modulelens.track_init()
    try:
        model = Holder(Normed(6))
    finally:
        tracking.stop()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with modulelens.capture(model, targets=["inner"], repo=repo, name=name, record=modulelens.Recording(max_calls=steps)) as cap:
        for _ in range(steps):
            y, _aux = model.inner(torch.randn(10, 6), scale=2.0)
            y.square().sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    return cap.saved[0].ref


# ------------------------------------------------------------------------------------- low precision


class Block(torch.nn.Module):
    """LayerNorm, a GELU MLP and the residual; captured in bfloat16 or float16, it rounds after every op."""

    def __init__(self, features: int = 64, hidden: int = 256) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(features)
        self.up = torch.nn.Linear(features, hidden)
        self.down = torch.nn.Linear(hidden, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


def capture_low_precision(repo: Path, dtype: torch.dtype, name: str) -> str:
    """Capture a Block run in ``dtype`` over two calls of 8 x 64 inputs; return the ref."""
    torch.manual_seed(0)
    return capture(lambda: Block().to(dtype), [((torch.randn(8, 64) * 4).to(dtype),) for _ in range(2)], repo, name)


class FusedBlock(torch.nn.Module):
    """A correct rewrite of a low-precision Block: float32 inside, rounded to the input's dtype once."""

    def __init__(self, original: Block) -> None:
        super().__init__()
        self.norm, self.up, self.down = original.norm, original.up, original.down

    @classmethod
    def from_original(cls, original: Block) -> FusedBlock:
        return cls(copy.deepcopy(original))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float()
        h = F.layer_norm(wide, self.norm.normalized_shape, self.norm.weight.float(), self.norm.bias.float(), self.norm.eps)
        h = F.gelu(F.linear(h, self.up.weight.float(), self.up.bias.float()))
        return (wide + F.linear(h, self.down.weight.float(), self.down.bias.float())).to(x.dtype)


class OneUlpUpBlock(FusedBlock):
    """A wrong rewrite: the original's own result, moved one ULP up everywhere."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x + self.down(F.gelu(self.up(self.norm(x))))
        return torch.nextafter(out, torch.full_like(out, float("inf")))
