"""Small modules captured by the kernel export/verify tests (a real module, so its source can be inlined)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

SQRT_HALF = 1.0 / math.sqrt(2.0)


def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU, written out."""
    return 0.5 * x * (1.0 + torch.erf(x * SQRT_HALF))


class ScaledGelu(nn.Module):
    """Elementwise: gelu(x) * scale + shift (a learned per-feature scale and shift)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(features))
        self.shift = nn.Parameter(torch.zeros(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_erf(x) * self.scale + self.shift


class LinearRelu(nn.Module):
    """relu(x @ W.T + b), optionally scaled by a keyword-only factor."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor, *, alpha: float = 1.0) -> torch.Tensor:
        return F.relu(self.fc(x)) * alpha


class Gated(nn.Module):
    """Constructor arguments that are not plain values: a module, a tensor and a function."""

    def __init__(self, inner: nn.Module, gate: torch.Tensor, act=F.silu, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("gate", gate.clone())
        self.act = act
        self.eps = eps

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = self.act(self.inner(x)) * self.gate + self.eps
        return y if mask is None else y * mask


class Wrapper(nn.Module):
    """A parent model: the tests capture its children."""

    def __init__(self) -> None:
        super().__init__()
        self.act = ScaledGelu(16)
        self.mlp = LinearRelu(16, 8)
        self.bag = nn.EmbeddingBag(20, 4, mode="sum")

    def forward(self, x: torch.Tensor, idx: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.act(x)
        return self.mlp(h, alpha=2.0), self.bag(idx, offsets)


def capture_all(repo: str, name: str = "km") -> None:
    """Capture act / mlp / bag (and the whole Wrapper) over two eval-mode calls into ``repo``."""
    import modulelens

    torch.manual_seed(0)
    with modulelens.track_init():
        model = Wrapper().eval()
    with torch.no_grad():
        model.act.scale.uniform_(0.5, 1.5)
        model.act.shift.uniform_(-0.1, 0.1)
    generator = torch.Generator().manual_seed(1)
    with modulelens.capture(model, targets=["act", "mlp", "bag", "Wrapper"], repo=repo, name=name,
                            record=modulelens.Recording(max_calls=2)), \
            torch.no_grad():
        for _ in range(2):
            model(torch.randn(3, 16, generator=generator), torch.randint(0, 20, (6,), generator=generator),
                  torch.tensor([0, 2, 5]))


class DropMLP(nn.Module):
    """Linear -> GELU -> Dropout: random in training mode, deterministic in eval mode."""

    def __init__(self, features: int, p: float = 0.25) -> None:
        super().__init__()
        self.fc = nn.Linear(features, features)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(F.gelu(self.fc(x)))


def capture_dropout(repo: str, *, training: bool, name: str) -> None:
    """Capture DropMLP over two calls recorded in training (or eval) mode into ``repo``."""
    import modulelens

    torch.manual_seed(0)
    with modulelens.track_init():
        model = DropMLP(8).train(training)
    with modulelens.capture(model, targets=["DropMLP"], repo=repo, name=name, record=modulelens.Recording(max_calls=2)), torch.no_grad():
        for _ in range(2):
            model(torch.randn(4, 8))


class AlwaysDropMLP(DropMLP):
    """A wrong rewrite of DropMLP: applies dropout in eval mode too."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(F.gelu(self.fc(x)), self.drop.p, training=True)


class SwiGLU(nn.Module):
    """silu(x @ W1.T) * (x @ W3.T): the gated MLP of LLaMA-style blocks (before the down projection)."""

    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(features, hidden, bias=False)
        self.w3 = nn.Linear(features, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.w1(x)) * self.w3(x)


def capture_bfloat16(repo: str, name: str = "kb16") -> None:
    """Capture SwiGLU(64, 128) run in bfloat16 over two calls of 8 x 64 inputs into ``repo``
    (``kb16``): the reference rounds to bfloat16 after every op."""
    import modulelens

    torch.manual_seed(0)
    with modulelens.track_init():
        model = SwiGLU(64, 128)
    model = model.to(torch.bfloat16).eval()
    generator = torch.Generator().manual_seed(1)
    with modulelens.capture(model, targets=["SwiGLU"], repo=repo, name=name,
                            record=modulelens.Recording(max_calls=2)), torch.no_grad():
        for _ in range(2):
            model((torch.randn(8, 64, generator=generator) * 4).to(torch.bfloat16))
