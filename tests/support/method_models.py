"""Modules run through methods other than ``module(...)`` (issue 34), importable by fresh processes."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class TinyVAE(nn.Module):
    """An autoencoder used as VAEs are: ``encode`` and ``decode`` called directly, ``forward`` both."""

    def __init__(self, features: int = 6, latent: int = 2) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(features, 8), nn.SiLU(), nn.Linear(8, 2 * latent))
        self.decoder = nn.Sequential(nn.Linear(latent, 8), nn.SiLU(), nn.Linear(8, features))

    def encode(self, x: torch.Tensor, *, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        mean, logvar = self.encoder(x).chunk(2, dim=-1)
        return mean, logvar * temperature

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean, logvar = self.encode(x)
        return self.decode(mean + torch.randn_like(mean) * (0.5 * logvar).exp())


class Pipeline(nn.Module):
    """A model holding the VAE as a submodule (targets name it ``vae:encode``)."""

    def __init__(self) -> None:
        super().__init__()
        self.vae = TinyVAE()
        self.head = nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.vae(x))


class OwnCall(nn.Module):
    """A class whose own ``__call__`` never reaches torch's ``Module.__call__`` (as gpytorch's)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def __call__(self, x: torch.Tensor) -> Any:
        return {"out": self.forward(x)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class FeatureWriter(nn.Module):
    """Writes its output into the features it is given, as sentence-transformers' modules do."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 4)

    def forward(self, features: Any) -> Any:
        features["token_embeddings"] = self.embed(features["input_ids"])
        return features


class NumpyPolicy(nn.Module):
    """A policy used as stable-baselines3's are: ``predict`` takes a numpy observation and returns
    numpy actions (and the count, a numpy scalar); its constructor takes a numpy array (action
    bounds); it writes the observations it normalised back into the array it was given."""

    def __init__(self, bounds: Any, features: int = 3) -> None:
        super().__init__()
        import numpy as np

        self.net = nn.Sequential(nn.Linear(features, 8), nn.Tanh(), nn.Linear(8, len(bounds)))
        self.bounds = np.asarray(bounds, dtype=np.float32)

    def predict(self, observation: Any, deterministic: bool = True) -> tuple[Any, Any]:
        import numpy as np

        with torch.no_grad():
            actions = self.net(torch.as_tensor(observation)).numpy() * self.bounds
        np.clip(observation, -1.0, 1.0, out=observation)  # normalised in place, as a VecNormalize would
        return actions, np.int64(len(actions))
