"""A small but real recommendation-style model (DLRM-like, with an attention block).

Sparse features -> embedding tables (pooled ``EmbeddingBag``s, fed a dict of jagged features as
``(values, offsets)``) -> feature attention -> pairwise dot interaction with the dense tower ->
top MLP -> click logit.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn


class EmbeddingTables(nn.Module):
    """One pooled embedding table per sparse feature; input is a dict of jagged features."""

    def __init__(self, cardinalities: dict[str, int], dim: int, mode: str = "sum") -> None:
        super().__init__()
        self.tables = nn.ModuleDict({name: nn.EmbeddingBag(rows, dim, mode=mode) for name, rows in cardinalities.items()})

    def forward(self, features: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {name: table(*features[name]) for name, table in self.tables.items()}


class FeatureAttention(nn.Module):
    """Self-attention across the feature embeddings of each example."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attended, _ = self.attn(x, x, x, need_weights=False)
        return self.norm(x + attended)


class DotInteraction(nn.Module):
    """Pairwise dot products between all feature vectors (upper triangle), DLRM-style."""

    rows: torch.Tensor  # buffers, declared for the type checker (register_buffer sets them)
    cols: torch.Tensor

    def __init__(self, num_features: int, self_interaction: bool = False) -> None:
        super().__init__()
        offset = 0 if self_interaction else 1
        rows, cols = torch.triu_indices(num_features, num_features, offset=offset)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        features = torch.cat([dense.unsqueeze(1), sparse], dim=1)
        products = torch.bmm(features, features.transpose(1, 2))
        return torch.cat([dense, products[:, self.rows, self.cols]], dim=1)


class MLP(nn.Module):
    def __init__(self, sizes: list[int], activation: type[nn.Module] = nn.ReLU, dropout: float = 0.0) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
            layers.append(nn.Linear(n_in, n_out))
            if i < len(sizes) - 2:
                layers.append(activation())
                if dropout:
                    layers.append(nn.Dropout(dropout))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class RecModel(nn.Module):
    def __init__(self, cardinalities: dict[str, int], dense_features: int = 13, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        n = len(cardinalities)
        self.bottom_mlp = MLP([dense_features, 64, dim])
        self.embeddings = EmbeddingTables(cardinalities, dim)
        self.attention = FeatureAttention(dim, heads)
        self.interaction = DotInteraction(n + 1)
        self.top_mlp = MLP([dim + (n + 1) * n // 2, 64, 32, 1], activation=nn.GELU, dropout=0.1)

    def forward(self, dense: torch.Tensor, sparse: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        d = self.bottom_mlp(dense)
        pooled = self.embeddings(sparse)
        s = self.attention(torch.stack(list(pooled.values()), dim=1))
        return self.top_mlp(self.interaction(d, s)).squeeze(-1)


CARDINALITIES = {"user_id": 1000, "item_id": 5000, "category": 50, "country": 30}


JaggedFeatures = dict[str, tuple[torch.Tensor, torch.Tensor]]


def synthetic_batch(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, JaggedFeatures, torch.Tensor]:
    """Dense features, jagged sparse features (1-4 ids per example) and click labels."""
    dense = torch.randn(batch, 13, generator=generator)
    sparse = {}
    for name, rows in CARDINALITIES.items():
        lengths = torch.randint(1, 5, (batch,), generator=generator)
        values = torch.randint(0, rows, (int(lengths.sum()),), generator=generator)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
        sparse[name] = (values, offsets)
    labels = (dense[:, 0] + 0.1 * torch.randn(batch, generator=generator) > 0).float()
    return dense, sparse, labels
